// GpuTrainer: the one model (lib/model) on a CUDA device (lib/device), plus what the
// optimizer step of one device needs: fp32 masters (under bf16/fp16), fp32 AdamW moments,
// the token-weighted loss over micro-batches, the fp16 loss scaler, global-norm clipping
// and AdamW writing the compute copy, with one statistics read-back per step. CPU-only builds
// get a factory that throws DeviceError.
#include "gpu/gpu_model.h"

#include "core/check.h"
#include "device/device.h"

#ifdef DTRAIN_HAVE_CUDA
#include "core/cuda_check.h"
#include "kernels/adamw.cuh"
#include "kernels/reduce.cuh"
#include "train/grad_clip.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#endif

namespace dtrain::gpu {

#ifndef DTRAIN_HAVE_CUDA

std::unique_ptr<GpuTrainer> gpu_trainer_create(model::Model&, const GpuTrainOptions& opts) {
  device::cuda_require(opts.device);
  return nullptr;  // not reached
}

#else

namespace {

constexpr int32_t IGNORE_INDEX = -100;
constexpr size_t CUBLASLT_WORKSPACE_BYTES = 32u << 20;  // kernels/gemm.cu, one per device

// The optimizer state of one trainable buffer. Under F32 the master is the model's own
// parameter array.
struct OptState {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  struct Run {
    size_t offset, n;
    bool decay;
  };
  std::vector<Run> runs;  // consecutive tensors with one decay flag: one AdamW launch each
};

class CudaTrainer final : public GpuTrainer {
 public:
  CudaTrainer(model::Model& init, const GpuTrainOptions& opts);

  const model::ModelConfig& config() const override { return model_->config(); }
  const GpuTrainOptions& options() const override { return opts_; }
  GpuStepResult step(const int32_t* inputs, const int32_t* targets, int accum, float lr) override;
  float forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale) override;
  void zero_grad() override { model_->zero_grad(); }
  std::vector<std::vector<float>> grads_to_host() override;
  void weights_to_model(model::Model& m) override;
  GpuMemory memory() const override;
  std::string device_name() const override { return dev_->name(); }
  int64_t applied_steps() const override { return step_count_; }
  void synchronize() override { dev_->synchronize(); }

 private:
  void optimizer_step(float lr, float grad_scale);
  cudaStream_t stream() const { return static_cast<cudaStream_t>(dev_->stream()); }

  GpuTrainOptions opts_;
  std::unique_ptr<device::Device> dev_;
  std::unique_ptr<model::Model> model_;
  std::vector<OptState> opt_;
  device::DeviceBuffer state_;  // masters, moments and the step's statistics
  double* norm_sq_ = nullptr;
  int* overflow_ = nullptr;
  std::unique_ptr<train::LossScaler> scaler_;
  int64_t step_count_ = 0;
};

CudaTrainer::CudaTrainer(model::Model& init, const GpuTrainOptions& opts) : opts_(opts) {
  const model::ModelConfig& cfg = init.config();
  DT_ENFORCE_GT(opts.micro_batch, 0, UsageError, "GPU trainer micro-batch size");
  DT_ENFORCE_GT(opts.grad_accum, 0, UsageError, "GPU trainer gradient accumulation steps");
  DT_ENFORCE(opts.seq_len >= 1 && opts.seq_len <= cfg.max_seq_len, ConfigError,
             "GPU trainer: sequence length {} must be in [1, max_seq_len = {}]", opts.seq_len, cfg.max_seq_len);
  DT_ENFORCE(static_cast<int64_t>(opts.micro_batch) * opts.seq_len <= (int64_t{1} << 31) / cfg.vocab_size,
             UsageError, "GPU trainer: micro-batch {} x seq_len {} x vocab {} logits exceed 2^31 elements",
             opts.micro_batch, opts.seq_len, cfg.vocab_size);
  dev_ = device::cuda_create(opts.device);
  model_ = std::make_unique<model::Model>(cfg, *dev_, opts.compute);
  model_->weights_copy_from(init);
  model_->set_recompute(opts.recompute);
  if (opts.compute == DType::F16) scaler_ = std::make_unique<train::LossScaler>(opts.loss_scaler);

  // One allocation for the optimizer: fp32 masters (mixed precision), m, v, statistics.
  auto& bufs = model_->trainable_params();
  const bool mixed = opts.compute != DType::F32;
  size_t floats = 0;
  for (const auto& pb : bufs) floats += (mixed ? 3 : 2) * ((pb.size + 63) / 64 * 64);
  state_ = device::DeviceBuffer(*dev_, floats * sizeof(float) + 64);
  float* p = state_.as<float>();
  norm_sq_ = reinterpret_cast<double*>(p);
  overflow_ = reinterpret_cast<int*>(p + 2);
  p += 16;
  for (size_t k = 0; k < bufs.size(); ++k) {
    const auto& pb = bufs[k];
    OptState s;
    const size_t n = (pb.size + 63) / 64 * 64;
    if (mixed) {
      s.master = p;
      p += n;
      const model::ParamBuffer& src = init.lora_on() ? init.lora_params()[k] : init.params()[k];
      DT_CHECK(src.size == pb.size);
      dev_->copy_h2d(s.master, src.host_f32(), pb.size * sizeof(float));
    } else {
      s.master = static_cast<float*>(pb.data);
    }
    s.m = p;
    p += n;
    s.v = p;
    p += n;
    for (const auto& t : pb.layout.tensors) {
      if (!s.runs.empty() && s.runs.back().decay == t.decay && s.runs.back().offset + s.runs.back().n == t.offset)
        s.runs.back().n += t.numel();
      else
        s.runs.push_back({t.offset, t.numel(), t.decay});
    }
    opt_.push_back(std::move(s));
  }
}

// Micro-batch a (weight n_a / n_step) is back-propagated with loss_scale * n_a / n_step,
// as the CPU trainer does; besides each forward's token upload and loss read-back, the
// host waits once, for the statistics AdamW needs.
GpuStepResult CudaTrainer::step(const int32_t* inputs, const int32_t* targets, int accum, float lr) {
  DT_ENFORCE(accum >= 1 && accum <= opts_.grad_accum, UsageError,
             "GPU trainer step: {} micro-batches, but it was set up for 1..{} (GpuTrainOptions::grad_accum)", accum,
             opts_.grad_accum);
  const int B = opts_.micro_batch, T = opts_.seq_len;
  const size_t N = static_cast<size_t>(B) * T;
  std::vector<int64_t> counts(static_cast<size_t>(accum), 0);
  int64_t n_step = 0;
  for (size_t i = 0; i < static_cast<size_t>(accum) * N; ++i)
    if (targets[i] != IGNORE_INDEX) ++counts[i / N];
  for (int64_t c : counts) n_step += c;
  GpuStepResult res;
  res.targets = n_step;
  res.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  model_->zero_grad();
  double loss_sum = 0.0;
  for (int a = 0; a < accum; ++a) {
    const int64_t c = counts[static_cast<size_t>(a)];
    if (c == 0) continue;  // nothing to learn from
    const size_t off = static_cast<size_t>(a) * N;
    loss_sum += static_cast<double>(model_->forward(inputs + off, targets + off, B, T)) * static_cast<double>(c);
    model_->backward(static_cast<float>(res.loss_scale * static_cast<double>(c) / static_cast<double>(n_step)));
  }
  const cudaStream_t s = stream();
  DT_CUDA_CHECK(cudaMemsetAsync(norm_sq_, 0, sizeof(double), s));
  DT_CUDA_CHECK(cudaMemsetAsync(overflow_, 0, sizeof(int), s));
  for (auto& pb : model_->trainable_params()) {
    kernels::grad_norm_sq(norm_sq_, pb.grad, pb.size, DType::F32, s);
    if (scaler_) kernels::has_inf_or_nan(overflow_, pb.grad, pb.size, DType::F32, s);
  }
  // One read-back: the norm (double) and the overflow flag sit next to each other.
  char stats[sizeof(double) + sizeof(int)];
  dev_->copy_d2h(stats, norm_sq_, sizeof stats);
  double norm_sq = 0.0;
  int overflow = 0;
  std::memcpy(&norm_sq, stats, sizeof(double));
  std::memcpy(&overflow, stats + sizeof(double), sizeof(int));
  res.loss = n_step > 0 ? loss_sum / static_cast<double>(n_step) : 0.0;
  res.grad_norm = std::sqrt(norm_sq) / res.loss_scale;
  DT_ENFORCE(std::isfinite(res.loss), TrainError, "GPU step: the loss is {}; lower optimizer.lr", res.loss);
  const bool bad = overflow != 0 || !std::isfinite(norm_sq);
  if (!scaler_) {
    DT_ENFORCE(!bad, TrainError,
               "gradients became inf/NaN (global norm {}); lower optimizer.lr or enable gradient_clipping",
               res.grad_norm);
  } else if (!scaler_->update(bad)) {
    res.skipped = true;
    return res;
  }
  optimizer_step(lr, train::clip_coefficient(res.grad_norm, opts_.max_grad_norm) / res.loss_scale);
  return res;
}

float CudaTrainer::forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale) {
  const float loss = model_->forward(tokens, targets, opts_.micro_batch, opts_.seq_len);
  model_->backward(grad_scale);
  return loss;
}

void CudaTrainer::optimizer_step(float lr, float grad_scale) {
  ++step_count_;
  const DType D = opts_.compute;
  const cudaStream_t s = stream();
  auto& bufs = model_->trainable_params();
  for (size_t k = 0; k < bufs.size(); ++k) {
    const OptState& o = opt_[k];
    float* g = bufs[k].grad;
    for (const auto& r : o.runs) {
      if (D == DType::F32)
        kernels::adamw_step(o.master + r.offset, g + r.offset, o.m + r.offset, o.v + r.offset, r.n, opts_.adamw, lr,
                            step_count_, r.decay, grad_scale, s);
      else
        kernels::adamw_step_copy(o.master + r.offset, g + r.offset, o.m + r.offset, o.v + r.offset, r.n, opts_.adamw,
                                 lr, step_count_, r.decay, grad_scale,
                                 static_cast<char*>(bufs[k].data) + r.offset * dtype_size(D), D, s);
    }
  }
}

std::vector<std::vector<float>> CudaTrainer::grads_to_host() {
  std::vector<std::vector<float>> out;
  for (auto& pb : model_->trainable_params()) {
    out.emplace_back(pb.size);
    dev_->copy_d2h(out.back().data(), pb.grad, pb.size * sizeof(float));
  }
  return out;
}

void CudaTrainer::weights_to_model(model::Model& m) {
  DT_ENFORCE(m.lora_on() == model_->lora_on(), UsageError,
             "weights_to_model: LoRA is {} here but {} on the target model", model_->lora_on() ? "on" : "off",
             m.lora_on() ? "on" : "off");
  auto& dst = m.trainable_params();
  auto& src = model_->trainable_params();
  DT_ENFORCE_EQ(dst.size(), src.size(), UsageError, "weights_to_model: parameter buffer count");
  for (size_t i = 0; i < src.size(); ++i) {
    DT_ENFORCE_EQ(dst[i].size, src[i].size, UsageError, "weights_to_model: size of buffer {}", src[i].layout.name);
    dev_->copy_d2h(dst[i].host_f32(), opt_[i].master, dst[i].size * sizeof(float));
  }
}

GpuMemory CudaTrainer::memory() const {
  GpuMemory g;
  g.arena_bytes = model_->allocated_bytes() + model_->activation_bytes() + state_.bytes();
  g.workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
  size_t free_b = 0, total_b = 0;
  DT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  g.device_used_bytes = total_b - free_b;
  g.device_total_bytes = total_b;
  return g;
}

}  // namespace

std::unique_ptr<GpuTrainer> gpu_trainer_create(model::Model& init, const GpuTrainOptions& opts) {
  DT_ENFORCE(opts.compute == DType::F32 || opts.compute == DType::BF16 || opts.compute == DType::F16, UsageError,
             "GPU trainer compute dtype");
  return std::make_unique<CudaTrainer>(init, opts);
}

#endif  // DTRAIN_HAVE_CUDA

}  // namespace dtrain::gpu
