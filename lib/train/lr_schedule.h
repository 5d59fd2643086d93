// Learning-rate schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py):
// WarmupLR, WarmupDecayLR, WarmupCosineLR, plus "constant" when no scheduler is set.
// Schedules are pure functions of the optimizer step, so resuming needs no state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dtrain::train {

/// The scheduler section of a training config (DeepSpeed's key names). Unused fields
/// are ignored by the schedules that do not read them.
struct LrScheduleConfig {
  std::string type = "constant";       ///< "constant" (or ""), "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"
  float warmup_min_lr = 0.0f;          ///< WarmupLR / WarmupDecayLR
  std::optional<float> warmup_max_lr;  ///< WarmupLR / WarmupDecayLR; unset: the optimizer's base lr
  int64_t warmup_num_steps = 1000;     ///< all warmup schedules; must be > 0; values < 2 act as 2 (DeepSpeed)
  int64_t total_num_steps = 0;         ///< WarmupDecayLR / WarmupCosineLR; must be > 0 there
  std::string warmup_type = "log";     ///< "log" or "linear"
  float warmup_min_ratio = 0.0f;       ///< WarmupCosineLR: start ratio of the base lr
  float cos_min_ratio = 1e-4f;         ///< WarmupCosineLR: end ratio of the base lr
};

/// lr(step) for optimizer step `step`, 0-based: the lr used by the first optimizer update
/// is lr(0). dtrain's convention: lr(s) equals DeepSpeed's get_lr() at
/// last_batch_iteration = s. (DeepSpeed's engine applies the value at iteration -1, i.e.
/// warmup_min_lr or ratio 0, to the very first update and is one step behind from there
/// on; dtrain starts at iteration 0 so no update is spent at lr 0.) Steps skipped for fp16
/// overflow do not advance `step`.
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual float lr(int64_t step) const = 0;
};

/// Builds the schedule; throws ConfigError naming the offending key for an unknown type or
/// warmup_type, warmup_num_steps <= 0, or total_num_steps <= 0 where a decay needs it.
std::unique_ptr<LrSchedule> lr_schedule_create(const LrScheduleConfig& cfg, float base_lr);

}  // namespace dtrain::train
