// LoRA: PEFT-compatible names and config validation.
#include "model/lora.h"

#include "core/check.h"
#include "device/device.h"

#include <algorithm>

namespace dtrain::model {

const std::vector<std::string>& lora_module_names(ModelConfig::Arch arch) {
  static const std::vector<std::string> gpt2 = {"c_attn", "c_proj", "c_fc"};
  static const std::vector<std::string> llama = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return arch == ModelConfig::Arch::GPT2 ? gpt2 : llama;
}

void LoraConfig::validate(const ModelConfig& cfg) const {
  DT_ENFORCE_GT(rank, 0, ConfigError, "lora rank");
  DT_ENFORCE(dropout >= 0.0f && dropout < 1.0f, ConfigError, "lora dropout {} must be in [0, 1)", dropout);
  DT_ENFORCE(!targets.empty(), ConfigError, "lora target_modules is empty: name at least one of {}",
             fmt::join(lora_module_names(cfg.arch), ", "));
  const auto& known = lora_module_names(cfg.arch);
  for (const auto& t : targets)
    DT_ENFORCE(std::find(known.begin(), known.end(), t) != known.end(), ConfigError,
               "lora target module '{}' does not exist in a {} model; choose from {}", t, arch_name(cfg.arch),
               fmt::join(known, ", "));
}

std::vector<BufferLayout> lora_layout_build(const ModelConfig& cfg, const LoraConfig& lcfg) {
  const int64_t r = lcfg.rank;
  const std::vector<LayerProjection> projs = layer_projections(cfg);
  std::vector<BufferLayout> layouts;
  for (int l = 0; l < cfg.n_layer; ++l) {
    BufferLayout b{"lora.layers." + std::to_string(l), l, {}, 0};
    for (const LayerProjection& p : projs) {
      if (std::find(lcfg.targets.begin(), lcfg.targets.end(), p.short_name) == lcfg.targets.end()) continue;
      const std::string path = layer_prefix(cfg, l) + "." + p.module;
      for (bool is_b : {false, true}) {
        TensorSpec t{lora_tensor_name(path, is_b), b.size,
                     is_b ? std::vector<int64_t>{p.out, r} : std::vector<int64_t>{r, p.in}, true, false};
        b.size += t.numel();
        b.tensors.push_back(std::move(t));
      }
    }
    layouts.push_back(std::move(b));
  }
  return layouts;
}

void lora_merge_weight(device::Device& dev, void* w, const void* a, const void* b, int out, int in,
                       const LoraConfig& cfg) {
  dev.gemm(false, false, out, in, cfg.rank, cfg.scale(), b, a, 1.0f, w, DType::F32, DType::F32);
}

std::string lora_tensor_name(const std::string& module_path, bool is_b) {
  return "base_model.model." + module_path + (is_b ? ".lora_B.weight" : ".lora_A.weight");
}

}  // namespace dtrain::model
