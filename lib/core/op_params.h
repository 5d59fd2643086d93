// The plain parameter types that cross the device layer's op table: AdamW's
// hyper-parameters and multi-tensor entry, the RoPE frequencies. Data only, in core (the
// module both wings stand on): lib/ops (the CPU implementation) and kernels/ compute with
// them, the device interface names them (device/op_types.h), one definition for all and
// no ops header under the device interface. lib/ops names them ops::AdamWConfig etc.
#pragma once

#include <cstddef>

namespace dtrain {

/// Hyper-parameters with torch.optim.AdamW's defaults except weight_decay (DeepSpeed's
/// AdamW default 0.01). `lr` is the base lr; the per-step lr is passed to adamw_step.
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

/// One tensor of a multi-tensor AdamW update (Device::adamw_multi, kernels::adamw_step_multi):
/// n elements of param, grad, m and v, the compute copy (null: none) and whether its
/// weights decay.
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  void* copy = nullptr;
  size_t n = 0;
  bool decay = false;
};

/// The RoPE frequencies (HF's rope_parameters): inv_freq[i] = theta^(-2i/HD), then
/// LINEAR divides them by factor (positions / factor) and LLAMA3 applies
/// _compute_llama3_parameters (low frequencies / factor, high ones kept, a smooth blend
/// between, by wavelength against original_max_position_embeddings). ops/rope.h's
/// rope_inv_freq computes them.
struct RopeFreq {
  enum Type { DEFAULT = 0, LINEAR = 1, LLAMA3 = 2 };
  float theta = 10000.0f;
  Type type = DEFAULT;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;      ///< llama3
  float high_freq_factor = 4.0f;     ///< llama3
  int original_max_position = 8192;  ///< llama3: original_max_position_embeddings
};

}  // namespace dtrain
