// LoRA math through ops::gemm, PEFT-compatible names, config validation.
#include "model/lora.h"

#include "core/check.h"
#include "core/rng.h"
#include "ops/linear.h"

#include <algorithm>

namespace dtrain::model {

const std::vector<std::string>& lora_module_names(ModelConfig::Arch arch) {
  static const std::vector<std::string> gpt2 = {"c_attn", "c_proj", "c_fc"};
  static const std::vector<std::string> llama = {"q_proj", "k_proj", "v_proj", "o_proj",
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

std::string lora_tensor_name(const std::string& module_path, bool is_b) {
  return "base_model.model." + module_path + (is_b ? ".lora_B.weight" : ".lora_A.weight");
}

void lora_forward(float* y, const float* x, const float* A, const float* B, int N, int in,
                  int out, int r, float scale, float dropout, uint64_t mask_seed, LoraActs& acts) {
  const size_t nx = static_cast<size_t>(N) * in;
  const float* xd = x;
  if (dropout > 0.0f) {
    acts.xd.resize(nx);
    acts.keep.resize(nx);
    Rng rng(mask_seed);
    const float inv = 1.0f / (1.0f - dropout);
    for (size_t i = 0; i < nx; ++i) {
      acts.keep[i] = rng.uniform() >= dropout;
      acts.xd[i] = acts.keep[i] ? x[i] * inv : 0.0f;
    }
    xd = acts.xd.data();
  }
  acts.h.resize(static_cast<size_t>(N) * r);
  ops::gemm(false, true, N, r, in, 1.0f, xd, A, 0.0f, acts.h.data());
  ops::gemm(false, true, N, out, r, scale, acts.h.data(), B, 1.0f, y);
}

void lora_backward(float* dx, float* dA, float* dB, const float* dy, const float* x, const float* A,
                   const float* B, int N, int in, int out, int r, float scale, float dropout,
                   const LoraActs& acts) {
  const float* xd = dropout > 0.0f ? acts.xd.data() : x;
  ops::gemm(true, false, out, r, N, scale, dy, acts.h.data(), 1.0f, dB);
  std::vector<float> dh(static_cast<size_t>(N) * r);
  ops::gemm(false, false, N, r, out, scale, dy, B, 0.0f, dh.data());
  ops::gemm(true, false, r, in, N, 1.0f, dh.data(), xd, 1.0f, dA);
  if (!dx) return;
  if (dropout == 0.0f) {
    ops::gemm(false, false, N, in, r, 1.0f, dh.data(), A, 1.0f, dx);
    return;
  }
  const size_t nx = static_cast<size_t>(N) * in;
  std::vector<float> dxd(nx);
  ops::gemm(false, false, N, in, r, 1.0f, dh.data(), A, 0.0f, dxd.data());
  const float inv = 1.0f / (1.0f - dropout);
  for (size_t i = 0; i < nx; ++i)
    if (acts.keep[i]) dx[i] += dxd[i] * inv;
}

void lora_merge_into(float* W, const float* A, const float* B, int in, int out, int r, float scale) {
  ops::gemm(false, false, out, in, r, scale, B, A, 1.0f, W);
}

}  // namespace dtrain::model
