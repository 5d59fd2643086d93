// ModelParams: the base buffers of the model's layout with their storage (allocated,
// frozen without gradients, or deferred), the weights' init from one seed and the copies
// between host fp32 and the model's dtype; what the ZeRO engine releases and restores is
// in model_storage.cpp.
#include "model/model_params.h"

#include "core/check.h"
#include "core/rng.h"
#include "ops/parallel.h"

#include <algorithm>
#include <cmath>

namespace dtrain::model {

ModelParams::ModelParams(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads)
    : cfg_(cfg), dev_(&dev), dtype_(dtype) {
  DT_ENFORCE(dtype == DType::F32 || dev.kind() == device::Kind::CUDA, UsageError,
             "a {} model on the {} device: the CPU computes in fp32 (bf16/fp16 there are fp32 values rounded by the "
             "optimizer)",
             dtype_name(dtype), dev.name());
  auto layouts = layout_build(cfg_);  // validates
  DT_CHECK(cfg_.n_layer >= 1);
  for (auto& l : layouts) {
    param_store_.emplace_back(*dev_, deferred ? 0 : l.size * dtype_size(dtype_));
    ParamBuffer pb;
    pb.size = l.size;
    pb.layout = std::move(l);
    pb.data = deferred ? nullptr : param_store_.back().get();
    pb.dtype = dtype_;
    pb.on_host = on_host();
    params_.push_back(std::move(pb));
  }
  if (!deferred && grads) {
    grads_allocate();
    return;
  }
  if (!deferred) {  // FrozenBase: no gradient array, until lora_enable adds the adapters'
    grad_store_.resize(params_.size());
    grads_released_ = true;
    param_released_.assign(params_.size(), 0);
    return;
  }
  // Released from the start: what storage_release leaves, without ever allocating.
  grad_store_.resize(params_.size());
  grads_released_ = true;
  param_released_.assign(params_.size(), 1);
}

ModelParams::~ModelParams() = default;

void ModelParams::grads_allocate() {
  grad_store_.clear();
  for (auto& pb : params_) {
    grad_store_.emplace_back(*dev_, pb.size * sizeof(float));
    pb.grad = grad_store_.back().as<float>();
  }
}

// ---------------------------------------------------------------------------
// Parameters

void ModelParams::init_weights(uint64_t seed) {
  // Parameters only: a FrozenBase model has no gradient arrays and needs none here.
  DT_ENFORCE(std::none_of(param_released_.begin(), param_released_.end(), [](char r) { return r != 0; }), UsageError,
             "Model::init_weights() needs every parameter array, but part of them is released to the ZeRO engine");
  std::vector<float> host;
  for (size_t i = 0; i < params_.size(); ++i) {
    host.resize(params_[i].size);
    init_buffer_values(i, seed, host.data());
    buffer_from_host(i, host.data());
  }
}

void ModelParams::init_buffer_values(size_t i, uint64_t seed, float* host) const {
  DT_ENFORCE_LT(i, params_.size(), UsageError, "Model::init_buffer_values: base buffer index out of range");
  const float std_resid = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  // Each tensor's stream is its index over the whole model (1-based), as before sharding.
  uint64_t index = 0;
  for (size_t k = 0; k < i; ++k) index += params_[k].layout.tensors.size();
  const ParamBuffer& pb = params_[i];
  std::fill(host, host + pb.size, 0.0f);
  // The normal draws come in chunks of kInitChunk values, each from its own stream: the
  // tensor's stream for its first chunk (so a tensor of at most kInitChunk values is what
  // one stream per tensor gives), then streams derived from it and the chunk's index. The
  // chunks of every tensor of the buffer fill in parallel (an 8B model's ~8e9 draws took
  // minutes on one thread), with the same values for any thread count.
  struct Chunk {
    float* d;
    size_t n;
    uint64_t stream;
    float sd;
  };
  std::vector<Chunk> chunks;
  for (const auto& t : pb.layout.tensors) {
    float* d = host + t.offset;
    const size_t n = t.numel();
    const uint64_t stream = splitmix64(seed ^ splitmix64(++index));
    if (t.decay) {
      const bool resid = t.name.ends_with("c_proj.weight") || t.name.ends_with("o_proj.weight") ||
                         t.name.ends_with("down_proj.weight");
      const float sd = resid ? std_resid : 0.02f;
      for (size_t at = 0, c = 0; at < n; at += kInitChunk, ++c)
        chunks.push_back({d + at, std::min(kInitChunk, n - at), c == 0 ? stream : splitmix64(stream + c), sd});
    } else {
      const float v = t.name.ends_with(".bias") ? 0.0f : 1.0f;
      for (size_t k = 0; k < n; ++k) d[k] = v;
    }
  }
  ops::parallel_for(
      chunks.size(), pb.size,
      [&](size_t begin, size_t end) {
        for (size_t c = begin; c < end; ++c) {
          Rng rng(chunks[c].stream);
          for (size_t k = 0; k < chunks[c].n; ++k) chunks[c].d[k] = rng.normal(0.0f, chunks[c].sd);
        }
      },
      64);
}

// Host fp32 <-> the model's dtype through a host staging copy (core's tensor_copy, round
// to nearest even); fp32 goes straight to and from the device.
void ModelParams::buffer_from_host(size_t i, const float* values) {
  ParamBuffer& pb = buffer_at(i);
  buffer_enforce_present(pb, true, false);
  if (dtype_ == DType::F32) {
    dev_->copy_h2d(pb.data, values, pb.size * sizeof(float));
    return;
  }
  const std::vector<int64_t> shape{static_cast<int64_t>(pb.size)};
  std::vector<uint16_t> staged(pb.size);
  tensor_copy(TensorView{staged.data(), dtype_, shape}, TensorView{const_cast<float*>(values), DType::F32, shape});
  dev_->copy_h2d(pb.data, staged.data(), staged.size() * sizeof(uint16_t));
}

std::vector<float> ModelParams::buffer_to_host(size_t i) const {
  const ParamBuffer& pb = buffer_at(i);
  buffer_enforce_present(pb, true, false);
  std::vector<float> out(pb.size);
  if (dtype_ == DType::F32) {
    dev_->copy_d2h(out.data(), pb.data, pb.size * sizeof(float));
    return out;
  }
  const std::vector<int64_t> shape{static_cast<int64_t>(pb.size)};
  std::vector<uint16_t> staged(pb.size);
  dev_->copy_d2h(staged.data(), pb.data, staged.size() * sizeof(uint16_t));
  tensor_copy(TensorView{out.data(), DType::F32, shape}, TensorView{staged.data(), dtype_, shape});
  return out;
}

void ModelParams::zero_grad() {
  for (auto& pb : trainable_params())
    if (pb.grad) dev_->zero(pb.grad, pb.size * sizeof(float));
}

size_t ModelParams::num_params() const {
  size_t n = 0;
  for (const auto& pb : params_) n += pb.size;
  return n;
}

size_t ModelParams::num_trainable_params() const {
  if (lora_params_.empty()) return num_params();
  size_t n = 0;
  for (const auto& pb : lora_params_) n += pb.size;
  return n;
}

TensorView ModelParams::tensor(const std::string& name) {
  host_enforce("tensor()");
  for (auto* list : {&params_, &lora_params_})
    for (auto& pb : *list)
      if (const TensorSpec* t = pb.layout.find(name)) {
        DT_ENFORCE(pb.data != nullptr || pb.size == 0, UsageError,
                   "tensor {} is in buffer {}, whose storage is released (ZeRO stage 3 shards it): materialize "
                   "the parameters (ZeroEngine::weights().materialize()) before reading them",
                   name, pb.layout.name);
        return TensorView{static_cast<float*>(pb.data) + t->offset, DType::F32, t->shape};
      }
  return TensorView{};
}

void ModelParams::host_enforce(const char* what) const {
  DT_ENFORCE(on_host(), UsageError,
             "Model::{} returns host fp32 memory, but this model lives on {}: copy it to a CPU model "
             "(ModelParams::weights_copy_from) first",
             what, dev_->name());
}

}  // namespace dtrain::model
