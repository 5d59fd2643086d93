// The optimizer step's agreement values, written once for the host (CPU device, lib/train)
// and the device (kernels/reduce.cu): the gradient sum of squares packed for an fp32 SUM
// across ranks, and the AdamW gradient scale (clip coefficient / loss scale) with the
// overflow skip flag, so a CUDA step decides clipping and skipping without a read-back.
#pragma once

#include "core/host_device.h"

#include <cmath>

namespace dtrain::ops {

/// Values are finite when x - x is 0 (inf - inf and NaN - NaN are NaN).
DT_HOST_DEVICE inline bool step_finite(double x) { return x - x == 0.0; }

/// A sum of squares as an fp32 pair (hi + lo keeps ~double precision through an fp32
/// SUM) and an overflow flag (1 when sq is inf/NaN; the pair is then 0): red[0..2].
DT_HOST_DEVICE inline void norm_sq_pack(float* red, double sq) {
  const bool ok = step_finite(sq);
  const float hi = ok ? static_cast<float>(sq) : 0.0f;
  red[0] = hi;
  red[1] = ok ? static_cast<float>(sq - static_cast<double>(hi)) : 0.0f;
  red[2] = ok ? 0.0f : 1.0f;
}

/// The summed pair back as a double; +inf when any rank overflowed.
DT_HOST_DEVICE inline double norm_sq_unpack(const float* red) {
  return red[2] != 0.0f ? static_cast<double>(INFINITY) : static_cast<double>(red[0]) + static_cast<double>(red[1]);
}

/// The clip coefficient of global-norm clipping: max_norm / (norm + 1e-6) below 1, else
/// 1 (also when clipping is off or the norm is inf/NaN).
DT_HOST_DEVICE inline float clip_coefficient(double total_norm, float max_norm) {
  if (!(max_norm > 0.0f) || !step_finite(total_norm)) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (total_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

/// From the agreed sum of squares of gradients that hold loss_scale * the true gradient:
/// out[0] = the AdamW gradient scale (clip coefficient of the unscaled norm / loss_scale),
/// out[1] = 1 when the step is skipped (inf/NaN), else 0.
DT_HOST_DEVICE inline void step_scale(float* out, double sq, float loss_scale, float max_norm) {
  const double norm = sqrt(sq) / static_cast<double>(loss_scale);
  out[0] = clip_coefficient(norm, max_norm) / loss_scale;
  out[1] = step_finite(sq) ? 0.0f : 1.0f;
}

/// The cross-entropy backward's per-target gradient scale: factor / count, count being the
/// unmasked targets the loss is averaged over (the step's global count: the trainer keeps
/// it in device memory, summed over the ranks there), 0 when there are none.
DT_HOST_DEVICE inline float ce_backward_scale(float factor, float count) {
  return count > 0.0f ? factor / count : 0.0f;
}

/// A step's loss sum over its unmasked targets: each micro-batch's mean loss times its
/// unmasked-target count, summed in double (a micro-batch without targets adds nothing).
DT_HOST_DEVICE inline double step_loss_sum(const float* means, const float* counts, int n) {
  double sum = 0.0;
  for (int a = 0; a < n; ++a)
    if (counts[a] > 0.0f) sum += static_cast<double>(means[a]) * static_cast<double>(counts[a]);
  return sum;
}

/// AdamW's per-step values that depend on the scheduled lr and the 1-based step, as
/// float from double: out[0] = 1 - lr * weight_decay (the decay factor of decayed
/// tensors), out[1] = lr / (1 - beta1^step), out[2] = sqrt(1 - beta2^step). Host only:
/// a CUDA step reads them from device memory (uploaded before the step).
inline void adamw_step_values(float* out, float lr, float weight_decay, float beta1, float beta2, long long step) {
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  out[0] = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  out[1] = static_cast<float>(lr / bc1);
  out[2] = static_cast<float>(std::sqrt(bc2));
}

}  // namespace dtrain::ops
