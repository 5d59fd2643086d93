// The one training step `dtrain bench train` measures and `--plan` budgets: what it
// depends on (BenchSetup, read from a training config) and the driver that runs it on a
// device model (BenchStepper: the trainer's forward/backward per micro-batch and its ZeRO
// engine at stage 0 on one rank), so the timed run, the plan and the test that holds the
// plan to the real launches all run the same calls.
#pragma once

#include "config/train_config.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/loss_scaler.h"
#include "train/zero_engine.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::gpu {

struct BenchSetup {
  model::ModelConfig model;
  std::optional<model::LoraConfig> lora;  ///< LoRA fine-tune when set
  bool recompute = false;                 ///< activation_checkpointing.enabled
  DType dtype = DType::F32;               ///< compute copy and activations
  int micro_batch = 1, seq_len = 1, grad_accum = 1;
  train::ZeroOptions zero;  ///< the config's optimizer settings at stage 0, one rank, no overlap
  std::optional<train::LossScalerConfig> loss_scaler;  ///< fp16 only
  float lr = 0.0f;
  uint64_t seed = 0;                ///< training.seed: weights and synthetic tokens
  std::vector<std::string> notes;   ///< settings the bench changed or ignored
};

/// The step of the config at path (with --set overrides) on one device: the model (and
/// LoRA, recompute), the micro-batch (accumulation only when gradient_accumulation_steps
/// is given: train_batch_size is a multi-rank figure), data.seq_len (else max_seq_len),
/// the optimizer, and the dtype: bf16/fp16 from the config on CUDA, fp32 on the CPU.
/// ConfigError / IoError for the config.
BenchSetup bench_setup_from(const std::string& path, const std::vector<std::string>& sets, bool cuda);

/// accum x micro_batch x seq_len random tokens and their next-token targets (nothing
/// masked), from the setup's seed and `index` (different batches per index).
struct BenchBatch {
  std::vector<int32_t> inputs, targets;
};
BenchBatch bench_batch(const BenchSetup& s, uint64_t index);

/// One optimizer step as `dtrain launch` runs it on one rank: the model's forward and
/// backward per micro-batch, then the ZeRO engine at stage 0 (fp16 overflow check and
/// loss scale, clipping, AdamW per tensor with its decay flag, the compute copy
/// refreshed). fp32_source: the host fp32 model a 16-bit device model's masters start
/// from (see train::ZeroEngine).
class BenchStepper {
 public:
  BenchStepper(model::Model& m, const BenchSetup& s, const model::Model* fp32_source);
  /// Returns the step's mean loss. TrainError when an fp32/bf16 step's gradients are inf/NaN.
  double step(const BenchBatch& b);
  const train::ZeroEngine& engine() const { return engine_; }

 private:
  model::Model& m_;
  int B_, T_, accum_;
  float lr_;
  train::ZeroEngine engine_;
  std::unique_ptr<train::LossScaler> scaler_;
};

}  // namespace dtrain::gpu
