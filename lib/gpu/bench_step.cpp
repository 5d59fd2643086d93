// BenchSetup from a training config, the synthetic batches, and BenchStepper: the step
// `dtrain bench train` times and `--plan` budgets.
#include "gpu/bench_step.h"

#include "core/check.h"
#include "core/rng.h"
#include "train/model_factory.h"

#include <fmt/format.h>

namespace dtrain::gpu {

BenchSetup bench_setup_from(const std::string& path, const std::vector<std::string>& sets, bool cuda) {
  config::TrainConfig cfg = config::config_load_file(path, sets).cfg;
  BenchSetup s;
  s.model = train::model_config_from(cfg);
  if (cfg.lora.enabled()) s.lora = train::lora_config_from(cfg, s.model);
  s.recompute = cfg.activation_checkpointing.enabled;
  // One device: the micro-batch of the config, and accumulation only when
  // gradient_accumulation_steps is given (train_batch_size is a multi-rank figure).
  if (cfg.train_micro_batch_size_per_gpu) {
    s.micro_batch = static_cast<int>(*cfg.train_micro_batch_size_per_gpu);
  } else {
    config::config_resolve_batch(cfg, 1);
    s.micro_batch = static_cast<int>(cfg.resolved_micro_batch_size);
  }
  s.grad_accum = static_cast<int>(cfg.gradient_accumulation_steps.value_or(1));
  if (cfg.train_batch_size && !cfg.gradient_accumulation_steps)
    s.notes.push_back(fmt::format("train_batch_size {} ignored: one device, accumulation 1", *cfg.train_batch_size));
  s.seq_len = static_cast<int>(cfg.data.seq_len.value_or(s.model.max_seq_len));
  DT_ENFORCE(s.micro_batch > 0 && s.grad_accum > 0, ConfigError, "{}: micro-batch and accumulation must be positive",
             cfg.source);
  s.dtype = !cuda ? DType::F32 : cfg.bf16.enabled ? DType::BF16 : cfg.fp16.enabled ? DType::F16 : DType::F32;
  if (!cuda && (cfg.bf16.enabled || cfg.fp16.enabled)) s.notes.push_back("the CPU bench runs fp32");
  // The trainer's own optimizer settings (AdamW, clipping), as `dtrain launch` reads
  // them, on the engine at stage 0 on one rank in the bench's dtype.
  s.zero = train::zero_options_from(cfg);
  s.zero.stage = 0;
  s.zero.overlap_comm = false;
  s.zero.compute_dtype = s.dtype;
  if (s.dtype == DType::F16) s.loss_scaler = train::loss_scaler_config_from(cfg.fp16);
  s.lr = static_cast<float>(cfg.optimizer.lr);
  s.seed = static_cast<uint64_t>(cfg.training.seed);
  return s;
}

BenchBatch bench_batch(const BenchSetup& s, uint64_t index) {
  const size_t n = static_cast<size_t>(s.grad_accum) * s.micro_batch * s.seq_len;
  Rng rng(splitmix64(s.seed ^ splitmix64(index + 1)));
  std::vector<int32_t> stream(n + 1);
  for (auto& t : stream) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(s.model.vocab_size));
  return BenchBatch{{stream.begin(), stream.end() - 1}, {stream.begin() + 1, stream.end()}};
}

BenchStepper::BenchStepper(model::Model& m, const BenchSetup& s, const model::Model* fp32_source)
    : m_(m),
      B_(s.micro_batch),
      T_(s.seq_len),
      accum_(s.grad_accum),
      lr_(s.lr),
      engine_(m, nullptr, s.zero, fp32_source) {
  if (s.loss_scaler) scaler_ = std::make_unique<train::LossScaler>(*s.loss_scaler);
}

double BenchStepper::step(const BenchBatch& b) {
  const size_t n = static_cast<size_t>(B_) * T_;
  const float scale = scaler_ ? scaler_->scale() : 1.0f;
  engine_.before_step();
  double loss = 0.0;
  for (int a = 0; a < accum_; ++a) {
    loss += m_.forward(b.inputs.data() + a * n, b.targets.data() + a * n, B_, T_) / accum_;
    m_.backward(scale / static_cast<float>(accum_));  // every target is unmasked here
  }
  const bool applied = engine_.step(lr_, scale);
  if (scaler_) scaler_->update(!applied);
  else
    DT_ENFORCE(applied, TrainError, "bench train: gradients became inf/NaN (global norm {}); lower optimizer.lr",
               engine_.last_grad_norm());
  return loss;
}

}  // namespace dtrain::gpu
