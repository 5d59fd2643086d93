// BenchSetup from a training config, the synthetic batches of the step `dtrain bench
// train` times and `--plan` budgets, and the shape both reports give of it.
#include "bench/bench_step.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/rng.h"
#include "train/model_factory.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dtrain::bench {

BenchSetup bench_setup_from(const std::string& path, const std::vector<std::string>& sets, bool cuda) {
  return bench_setup_of(config::config_load_file(path, sets).cfg, cuda);
}

BenchSetup bench_setup_of(config::TrainConfig config, bool cuda) {
  BenchSetup s;
  s.cfg = std::move(config);
  config::TrainConfig& cfg = s.cfg;
  s.model = train::model_config_from(cfg);
  if (cfg.lora.enabled()) s.lora = train::lora_config_from(cfg, s.model);
  s.recompute_layers = train::recompute_layers_of(cfg, s.model.n_layer);
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
  s.zero = train::zero_options_from(cfg);
  // ZeRO-Offload keeps its stage (>= 1; on one rank every stage is stage 0's arithmetic)
  // so that the bench times the offloaded update: host AdamW and the copies both ways.
  s.zero.stage = s.zero.offload_optimizer && cuda ? std::max(1, s.zero.stage) : 0;
  if (!cuda) s.zero.offload_optimizer = s.zero.offload_param = false;
  if (s.zero.offload_optimizer)
    s.notes.push_back(fmt::format("offload_optimizer{} at ZeRO stage {} on one rank",
                                  s.zero.offload_param ? " + offload_param" : "", s.zero.stage));
  s.zero.overlap_comm = false;
  s.zero.compute_dtype = s.dtype;
  const train::TrainStepOptions so =
      train::step_options_from(cfg, s.micro_batch, s.grad_accum, s.seq_len, s.dtype == DType::F16);
  s.loss_scaler = so.loss_scaler;
  s.cuda_graph = so.cuda_graph;
  s.lr = static_cast<float>(cfg.optimizer.lr);
  s.seed = static_cast<uint64_t>(cfg.training.seed);
  return s;
}

train::TrainStepOptions BenchSetup::step_options() const {
  train::TrainStepOptions o;
  o.micro_batch = micro_batch;
  o.grad_accum = grad_accum;
  o.seq_len = seq_len;
  o.loss_scaler = loss_scaler;
  o.cuda_graph = cuda_graph;
  return o;
}

BenchBatch bench_batch(const BenchSetup& s, uint64_t index) {
  const size_t n = static_cast<size_t>(s.micro_batch) * s.seq_len;
  Rng rng(splitmix64(s.seed ^ splitmix64(index + 1)));
  std::vector<int32_t> stream(static_cast<size_t>(s.grad_accum) * n + 1);
  for (auto& t : stream) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(s.model.vocab_size));
  BenchBatch b;
  for (int a = 0; a < s.grad_accum; ++a) {
    const auto at = stream.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(a) * n);
    b.inputs.emplace_back(at, at + static_cast<ptrdiff_t>(n));
    b.targets.emplace_back(at + 1, at + 1 + static_cast<ptrdiff_t>(n));
    b.counts.push_back(static_cast<int64_t>(n));
  }
  return b;
}

void step_shape_set(StepShape& into, const std::string& config, const BenchSetup& s) {
  into.config = config;
  into.arch = model::arch_name(s.model.arch);
  into.dtype = dtype_name(s.dtype);
  into.lora_rank = s.lora ? s.lora->rank : 0;
  into.n_layer = s.model.n_layer;
  into.d_model = s.model.d_model;
  into.micro_batch = s.micro_batch;
  into.seq_len = s.seq_len;
  into.grad_accum = s.grad_accum;
}

nlohmann::json step_shape_json(const StepShape& r) {
  return {{"config", r.config},
          {"arch", r.arch},
          {"dtype", r.dtype},
          {"params", r.params},
          {"trainable_params", r.trainable_params},
          {"lora_rank", r.lora_rank},
          {"n_layer", r.n_layer},
          {"d_model", r.d_model},
          {"micro_batch", r.micro_batch},
          {"seq_len", r.seq_len},
          {"grad_accum", r.grad_accum},
          {"tokens_per_step", static_cast<int64_t>(r.micro_batch) * r.seq_len * r.grad_accum}};
}

}  // namespace dtrain::bench
