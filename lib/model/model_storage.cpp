// ModelParams: the storage the ZeRO engine releases and restores (stages 2-3 replace the model's
// parameter and gradient arrays with shards and working buffers; model_params.cpp has the rest).
#include "model/model_params.h"

#include "core/check.h"

#include <algorithm>

namespace dtrain::model {

ParamBuffer& ModelParams::buffer_at(size_t i) {
  return i < params_.size() ? params_[i] : lora_params_[i - params_.size()];
}

const ParamBuffer& ModelParams::buffer_at(size_t i) const {
  return i < params_.size() ? params_[i] : lora_params_[i - params_.size()];
}

device::DeviceBuffer& ModelParams::param_store_at(size_t i) {
  return i < params_.size() ? param_store_[i] : lora_store_[i - params_.size()];
}

void ModelParams::storage_release(bool grads, const std::vector<size_t>& param_buffers) {
  const size_t n = params_.size() + lora_params_.size();
  for (size_t i : param_buffers)
    DT_ENFORCE_LT(i, n, UsageError, "Model::storage_release: parameter buffer index out of range");
  param_released_.resize(n, 0);
  if (grads && !grads_released_) {
    for (auto& b : lora_on() ? lora_grad_store_ : grad_store_) b.reset();
    for (auto& pb : trainable_params()) pb.grad = nullptr;
    grads_released_ = true;
  }
  for (size_t i : param_buffers) {
    param_store_at(i).reset();
    buffer_at(i).data = nullptr;
    param_released_[i] = 1;
  }
}

void ModelParams::storage_restore(bool grads, const std::vector<size_t>& param_buffers) {
  const size_t n = params_.size() + lora_params_.size();
  for (size_t i : param_buffers)
    DT_ENFORCE_LT(i, n, UsageError, "Model::storage_restore: parameter buffer index out of range");
  if (grads && grads_released_) {
    auto& store = lora_on() ? lora_grad_store_ : grad_store_;
    auto& bufs = trainable_params();
    DT_CHECK(store.size() == bufs.size());
    for (size_t k = 0; k < bufs.size(); ++k) {
      store[k] = device::DeviceBuffer(*dev_, bufs[k].size * sizeof(float));
      bufs[k].grad = store[k].as<float>();
    }
    grads_released_ = false;
  }
  for (size_t i : param_buffers) {
    if (i >= param_released_.size() || !param_released_[i]) continue;
    ParamBuffer& pb = buffer_at(i);
    device::DeviceBuffer& b = param_store_at(i);
    b = device::DeviceBuffer(*dev_, pb.size * dtype_size(dtype_));
    pb.data = b.get();
    param_released_[i] = 0;
  }
}

void ModelParams::storage_restore() {
  std::vector<size_t> all(param_released_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  storage_restore(true, all);
}

bool ModelParams::storage_released() const {
  if (grads_released_) return true;
  for (char r : param_released_)
    if (r) return true;
  return false;
}

bool ModelParams::param_released(size_t i) const { return i < param_released_.size() && param_released_[i]; }

size_t ModelParams::param_allocated_bytes() const {
  size_t n = 0;
  for (const auto* list : {&param_store_, &lora_store_})
    for (const auto& b : *list) n += b.bytes();
  return n;
}

size_t ModelParams::grad_allocated_bytes() const {
  size_t n = 0;
  for (const auto* list : {&grad_store_, &lora_grad_store_})
    for (const auto& b : *list) n += b.bytes();
  return n;
}

void ModelParams::storage_enforce_whole(const char* what) const {
  DT_ENFORCE(!storage_released(), UsageError,
             "Model::{} needs the model's own parameter and gradient storage, but part of it is released to the ZeRO "
             "engine (stages 2-3); call it before creating the engine or after it is destroyed",
             what);
}

// Layer l's base buffer and adapter, after its hook ran (grads: released gradients
// must have been supplied for the trainable one).
void ModelParams::layer_buffers_enforce(int l, bool grads) const {
  buffer_enforce_present(params_[static_cast<size_t>(l) + 1], true, grads && !lora_on());
  if (lora_on()) buffer_enforce_present(lora_params_[static_cast<size_t>(l)], true, grads);
}

// A buffer about to be used must have storage: the model's own or a hook's working copy.
void ModelParams::buffer_enforce_present(const ParamBuffer& pb, bool need_data, bool need_grad) const {
  if (pb.size == 0) return;
  DT_ENFORCE(!need_data || pb.data != nullptr, UsageError,
             "parameter buffer {} has no storage when the model needs it: it is released (ZeRO stage 3) and no hook "
             "gathered it (install the engine's hooks, or call ZeroEngine::weights().materialize() for evaluation)",
             pb.layout.name);
  DT_ENFORCE(!need_grad || pb.grad != nullptr, UsageError,
             "gradient buffer {} has no storage when backward needs it: gradients are released (ZeRO stages 2-3) and "
             "no hook supplied a working buffer (install the engine's hooks)",
             pb.layout.name);
}

}  // namespace dtrain::model
