// LoRA adapters (PEFT semantics): for a projection y = x W^T, adds
// scale * dropout(x) A^T B^T with A [r, in] (kaiming-uniform, bound 1/sqrt(in)), B [out, r]
// (zeros), scale = alpha / r. The Model owns the adapters and their math on its device
// (Model::lora_enable); this header has the config and the PEFT names.
#pragma once

#include "model/config.h"
#include "model/layout.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::device {
class Device;
}

namespace dtrain::model {

struct LoraConfig {
  int rank = 8;
  float alpha = 16.0f;
  float dropout = 0.0f;  ///< on the adapter input path only; 0 is exact (no mask drawn)
  /// Module names adapted, PEFT "target_modules" style: Llama q_proj k_proj v_proj o_proj
  /// gate_proj up_proj down_proj; GPT-2 c_attn c_proj c_fc (c_proj = attn and mlp).
  std::vector<std::string> targets;
  uint64_t seed = 0;  ///< adapter init and dropout masks
  float scale() const { return alpha / static_cast<float>(rank); }
  /// Throws ConfigError for rank <= 0, dropout outside [0, 1), an empty or unknown target.
  void validate(const ModelConfig& cfg) const;
};

/// The projection names an architecture offers to LoRA, in layer order.
const std::vector<std::string>& lora_module_names(ModelConfig::Arch arch);

/// The adapter buffers of cfg under lcfg (what Model::lora_enable allocates): one per
/// layer, "lora.layers.<l>", holding for each projection a target names, in the layer's
/// order, lora_A [r, in] then lora_B [out, r] (PEFT names).
std::vector<BufferLayout> lora_layout_build(const ModelConfig& cfg, const LoraConfig& lcfg);

/// Folds one adapter into its weight as PEFT's merge does: W[out, in] += scale * B[out, r]
/// @ A[r, in], fp32 arrays on dev (Model::lora_merge and the merged Hugging Face export).
void lora_merge_weight(device::Device& dev, void* w, const void* a, const void* b, int out, int in,
                       const LoraConfig& cfg);

/// PEFT tensor name: "base_model.model." + module path + ".lora_A.weight" / ".lora_B.weight".
std::string lora_tensor_name(const std::string& module_path, bool is_b);

}  // namespace dtrain::model
