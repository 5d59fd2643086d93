// The schedule classes behind lr_schedule_create. Arithmetic is in double like
// DeepSpeed's Python floats; only the result is rounded to fp32.
#include "train/lr_schedule.h"

#include "core/check.h"
#include "core/log.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dtrain::train {

namespace {

// ----------------------------------------------------------------------------
// Warmup fraction in [0, 1) for step < warmup (DeepSpeed's _get_gamma warmup branch).
struct Warmup {
  int64_t steps;  // already max(2, warmup_num_steps)
  bool log;
  double inverse_log;

  Warmup(int64_t num_steps, bool is_log)
      : steps(std::max<int64_t>(2, num_steps)), log(is_log), inverse_log(1.0 / std::log(static_cast<double>(steps))) {}
  bool active(int64_t step) const { return step < steps; }
  double gamma(int64_t step) const {
    return log ? inverse_log * std::log(static_cast<double>(step + 1))
               : static_cast<double>(step) / static_cast<double>(steps);
  }
};

class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(float lr) : lr_(lr) {}
  float lr(int64_t) const override { return lr_; }

 private:
  float lr_;
};

// WarmupLR and WarmupDecayLR: min + (max - min) * gamma(step).
class WarmupLr final : public LrSchedule {
 public:
  WarmupLr(double min_lr, double max_lr, Warmup warmup, bool decay, int64_t total)
      : min_(min_lr), delta_(max_lr - min_lr), warmup_(warmup), decay_(decay), total_(total) {}
  float lr(int64_t step) const override {
    if (step < 0) return static_cast<float>(min_);
    return static_cast<float>(min_ + delta_ * gamma(step));
  }

 private:
  double gamma(int64_t step) const {
    if (warmup_.active(step)) return warmup_.gamma(step);
    if (!decay_) return 1.0;
    const double span = std::max<double>(1.0, static_cast<double>(total_ - warmup_.steps));
    return std::max(0.0, static_cast<double>(total_ - step) / span);
  }
  double min_, delta_;
  Warmup warmup_;
  bool decay_;
  int64_t total_;
};

// WarmupCosineLR: base_lr * ratio(step).
class WarmupCosineLr final : public LrSchedule {
 public:
  WarmupCosineLr(double base_lr, double warmup_min_ratio, double cos_min_ratio, Warmup warmup, int64_t total)
      : base_(base_lr), warmup_min_ratio_(warmup_min_ratio), cos_min_ratio_(cos_min_ratio), warmup_(warmup),
        total_(total) {}
  float lr(int64_t step) const override { return static_cast<float>(base_ * ratio(step)); }

 private:
  double ratio(int64_t step) const {
    if (step < 0) return 0.0;
    if (warmup_.active(step)) return warmup_min_ratio_ + warmup_.gamma(step) * (1.0 - warmup_min_ratio_);
    // Progress is clamped to 1 (current DeepSpeed) so the ratio stays at cos_min_ratio past
    // the end instead of rising again.
    const double real_step = static_cast<double>(step - warmup_.steps + 1);
    const double real_total = std::max<double>(1.0, static_cast<double>(total_ - warmup_.steps));
    const double progress = std::min(1.0, real_step / real_total);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }
  double base_, warmup_min_ratio_, cos_min_ratio_;
  Warmup warmup_;
  int64_t total_;
};

Warmup warmup_from(const LrScheduleConfig& cfg) {
  DT_ENFORCE(cfg.warmup_type == "log" || cfg.warmup_type == "linear", ConfigError,
             "scheduler.params.warmup_type: unknown value '{}'; use \"log\" or \"linear\"", cfg.warmup_type);
  DT_ENFORCE_GT(cfg.warmup_num_steps, int64_t{0}, ConfigError,
                "scheduler.params.warmup_num_steps must be a positive number of optimizer steps");
  return Warmup(cfg.warmup_num_steps, cfg.warmup_type == "log");
}

void check_total(const LrScheduleConfig& cfg) {
  DT_ENFORCE_GT(cfg.total_num_steps, int64_t{0}, ConfigError,
                "scheduler.params.total_num_steps must be set (> 0) for {}", cfg.type);
  if (cfg.total_num_steps < cfg.warmup_num_steps)
    log_warn("scheduler {}: total_num_steps {} is less than warmup_num_steps {}", cfg.type, cfg.total_num_steps,
             cfg.warmup_num_steps);
}

}  // namespace

// ----------------------------------------------------------------------------
std::unique_ptr<LrSchedule> lr_schedule_create(const LrScheduleConfig& cfg, float base_lr) {
  if (cfg.type.empty() || cfg.type == "constant") return std::make_unique<ConstantLr>(base_lr);
  const double max_lr = cfg.warmup_max_lr.value_or(base_lr);
  if (cfg.type == "WarmupLR") return std::make_unique<WarmupLr>(cfg.warmup_min_lr, max_lr, warmup_from(cfg), false, 0);
  if (cfg.type == "WarmupDecayLR") {
    Warmup w = warmup_from(cfg);
    check_total(cfg);
    return std::make_unique<WarmupLr>(cfg.warmup_min_lr, max_lr, w, true, cfg.total_num_steps);
  }
  if (cfg.type == "WarmupCosineLR") {
    Warmup w = warmup_from(cfg);
    check_total(cfg);
    return std::make_unique<WarmupCosineLr>(base_lr, cfg.warmup_min_ratio, cfg.cos_min_ratio, w, cfg.total_num_steps);
  }
  DT_THROW(ConfigError,
           "scheduler.type: unknown scheduler '{}'; use WarmupLR, WarmupDecayLR, WarmupCosineLR or leave the "
           "scheduler section out for a constant lr",
           cfg.type);
}

}  // namespace dtrain::train
