// fp16 loss scaling with DeepSpeed's DynamicLossScaler semantics
// (deepspeed/runtime/fp16/loss_scaler.py), the static variant, and the inf/nan check
// that decides whether a step overflowed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::config {
struct Fp16Config;
}

namespace dtrain::train {

/// The fp16 section of a training config (DeepSpeed key names and defaults).
struct LossScalerConfig {
  float loss_scale = 0.0f;              ///< fp16.loss_scale: > 0 = static scale, 0 = dynamic
  int initial_scale_power = 16;         ///< fp16.initial_scale_power: dynamic start 2^power
  int64_t loss_scale_window = 1000;     ///< fp16.loss_scale_window
  int hysteresis = 2;                   ///< fp16.hysteresis (DeepSpeed's delayed_shift)
  bool consecutive_hysteresis = false;  ///< fp16.consecutive_hysteresis
  float min_loss_scale = 1.0f;          ///< fp16.min_loss_scale
  bool raise_error_at_min_scale = true;
};

/// Everything a checkpoint must hold to resume the scaler bit-exactly.
struct LossScalerState {
  float scale = 1.0f;
  int64_t cur_iter = 0;  ///< number of update() calls so far
  int64_t last_overflow_iter = -1;
  int cur_hysteresis = 1;
};

/// Dynamic (or static) loss scale. Per step: scale the loss by scale(), run backward,
/// check the gradients (has_inf_or_nan, reduced over all ranks), call update(overflow);
/// apply the optimizer step and advance the lr schedule only when it returns true.
///
/// Dynamic rules, as current DeepSpeed:
///  - overflow with hysteresis credit left (cur_hysteresis > 1): cur_hysteresis -= 1, the
///    scale is kept;
///  - overflow with no credit: scale = max(scale / 2, min_loss_scale); if the scale was
///    already equal to min_loss_scale, update() throws TrainError instead (the step that
///    just overflowed was attempted at the minimum scale, so lowering is impossible);
///  - no overflow: with consecutive_hysteresis, cur_hysteresis is refilled; then, with
///    stable = cur_iter - last_overflow_iter - 1 (iterations counted by update() calls,
///    skipped ones included), when stable > 0 and stable % loss_scale_window == 0 the
///    scale doubles and (without consecutive_hysteresis) hysteresis is refilled.
///    From a fresh start or an overflow, the first doubling happens on the
///    (loss_scale_window + 1)-th consecutive clean step.
/// A static scale never changes; overflowing steps are still skipped.
/// The scaler the fp16 section of a training config asks for (defined with the other
/// config-to-engine mappings in zero_options.cpp).
LossScalerConfig loss_scaler_config_from(const config::Fp16Config& f);

class LossScaler {
 public:
  /// Throws ConfigError for a non-positive window, hysteresis or min_loss_scale, or an
  /// initial scale outside fp32 range.
  explicit LossScaler(const LossScalerConfig& cfg);

  float scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  /// Returns true if the step should be applied (no overflow).
  bool update(bool overflow);

  LossScalerState state() const { return state_; }
  /// Restores a checkpointed state; throws CheckpointError if it is inconsistent.
  void set_state(const LossScalerState& s);

 private:
  LossScalerConfig cfg_;
  bool dynamic_;
  LossScalerState state_;
};

/// True if any of the n values is +-inf or NaN.
bool has_inf_or_nan(const float* x, size_t n);

}  // namespace dtrain::train
