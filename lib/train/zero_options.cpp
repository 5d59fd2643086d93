// zero_options_from() and loss_scaler_config_from(): the ZeRO engine's and the fp16 loss
// scaler's options from a training config.
#include "core/check.h"
#include "train/zero_engine.h"
#include "train/loss_scaler.h"

#include <algorithm>
#include <string>

namespace dtrain::train {

ZeroOptions zero_options_from(const config::TrainConfig& cfg) {
  const auto& z = cfg.zero;
  DT_ENFORCE(config::zero_stage_valid(z.stage), ConfigError, "{}: zero_optimization.stage {} is not 0, 1, 2 or 3",
             cfg.source, z.stage);
  auto size = [&](int64_t v, const char* key) {
    DT_ENFORCE_GT(v, 0, ConfigError, "{}: zero_optimization.{} must be positive", cfg.source, key);
    return static_cast<size_t>(v);
  };
  ZeroOptions o;
  o.stage = static_cast<int>(z.stage);
  o.reduce_bucket_size = size(z.reduce_bucket_size, "reduce_bucket_size");
  o.allgather_bucket_size = size(z.allgather_bucket_size, "allgather_bucket_size");
  o.overlap_comm = z.overlap_comm;
  o.prefetch_bucket_size = static_cast<size_t>(std::max<int64_t>(0, z.stage3_prefetch_bucket_size));
  o.param_persistence_threshold = static_cast<size_t>(std::max<int64_t>(0, z.stage3_param_persistence_threshold));
  o.max_live_parameters = size(z.stage3_max_live_parameters, "stage3_max_live_parameters");
  o.adamw.lr = static_cast<float>(cfg.optimizer.lr);
  o.adamw.beta1 = static_cast<float>(cfg.optimizer.betas[0]);
  o.adamw.beta2 = static_cast<float>(cfg.optimizer.betas[1]);
  o.adamw.eps = static_cast<float>(cfg.optimizer.eps);
  o.adamw.weight_decay = static_cast<float>(cfg.optimizer.weight_decay);
  DT_ENFORCE(!(cfg.fp16.enabled && cfg.bf16.enabled), ConfigError, "{}: fp16.enabled and bf16.enabled are exclusive",
             cfg.source);
  o.compute_dtype = cfg.bf16.enabled ? DType::BF16 : cfg.fp16.enabled ? DType::F16 : DType::F32;
  o.gradient_clipping = static_cast<float>(cfg.gradient_clipping);
  const std::string& c = cfg.communication.compression;
  if (c == "powersgd") {
    o.powersgd_rank = static_cast<int>(cfg.communication.powersgd_rank);
    o.powersgd_start_step = cfg.communication.powersgd_start_step;
    o.powersgd_error_feedback = cfg.communication.powersgd_error_feedback;
  }
  if (c == "topk") o.topk_ratio = cfg.communication.topk_ratio;
  o.grad_wire = c == "bf16" ? DType::BF16 : c == "fp16" ? DType::F16 : DType::F32;
  o.offload_optimizer = z.offload_optimizer_device == "cpu";
  o.offload_param = z.offload_param_device == "cpu";
  o.offload_pin_memory = z.offload_optimizer_pin_memory;
  o.offload_param_pin_memory = z.offload_param_pin_memory;
  return o;
}

LossScalerConfig loss_scaler_config_from(const config::Fp16Config& f) {
  LossScalerConfig c;
  c.loss_scale = static_cast<float>(f.loss_scale);
  c.initial_scale_power = static_cast<int>(f.initial_scale_power);
  c.loss_scale_window = f.loss_scale_window;
  c.hysteresis = static_cast<int>(f.hysteresis);
  c.consecutive_hysteresis = f.consecutive_hysteresis;
  c.min_loss_scale = static_cast<float>(f.min_loss_scale);
  return c;
}

}  // namespace dtrain::train
