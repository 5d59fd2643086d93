// StepShape: what a report says of its step; the model FLOPs per token.
#include "train/step_shape.h"

#include "core/dtype.h"
#include "model/config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dtrain::train {

void step_shape_set(StepShape& into, const std::string& config, const StepSetup& s) {
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

double model_flops_per_token(const model::ModelConfig& cfg, int64_t params, int seq_len, bool lora) {
  const double attn = 12.0 * cfg.n_layer * static_cast<double>(seq_len) * cfg.d_model;
  return (lora ? 4.0 : 6.0) * static_cast<double>(params) + attn;
}

std::string model_flops_formula(int64_t params, int n_layer, int seq_len, int d_model, bool lora) {
  return fmt::format("{} + 12*L*T*d_model = {}*{} + 12*{}*{}*{}", lora ? "4N" : "6N", lora ? 4 : 6, params, n_layer,
                     seq_len, d_model);
}

}  // namespace dtrain::train
