// The one training step of a config on one device, read from the config: the model (and
// LoRA, recompute), the micro-batch, the optimizer and the dtype (StepSetup), and its
// synthetic batches. `dtrain bench train` times this step (train::TrainStep, the trainer's
// own) and lib/plan models it (`--plan`, the cluster plan of `launch --dry-run`).
#pragma once

#include "config/train_config.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/lora.h"
#include "train/loss_scaler.h"
#include "train/train_step.h"
#include "train/zero_engine.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

struct StepSetup {
  config::TrainConfig cfg;  ///< the config read (the trainer's model_create builds its model)
  model::ModelConfig model;
  std::optional<model::LoraConfig> lora;  ///< LoRA fine-tune when set
  int recompute_layers = 0;               ///< recompute_layers_of
  DType dtype = DType::F32;               ///< compute copy and activations
  int micro_batch = 1, seq_len = 1, grad_accum = 1;
  ZeroOptions zero;                             ///< the config's optimizer settings at stage 0, one rank, no overlap
  std::optional<LossScalerConfig> loss_scaler;  ///< fp16 only
  bool cuda_graph = false;                      ///< training.cuda_graph
  float lr = 0.0f;
  uint64_t seed = 0;               ///< training.seed: weights and synthetic tokens
  std::vector<std::string> notes;  ///< settings changed or ignored for one device

  /// The trainer's step options for this setup.
  TrainStepOptions step_options() const;
};

/// The step of the config at path (with --set overrides) on one device: the model (and
/// LoRA, recompute), the micro-batch (accumulation only when gradient_accumulation_steps
/// is given: train_batch_size is a multi-rank figure), data.seq_len (else max_seq_len),
/// the optimizer, and the dtype: bf16/fp16 from the config on CUDA, fp32 on the CPU.
/// ConfigError / IoError for the config.
StepSetup step_setup_from(const std::string& path, const std::vector<std::string>& sets, bool cuda);
/// The same from a config already read (the dry run's, its batch resolved or not).
StepSetup step_setup_of(config::TrainConfig cfg, bool cuda);

/// grad_accum micro-batches of micro_batch x seq_len random tokens and their next-token
/// targets (nothing masked), from the setup's seed and `index` (different batches per
/// index), in the trainer's step batch layout.
struct SyntheticBatch {
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<int64_t> counts;  ///< unmasked targets per micro-batch: all of them
  StepBatch view() const { return {&inputs, &targets, &counts}; }
};
SyntheticBatch synthetic_batch(const StepSetup& s, uint64_t index);

}  // namespace dtrain::train
