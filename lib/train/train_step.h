// The optimizer step: everything from "the step's micro-batches are loaded" to "the
// model's buffers hold the next step's weights", once, for every caller that steps a model:
// the trainer's loop (train_run) and `dtrain bench train`, which times exactly this step.
// Forward and backward per micro-batch with the cross-entropy weighted by the step's
// unmasked-target count over every rank (summed on the device), each micro-batch's loss
// to a loss slot, then the ZeRO engine's update (reduction, overflow check, clipping,
// AdamW, compute-copy refresh) and one read-back; the fp16 loss scaler; the step recorded
// in a CUDA graph and replayed (training.cuda_graph).
#pragma once

#include "model/model.h"
#include "train/loss_scaler.h"
#include "train/metrics.h"
#include "train/preference.h"
#include "train/zero_engine.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::train {

/// The step's shape and switches (the same every step).
struct TrainStepOptions {
  int micro_batch = 1, grad_accum = 1, seq_len = 1;
  /// fp16: the loss scaler's settings; nullopt = no loss scaling (scale 1).
  std::optional<LossScalerConfig> loss_scaler;
  /// training.cuda_graph: record the step once and replay it, where a graph can replay it
  /// (a CUDA device, one micro-batch per step, stage <= 1, no LoRA dropout).
  bool cuda_graph = false;
  /// A model built with deferred storage: each base buffer's fp32 values, for the ZeRO
  /// engine to build its shards from one buffer at a time (ZeroEngine's `deferred`).
  model::BufferFill deferred_weights;
  /// training.stage dpo: each micro-batch's rows are micro_batch / 2 pairs (the chosen
  /// rows, then the rejected ones) and the step minimises this objective instead of the
  /// cross-entropy (no CUDA graph: the objective is evaluated on the host).
  std::optional<PrefOptions> preference;
};

/// The step options a config asks for, derived here once for the trainer and `dtrain bench
/// train`: micro-batches of micro_batch rows x seq_len tokens, grad_accum of them per step,
/// the config's fp16 loss scaler when `fp16_scaled` (the caller knows its compute dtype) and
/// training.cuda_graph. The caller adds what only it has (deferred weights, a preference
/// objective).
TrainStepOptions step_options_from(const config::TrainConfig& cfg, int micro_batch, int grad_accum, int seq_len,
                                   bool fp16_scaled);

/// One step's micro-batches: grad_accum token rows of micro_batch x seq_len each, their
/// next-token targets (masked ones < 0) and each one's unmasked-target count.
struct StepBatch {
  const std::vector<std::vector<int32_t>>* inputs = nullptr;
  const std::vector<std::vector<int32_t>>* targets = nullptr;
  const std::vector<int64_t>* counts = nullptr;
  /// Preference steps with a precomputed reference: per micro-batch, the reference
  /// log-probability sums of its rows (in row order).
  const std::vector<std::vector<double>>* ref_logps = nullptr;
  /// Packed documents kept apart: per micro-batch, its rows' document starts (the model's
  /// doc_start), or an empty vector (or nullptr for all) without them.
  const std::vector<std::vector<int32_t>>* doc_starts = nullptr;
  /// Micro-batch i's document starts, or nullptr.
  const int32_t* doc_start(size_t i) const {
    return doc_starts != nullptr && !(*doc_starts)[i].empty() ? (*doc_starts)[i].data() : nullptr;
  }
};

/// What the step did.
struct StepOutcome {
  float lr = 0.0f;
  float loss_scale = 1.0f;    ///< the scale the step ran with (1 without fp16)
  bool overflow = false;      ///< inf/NaN gradients: the update was skipped (fp16 only)
  bool applied = true;        ///< the weights were updated
  double grad_norm = 0.0;     ///< global, unscaled, before clipping
  double loss = 0.0;          ///< mean cross-entropy over the step's unmasked targets on every rank (0: none)
  double target_count = 0.0;  // the step's unmasked targets over every rank
  /// Named extra metrics of the step, in order (preference steps: TRL's rewards/* and
  /// logps/*, means over every rank's pairs); empty for SFT.
  std::vector<std::pair<std::string, double>> metrics;
};

/// Steps `model` (on its device; a 16-bit CUDA model with fp32_source, the host fp32
/// model its masters start from, as train::ZeroEngine takes it) with a ZeRO engine over
/// comm (nullptr: one rank).
class TrainStep {
 public:
  TrainStep(model::Model& model, const model::Model* fp32_source, comm::Communicator* comm, const ZeroOptions& zero,
            const TrainStepOptions& opts);

  /// Runs one optimizer step at this lr. The sections FORWARD, BACKWARD and OPTIMIZER of
  /// timer are timed. TrainError when the loss is not finite, or when the gradients are
  /// inf/NaN without fp16 loss scaling (with it, the step is skipped and the scale lowered).
  /// `step` is the step's index, for the messages.
  StepOutcome run(int64_t step, float lr, const StepBatch& batch, StepTimer& timer);

  ZeroEngine& engine() { return engine_; }
  const ZeroEngine& engine() const { return engine_; }
  /// The fp16 loss scaler, nullptr without one (its state goes into checkpoints).
  LossScaler* scaler() { return scaler_.get(); }
  /// Steps replayed from a CUDA graph so far.
  int64_t graph_steps() const { return graph_steps_; }

 private:
  void issue(float factor, float loss_scale, float lr, const StepBatch& b, StepTimer& timer);
  void issue_graphed(float factor, float loss_scale, const StepBatch& b, float* slot, StepTimer& timer);
  PrefStats issue_preference(float factor, float loss_scale, float lr, const StepBatch& b, StepTimer& timer);

  model::Model& m_;
  comm::Communicator* comm_;
  const TrainStepOptions opts_;
  ZeroEngine engine_;
  std::unique_ptr<LossScaler> scaler_;
  // Stages 2-3 run collectives inside backward (stage 3 inside forward too): every rank
  // runs every micro-batch, an all-masked one with weight 0. overlap_comm at stages 0/1
  // reduces in the last micro-batch's backward: every rank must run it too.
  const bool lockstep_;
  // CUDA graphs: the step recorded once and replayed while the values it was recorded
  // with (the key) stay the same.
  struct GraphKey {
    bool run = false;  // the micro-batch runs forward/backward
    float loss_scale = 1;
    uint64_t buffers = 0;    // Model::buffers_version
    bool documents = false;  // the micro-batch came with document starts (the kernels' arguments differ)
    bool operator==(const GraphKey&) const = default;
  };
  bool graph_on_ = false;
  std::unique_ptr<device::Device::Graph> graph_;
  std::optional<GraphKey> graph_key_, last_key_;
  int64_t graph_steps_ = 0;
};

/// The compute copy of host (an fp32 host model) on dev in dtype, its weights copied
/// from host, LoRA and recompute as host has them: the model a device trains.
std::unique_ptr<model::Model> model_on_device(const model::Model& host, device::Device& dev, DType dtype);

}  // namespace dtrain::train
