// AdamW kernel: float4 loads of param/grad/m/v (scalar fallback when misaligned), the
// element update written exactly as train/adamw.cpp's update_one so results agree to
// rounding (nvcc may contract a*b+c into FMA where the host does not).
#include "kernels/adamw.cuh"

#include "kernels/common.cuh"
#include "ops/step_scale.h"

#include <cmath>
#include <type_traits>

namespace dtrain::kernels {

namespace {
using namespace detail;

struct StepScalars {
  float decay_factor, b1, one_minus_b1, b2, one_minus_b2, step_size, sqrt_bc2, eps, grad_scale;
  bool decay;
};

StepScalars step_scalars(const ops::AdamWConfig& cfg, float lr, int64_t step, bool decay, float grad_scale) {
  DTK_REQUIRE(step >= 1, InternalError, "adamw_step: step is 1-based");
  DTK_REQUIRE(cfg.beta1 >= 0.0f && cfg.beta1 < 1.0f && cfg.beta2 >= 0.0f && cfg.beta2 < 1.0f, ConfigError,
              "AdamW betas must be in [0, 1)");
  float values[3];
  ops::adamw_step_values(values, lr, cfg.weight_decay, cfg.beta1, cfg.beta2, step);
  StepScalars s;
  s.decay_factor = decay ? values[0] : 1.0f;
  s.decay = decay;
  s.b1 = cfg.beta1;
  s.one_minus_b1 = 1.0f - cfg.beta1;
  s.b2 = cfg.beta2;
  s.one_minus_b2 = 1.0f - cfg.beta2;
  s.step_size = values[1];
  s.sqrt_bc2 = values[2];
  s.eps = cfg.eps;
  s.grad_scale = grad_scale;
  return s;
}

__device__ __forceinline__ float update_one(float& p, float g, float& m, float& v, const StepScalars& s) {
  const float gi = g * s.grad_scale;
  const float mi = s.b1 * m + s.one_minus_b1 * gi;
  const float vi = s.b2 * v + s.one_minus_b2 * gi * gi;
  m = mi;
  v = vi;
  const float denom = sqrtf(vi) / s.sqrt_bc2 + s.eps;
  p = p * s.decay_factor - s.step_size * mi / denom;
  return p;
}

// C = float means "no compute copy" (copy is null).
template <typename C, int V>
__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, C* __restrict__ copy, size_t n, StepScalars s,
                             const float* __restrict__ dev_scale) {
  constexpr bool HAS_COPY = !std::is_same_v<C, float>;
  if (dev_scale != nullptr) {
    if (dev_scale[1] != 0.0f) return;  // the step overflowed: skipped
    s.grad_scale = dev_scale[0];
    s.decay_factor = s.decay ? dev_scale[2] : 1.0f;  // the step's lr values, uploaded before the step
    s.step_size = dev_scale[3];
    s.sqrt_bc2 = dev_scale[4];
  }
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t npack = n / V;
  for (size_t q = tid; q < npack; q += stride) {
    const size_t i = q * V;
    Pack<float, V> p = pack_load<float, V>(param + i), g = pack_load<float, V>(grad + i);
    Pack<float, V> mm = pack_load<float, V>(m + i), vv = pack_load<float, V>(v + i);
    Pack<C, V> c;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float pj = update_one(p.v[j], g.v[j], mm.v[j], vv.v[j], s);
      if constexpr (HAS_COPY) c.v[j] = from_f32<C>(pj);
    }
    pack_store<float, V>(param + i, p);
    pack_store<float, V>(m + i, mm);
    pack_store<float, V>(v + i, vv);
    if constexpr (HAS_COPY) pack_store<C, V>(copy + i, c);
  }
  for (size_t i = npack * V + tid; i < n; i += stride) {
    float p = param[i], mi = m[i], vi = v[i];
    const float pj = update_one(p, grad[i], mi, vi, s);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
    if constexpr (HAS_COPY) copy[i] = from_f32<C>(pj);
  }
}

template <typename C>
void adamw_launch(float* param, const float* grad, float* m, float* v, C* copy, size_t n, const StepScalars& s,
                  const float* dev_scale, cudaStream_t stream) {
  constexpr int V = 4;
  const bool vec = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v) &&
                   (copy == nullptr || reinterpret_cast<uintptr_t>(copy) % (V * sizeof(C)) == 0);
  if (vec) {
    DTK_LAUNCH(grid_for(n / V + 1, 256), 256, 0, stream, adamw_kernel<C, V>)(param, grad, m, v, copy, n, s, dev_scale);
  } else {
    DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, adamw_kernel<C, 1>)(param, grad, m, v, copy, n, s, dev_scale);
  }
  DT_CUDA_LAUNCH_CHECK();
}
}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg, float lr,
                int64_t step, bool decay, float grad_scale, cudaStream_t stream, const float* dev_scale) {
  const StepScalars s = step_scalars(cfg, lr, step, decay, grad_scale);
  if (n == 0) return;
  adamw_launch<float>(param, grad, m, v, nullptr, n, s, dev_scale, stream);
}

void adamw_step_copy(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg,
                     float lr, int64_t step, bool decay, float grad_scale, void* compute_copy, DType compute_dtype,
                     cudaStream_t stream, const float* dev_scale) {
  DTK_REQUIRE(compute_dtype == DType::BF16 || compute_dtype == DType::F16, InternalError,
              "adamw_step_copy: the compute copy must be bf16 or fp16");
  const StepScalars s = step_scalars(cfg, lr, step, decay, grad_scale);
  if (n == 0) return;
  if (compute_dtype == DType::BF16) {
    adamw_launch<bf16>(param, grad, m, v, static_cast<bf16*>(compute_copy), n, s, dev_scale, stream);
  } else {
    adamw_launch<fp16>(param, grad, m, v, static_cast<fp16*>(compute_copy), n, s, dev_scale, stream);
  }
}

}  // namespace dtrain::kernels
