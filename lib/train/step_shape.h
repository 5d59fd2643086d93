// What a report says of the step it timed (`dtrain bench train`) or planned (`--plan`):
// the config, the model and the batch (StepShape), and the model FLOPs per token both
// reports count.
#pragma once

#include "model/config.h"
#include "train/step_setup.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace dtrain::train {

struct StepShape {
  std::string config, arch, dtype;
  int64_t params = 0, trainable_params = 0;  ///< of the model built (the caller's)
  int lora_rank = 0;                         ///< 0 = full fine-tune
  int n_layer = 0, d_model = 0, micro_batch = 0, seq_len = 0, grad_accum = 0;
};
/// The shape of the setup s read from `config` (the parameter counts left to the caller).
void step_shape_set(StepShape& into, const std::string& config, const StepSetup& s);
/// Its fields in both reports' JSON, with tokens_per_step.
nlohmann::json step_shape_json(const StepShape& r);

/// Model FLOPs per trained token: 6 N + 12 L T d_model for full training (N = base
/// parameters); under LoRA 4 N + 12 L T d_model (no base weight gradients).
double model_flops_per_token(const model::ModelConfig& cfg, int64_t params, int seq_len, bool lora);
/// That formula with its figures, as the reports print it: "6N + 12*L*T*d_model = 6*N + 12*L*T*d".
std::string model_flops_formula(int64_t params, int n_layer, int seq_len, int d_model, bool lora);

}  // namespace dtrain::train
