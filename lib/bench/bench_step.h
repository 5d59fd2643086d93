// The one training step `dtrain bench train` measures and `--plan` budgets: what it
// depends on (BenchSetup, read from a training config) and its synthetic batches. The step
// itself is the trainer's (train::TrainStep), so the timed run, the plan and the test that
// holds the plan to the real launches all run the calls that training runs.
#pragma once

#include "config/train_config.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/loss_scaler.h"
#include "train/train_step.h"
#include "train/zero_engine.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::bench {

struct BenchSetup {
  config::TrainConfig cfg;  ///< the config read (the trainer's model_create builds its model)
  model::ModelConfig model;
  std::optional<model::LoraConfig> lora;  ///< LoRA fine-tune when set
  int recompute_layers = 0;               ///< train::recompute_layers_of
  DType dtype = DType::F32;               ///< compute copy and activations
  int micro_batch = 1, seq_len = 1, grad_accum = 1;
  train::ZeroOptions zero;  ///< the config's optimizer settings at stage 0, one rank, no overlap
  std::optional<train::LossScalerConfig> loss_scaler;  ///< fp16 only
  bool cuda_graph = false;                             ///< training.cuda_graph
  float lr = 0.0f;
  uint64_t seed = 0;               ///< training.seed: weights and synthetic tokens
  std::vector<std::string> notes;  ///< settings the bench changed or ignored

  /// The trainer's step options for this setup.
  train::TrainStepOptions step_options() const;
};

/// The step of the config at path (with --set overrides) on one device: the model (and
/// LoRA, recompute), the micro-batch (accumulation only when gradient_accumulation_steps
/// is given: train_batch_size is a multi-rank figure), data.seq_len (else max_seq_len),
/// the optimizer, and the dtype: bf16/fp16 from the config on CUDA, fp32 on the CPU.
/// ConfigError / IoError for the config.
BenchSetup bench_setup_from(const std::string& path, const std::vector<std::string>& sets, bool cuda);
/// The same from a config already read (the dry run's, its batch resolved or not).
BenchSetup bench_setup_of(config::TrainConfig cfg, bool cuda);

/// grad_accum micro-batches of micro_batch x seq_len random tokens and their next-token
/// targets (nothing masked), from the setup's seed and `index` (different batches per
/// index), in the trainer's step batch layout.
struct BenchBatch {
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<int64_t> counts;  ///< unmasked targets per micro-batch: all of them
  train::StepBatch view() const { return {&inputs, &targets, &counts}; }
};
BenchBatch bench_batch(const BenchSetup& s, uint64_t index);

/// What a report says of the step it timed (bench_train_format) or planned (`--plan`): the
/// config, the model and the batch.
struct StepShape {
  std::string config, arch, dtype;
  int64_t params = 0, trainable_params = 0;  ///< of the model built (the caller's)
  int lora_rank = 0;                         ///< 0 = full fine-tune
  int n_layer = 0, d_model = 0, micro_batch = 0, seq_len = 0, grad_accum = 0;
};
/// The shape of the setup s read from `config` (the parameter counts left to the caller).
void step_shape_set(StepShape& into, const std::string& config, const BenchSetup& s);
/// Its fields in both reports' JSON, with tokens_per_step.
nlohmann::json step_shape_json(const StepShape& r);

}  // namespace dtrain::bench
