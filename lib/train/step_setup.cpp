// StepSetup from a training config and the step's synthetic batches.
#include "train/step_setup.h"

#include "core/check.h"
#include "core/rng.h"
#include "train/model_factory.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace dtrain::train {

StepSetup step_setup_from(const std::string& path, const std::vector<std::string>& sets, bool cuda) {
  return step_setup_of(config::config_load_file(path, sets).cfg, cuda);
}

StepSetup step_setup_of(config::TrainConfig config, bool cuda) {
  StepSetup s;
  s.cfg = std::move(config);
  config::TrainConfig& cfg = s.cfg;
  s.model = model_config_from(cfg);
  if (cfg.lora.enabled()) s.lora = lora_config_from(cfg, s.model);
  s.recompute_layers = recompute_layers_of(cfg, s.model.n_layer);
  if (!cfg.activation_checkpointing.enabled && !cfg.activation_checkpointing.layers)
    s.notes.push_back("activation_checkpointing not given: no layer recomputes (a launch lets the memory plan decide)");
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
  s.zero = zero_options_from(cfg);
  // ZeRO-Offload keeps its stage (>= 1; on one rank every stage is stage 0's arithmetic)
  // so that the bench times the offloaded update: host AdamW and the copies both ways.
  s.zero.stage = s.zero.offload_optimizer && cuda ? std::max(1, s.zero.stage) : 0;
  if (!cuda) s.zero.offload_optimizer = s.zero.offload_param = false;
  if (s.zero.offload_optimizer)
    s.notes.push_back(fmt::format("offload_optimizer{} at ZeRO stage {} on one rank",
                                  s.zero.offload_param ? " + offload_param" : "", s.zero.stage));
  s.zero.overlap_comm = false;
  s.zero.compute_dtype = s.dtype;
  const TrainStepOptions so = step_options_from(cfg, s.micro_batch, s.grad_accum, s.seq_len, s.dtype == DType::F16);
  s.loss_scaler = so.loss_scaler;
  s.cuda_graph = so.cuda_graph;
  s.lr = static_cast<float>(cfg.optimizer.lr);
  s.seed = static_cast<uint64_t>(cfg.training.seed);
  return s;
}

TrainStepOptions StepSetup::step_options() const {
  TrainStepOptions o;
  o.micro_batch = micro_batch;
  o.grad_accum = grad_accum;
  o.seq_len = seq_len;
  o.loss_scaler = loss_scaler;
  o.cuda_graph = cuda_graph;
  return o;
}

SyntheticBatch synthetic_batch(const StepSetup& s, uint64_t index) {
  const size_t n = static_cast<size_t>(s.micro_batch) * s.seq_len;
  Rng rng(splitmix64(s.seed ^ splitmix64(index + 1)));
  std::vector<int32_t> stream(static_cast<size_t>(s.grad_accum) * n + 1);
  for (auto& t : stream) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(s.model.vocab_size));
  SyntheticBatch b;
  for (int a = 0; a < s.grad_accum; ++a) {
    const auto at = stream.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(a) * n);
    b.inputs.emplace_back(at, at + static_cast<ptrdiff_t>(n));
    b.targets.emplace_back(at + 1, at + 1 + static_cast<ptrdiff_t>(n));
    b.counts.push_back(static_cast<int64_t>(n));
  }
  return b;
}

}  // namespace dtrain::train
