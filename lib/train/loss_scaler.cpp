// LossScaler state machine and the branch-free inf/nan scan.
#include "train/loss_scaler.h"

#include "core/check.h"
#include "core/log.h"

#include <cmath>
#include <cstring>

namespace dtrain::train {

// ----------------------------------------------------------------------------
LossScaler::LossScaler(const LossScalerConfig& cfg) : cfg_(cfg), dynamic_(cfg.loss_scale <= 0.0f) {
  DT_ENFORCE(std::isfinite(cfg.loss_scale) && cfg.loss_scale >= 0.0f, ConfigError,
             "fp16.loss_scale must be 0 (dynamic) or a positive finite static scale, got {}", cfg.loss_scale);
  if (!dynamic_) {
    state_.scale = cfg.loss_scale;
    return;
  }
  DT_ENFORCE(cfg.initial_scale_power >= -126 && cfg.initial_scale_power <= 127, ConfigError,
             "fp16.initial_scale_power {} gives a scale outside fp32 range; typical values are 8..32",
             cfg.initial_scale_power);
  DT_ENFORCE_GT(cfg.loss_scale_window, int64_t{0}, ConfigError, "fp16.loss_scale_window must be positive");
  DT_ENFORCE_GT(cfg.hysteresis, 0, ConfigError, "fp16.hysteresis must be positive");
  DT_ENFORCE(std::isfinite(cfg.min_loss_scale) && cfg.min_loss_scale > 0.0f, ConfigError,
             "fp16.min_loss_scale must be positive, got {}", cfg.min_loss_scale);
  state_.scale = std::ldexp(1.0f, cfg.initial_scale_power);
  state_.cur_hysteresis = cfg.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++state_.cur_iter;
    if (overflow)
      log_debug("fp16 overflow at iteration {} with static loss scale {}; skipping step", state_.cur_iter - 1,
                state_.scale);
    return !overflow;
  }
  LossScalerState& s = state_;
  if (overflow) {
    if (cfg_.hysteresis == 1 || s.cur_hysteresis == 1) {
      if (s.scale == cfg_.min_loss_scale && cfg_.raise_error_at_min_scale)
        DT_THROW(TrainError,
                 "fp16 loss scale is at min_loss_scale={} and gradients still overflow (iteration {}): the model "
                 "produces inf/nan even at the smallest allowed scale. Lower the learning rate, enable gradient "
                 "clipping (gradient_clipping), check the data for bad samples, lower fp16.min_loss_scale, or train "
                 "in bf16 (bf16.enabled: true, fp16.enabled: false)",
                 cfg_.min_loss_scale, s.cur_iter);
      const float next = std::fmax(s.scale / 2.0f, cfg_.min_loss_scale);
      log_debug("fp16 overflow at iteration {}: skipping step, loss scale {} -> {}", s.cur_iter, s.scale, next);
      s.scale = next;
    } else {
      log_debug("fp16 overflow at iteration {}: skipping step, loss scale {} kept, hysteresis {} -> {}", s.cur_iter,
                s.scale, s.cur_hysteresis, s.cur_hysteresis - 1);
      --s.cur_hysteresis;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (cfg_.consecutive_hysteresis) s.cur_hysteresis = cfg_.hysteresis;
    const int64_t stable = s.cur_iter - s.last_overflow_iter - 1;
    if (stable > 0 && stable % cfg_.loss_scale_window == 0) {
      if (!cfg_.consecutive_hysteresis) s.cur_hysteresis = cfg_.hysteresis;
      s.scale *= 2.0f;
    }
  }
  ++s.cur_iter;
  return !overflow;
}

void LossScaler::set_state(const LossScalerState& s) {
  DT_ENFORCE(std::isfinite(s.scale) && s.scale > 0.0f, CheckpointError,
             "checkpointed loss scale {} is not a positive finite number", s.scale);
  DT_ENFORCE(s.cur_iter >= 0 && s.last_overflow_iter >= -1 && s.last_overflow_iter < s.cur_iter, CheckpointError,
             "checkpointed loss scaler iterations are inconsistent (cur_iter {}, last_overflow_iter {})", s.cur_iter,
             s.last_overflow_iter);
  if (dynamic_)
    DT_ENFORCE(s.cur_hysteresis >= 1 && s.cur_hysteresis <= cfg_.hysteresis, CheckpointError,
               "checkpointed cur_hysteresis {} is outside 1..fp16.hysteresis={}", s.cur_hysteresis, cfg_.hysteresis);
  state_ = s;
  if (!dynamic_ && s.scale != cfg_.loss_scale) {
    log_warn("checkpoint holds loss scale {} but the config sets static fp16.loss_scale {}; using the config", s.scale,
             cfg_.loss_scale);
    state_.scale = cfg_.loss_scale;
  }
}

// ----------------------------------------------------------------------------
// OR of "exponent all ones" over the bit patterns: no branches, so it vectorises, and it
// is exact regardless of -ffast-math.
bool has_inf_or_nan(const float* x, size_t n) {
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    uint32_t found = 0;
    for (size_t i = b; i < e; ++i) {
      uint32_t u;
      std::memcpy(&u, x + i, 4);
      found |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    if (found) return true;
  }
  return false;
}

}  // namespace dtrain::train
