// LoRA adapters (PEFT semantics): for a projection y = x W^T, adds
// scale * dropout(x) A^T B^T with A [r, in] (kaiming-uniform, bound 1/sqrt(in)), B [out, r]
// (zeros), scale = alpha / r. The Model owns the adapters (Model::lora_enable); this
// header has the config, the PEFT names and the raw math. Backward ACCUMULATES (+=) into
// dA, dB and dx.
#pragma once

#include "model/config.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::model {

struct LoraConfig {
  int rank = 8;
  float alpha = 16.0f;
  float dropout = 0.0f;  ///< on the adapter input path only; 0 is exact (no mask drawn)
  /// Module names adapted, PEFT "target_modules" style: Llama q_proj k_proj v_proj o_proj
  /// gate_proj up_proj down_proj; GPT-2 c_attn c_proj c_fc (c_proj = attn and mlp).
  std::vector<std::string> targets;
  uint64_t seed = 0;     ///< adapter init and dropout masks
  float scale() const { return alpha / static_cast<float>(rank); }
  /// Throws ConfigError for rank <= 0, dropout outside [0, 1), an empty or unknown target.
  void validate(const ModelConfig& cfg) const;
};

/// The projection names an architecture offers to LoRA, in layer order.
const std::vector<std::string>& lora_module_names(ModelConfig::Arch arch);

/// PEFT tensor name: "base_model.model." + module path + ".lora_A.weight" / ".lora_B.weight".
std::string lora_tensor_name(const std::string& module_path, bool is_b);

/// Per-projection scratch the model keeps for backward.
struct LoraActs {
  std::vector<float> xd;       ///< dropout(x) [N, in] (empty when dropout == 0: x is used)
  std::vector<uint8_t> keep;   ///< dropout mask [N, in]
  std::vector<float> h;        ///< xd A^T [N, r]
};

/// y += scale * dropout(x) A^T B^T. mask_seed fixes the dropout mask (recomputation
/// passes the same seed and gets the same mask).
void lora_forward(float* y, const float* x, const float* A, const float* B, int N, int in,
                  int out, int r, float scale, float dropout, uint64_t mask_seed, LoraActs& acts);

/// dB += scale dy^T h; dA += (scale dy B)^T xd; dx += dropout'(scale dy B A) (dx may be null).
void lora_backward(float* dx, float* dA, float* dB, const float* dy, const float* x, const float* A,
                   const float* B, int N, int in, int out, int r, float scale, float dropout,
                   const LoraActs& acts);

/// W[out,in] += scale * B @ A.
void lora_merge_into(float* W, const float* A, const float* B, int in, int out, int r, float scale);

}  // namespace dtrain::model
