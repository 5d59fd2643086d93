// AdamW update loops. The per-step scalars are computed once in double and the
// element loop is branch-free so the compiler vectorises it (simd.h: AVX2 where the CPU
// has it); the compute-copy variant writes the bf16/fp16 copy in the same pass. Elements
// are independent, so the loops split across the ops thread pool (parallel.h) with
// results identical to serial. The gradient norm sums fixed blocks, so its result does
// not depend on the thread count either.
#include "ops/optim.h"

#include "core/check.h"
#include "ops/parallel.h"
#include "ops/simd.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dtrain::ops {

namespace {

// ----------------------------------------------------------------------------
// Scalars shared by every element of one step.
struct StepScalars {
  float decay_factor;  // 1 - lr*wd (torch: param.mul_(1 - lr * weight_decay))
  float b1, one_minus_b1, b2, one_minus_b2;
  float step_size;  // lr / (1 - b1^t)
  float sqrt_bc2;   // sqrt(1 - b2^t); divided, not multiplied, as torch does
  float eps;
  float grad_scale;
};

StepScalars step_scalars(const AdamWConfig& cfg, float lr, int64_t step, bool decay, float grad_scale) {
  DT_ENFORCE_GE(step, int64_t{1}, InternalError, "adamw_step: step is 1-based");
  DT_ENFORCE(cfg.beta1 >= 0.0f && cfg.beta1 < 1.0f && cfg.beta2 >= 0.0f && cfg.beta2 < 1.0f, ConfigError,
             "AdamW betas must be in [0, 1), got ({}, {})", cfg.beta1, cfg.beta2);
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), t);
  StepScalars s;
  s.decay_factor = decay ? static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay) : 1.0f;
  s.b1 = cfg.beta1;
  s.one_minus_b1 = 1.0f - cfg.beta1;
  s.b2 = cfg.beta2;
  s.one_minus_b2 = 1.0f - cfg.beta2;
  s.step_size = static_cast<float>(lr / bc1);
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  s.eps = cfg.eps;
  s.grad_scale = grad_scale;
  return s;
}

// The element update rounds every operation on its own, as kernels/adamw.cu does with
// __fmul_rn/__fadd_rn: g++ contracts a*b+c into an FMA in C++ by default wherever the
// target has one (DT_OPS_SIMD's x86-64-v3 clone does), which made the host's AdamW (the
// CPU device, ZeRO-Offload) differ from the GPU's in the last bit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

// One element; returns the new parameter value.
inline float update_one(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                        size_t i, const StepScalars& s) {
  const float gi = g[i] * s.grad_scale;
  const float mi = s.b1 * m[i] + s.one_minus_b1 * gi;
  const float vi = s.b2 * v[i] + s.one_minus_b2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float denom = std::sqrt(vi) / s.sqrt_bc2 + s.eps;
  const float pi = p[i] * s.decay_factor - s.step_size * mi / denom;
  p[i] = pi;
  return pi;
}

DT_OPS_SIMD void update_range(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                              size_t n, const StepScalars& s) {
  for (size_t i = 0; i < n; ++i) update_one(p, g, m, v, i, s);
}

DT_OPS_SIMD void update_range_bf16(float* __restrict p, const float* __restrict g, float* __restrict m,
                                   float* __restrict v, uint16_t* __restrict copy, size_t n, const StepScalars& s) {
  for (size_t i = 0; i < n; ++i) copy[i] = f32_to_bf16(update_one(p, g, m, v, i, s));
}

DT_OPS_SIMD void update_range_f16(float* __restrict p, const float* __restrict g, float* __restrict m,
                                  float* __restrict v, uint16_t* __restrict copy, size_t n, const StepScalars& s) {
  for (size_t i = 0; i < n; ++i) copy[i] = f32_to_f16(update_one(p, g, m, v, i, s));
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// Four double accumulators break the add dependency chain so the loop runs near memory speed.
DT_OPS_SIMD double norm_sq_range(const float* __restrict g, size_t n) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t k = 0; k < 4; ++k) {
      const double x = g[i + k];
      acc[k] += x * x;
    }
  }
  for (; i < n; ++i) {
    const double x = g[i];
    acc[0] += x * x;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Elements per block of the gradient norm: blocks are summed in order, whatever thread ran them.
constexpr size_t NORM_BLOCK = 1 << 14;

}  // namespace

// ----------------------------------------------------------------------------
void adamw_step(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                int64_t step, bool decay, float grad_scale) {
  const StepScalars s = step_scalars(cfg, lr, step, decay, grad_scale);
  parallel_for(n, n * 4, [&](size_t b, size_t e) { update_range(param + b, grad + b, m + b, v + b, e - b, s); });
}

void adamw_step_copy(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                     int64_t step, bool decay, float grad_scale, uint16_t* compute_copy, DType compute_dtype) {
  DT_ENFORCE(compute_dtype == DType::BF16 || compute_dtype == DType::F16, InternalError,
             "adamw_step_copy: the compute copy must be bf16 or fp16, got {}", dtype_name(compute_dtype));
  const StepScalars s = step_scalars(cfg, lr, step, decay, grad_scale);
  const bool bf16 = compute_dtype == DType::BF16;
  parallel_for(n, n * 4, [&](size_t b, size_t e) {
    if (bf16) update_range_bf16(param + b, grad + b, m + b, v + b, compute_copy + b, e - b, s);
    else update_range_f16(param + b, grad + b, m + b, v + b, compute_copy + b, e - b, s);
  });
}

double grad_norm_sq(const float* g, size_t n) {
  const size_t blocks = (n + NORM_BLOCK - 1) / NORM_BLOCK;
  if (blocks <= 1) return norm_sq_range(g, n);
  std::vector<double> part(blocks);
  parallel_for(blocks, n, [&](size_t b, size_t e) {
    for (size_t k = b; k < e; ++k)
      part[k] = norm_sq_range(g + k * NORM_BLOCK, std::min(n, (k + 1) * NORM_BLOCK) - k * NORM_BLOCK);
  });
  double sum = 0;
  for (double p : part) sum += p;
  return sum;
}

}  // namespace dtrain::ops
