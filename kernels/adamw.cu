// AdamW kernels: float4 loads of param/grad/m/v (scalar fallback when misaligned), the
// element update written as ops/optim.cpp's update_one, each operation rounded on its
// own (no FMA contraction), so every kernel gives the same bits and the CPU's agree to its
// own contraction. One tensor per launch, or many through a table of tensors.
#include "kernels/adamw.cuh"

#include "kernels/common.cuh"
#include "ops/step_scale.h"

#include <cmath>
#include <type_traits>
#include <vector>

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

// Every operation rounded on its own (the _rn intrinsics are never fused into an FMA),
// in ops/optim.cpp's order: the same bits as the CPU's update and in every kernel that
// inlines it. Left to nvcc, the per-tensor and the table kernel contracted a*b+c
// differently, and an H200 saw their results differ in the last bit.
__device__ __forceinline__ float update_one(float& p, float g, float& m, float& v, const StepScalars& s) {
  const float gi = __fmul_rn(g, s.grad_scale);
  const float mi = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(s.one_minus_b1, gi));
  const float vi = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(s.one_minus_b2, gi), gi));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.sqrt_bc2), s.eps);
  p = __fsub_rn(__fmul_rn(p, s.decay_factor), __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
  return p;
}

// Elements [i, i + V) with vector loads and stores, and element i alone: the per-tensor
// and the table kernel share these (C = float: no compute copy).
template <typename C, int V>
__device__ __forceinline__ void update_pack(float* __restrict__ param, const float* __restrict__ grad,
                                            float* __restrict__ m, float* __restrict__ v, C* __restrict__ copy,
                                            size_t i, const StepScalars& s) {
  constexpr bool HAS_COPY = !std::is_same_v<C, float>;
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

template <typename C>
__device__ __forceinline__ void update_scalar(float* __restrict__ param, const float* __restrict__ grad,
                                              float* __restrict__ m, float* __restrict__ v, C* __restrict__ copy,
                                              size_t i, const StepScalars& s) {
  float p = param[i], mi = m[i], vi = v[i];
  const float pj = update_one(p, grad[i], mi, vi, s);
  param[i] = p;
  m[i] = mi;
  v[i] = vi;
  if constexpr (!std::is_same_v<C, float>) copy[i] = from_f32<C>(pj);
}

// C = float means "no compute copy" (copy is null).
template <typename C, int V>
__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, C* __restrict__ copy, size_t n, StepScalars s,
                             const float* __restrict__ dev_scale) {
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
  for (size_t q = tid; q < npack; q += stride) update_pack<C, V>(param, grad, m, v, copy, q * V, s);
  for (size_t i = npack * V + tid; i < n; i += stride) update_scalar<C>(param, grad, m, v, copy, i, s);
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
// ----------------------------------------------------------------------------
// Many tensors per launch: the table rides in the kernel's parameters (no upload, and a
// recorded graph keeps it by value). Block b updates chunk b - first[t] of the tensor t
// whose block range holds b.
constexpr int MULTI_THREADS = 256;
constexpr size_t MULTI_CHUNK = 4096;  // elements per block: 4 packs of 4 per thread

struct AdamWTable {
  float* param[ADAMW_MULTI_MAX];
  const float* grad[ADAMW_MULTI_MAX];
  float* m[ADAMW_MULTI_MAX];
  float* v[ADAMW_MULTI_MAX];
  void* copy[ADAMW_MULTI_MAX];
  size_t n[ADAMW_MULTI_MAX];
  unsigned first[ADAMW_MULTI_MAX + 1];  // first[count] = the grid's blocks
  unsigned char decay[ADAMW_MULTI_MAX];
  unsigned char vec[ADAMW_MULTI_MAX];  // every pointer 16-byte aligned (the copy: 4 elements)
  int count;
};
static_assert(sizeof(AdamWTable) + sizeof(StepScalars) + sizeof(void*) <= 4000, "kernel parameters above 4 KB");

// s.decay_factor holds the decaying tensors' factor; each tensor applies it or 1.
template <typename C>
__global__ void __launch_bounds__(MULTI_THREADS)
    adamw_multi_kernel(const AdamWTable table, StepScalars s, const float* __restrict__ dev_scale) {
  constexpr int V = 4;
  if (dev_scale != nullptr) {
    if (dev_scale[1] != 0.0f) return;  // the step overflowed: skipped
    s.grad_scale = dev_scale[0];
    s.decay_factor = dev_scale[2];
    s.step_size = dev_scale[3];
    s.sqrt_bc2 = dev_scale[4];
  }
  const unsigned b = blockIdx.x;
  int t = 0;
  while (t + 1 < table.count && table.first[t + 1] <= b) ++t;
  if (!table.decay[t]) s.decay_factor = 1.0f;
  float* const param = table.param[t];
  const float* const grad = table.grad[t];
  float* const m = table.m[t];
  float* const v = table.v[t];
  C* const copy = static_cast<C*>(table.copy[t]);
  const size_t lo = static_cast<size_t>(b - table.first[t]) * MULTI_CHUNK;
  const size_t hi = lo + MULTI_CHUNK < table.n[t] ? lo + MULTI_CHUNK : table.n[t];
  size_t tail = lo;
  if (table.vec[t]) {
    const size_t npack = (hi - lo) / V;
    for (size_t q = threadIdx.x; q < npack; q += blockDim.x) update_pack<C, V>(param, grad, m, v, copy, lo + q * V, s);
    tail = lo + npack * V;
  }
  for (size_t i = tail + threadIdx.x; i < hi; i += blockDim.x) {
    update_scalar<C>(param, grad, m, v, copy, i, s);
  }
}

// Launches the tensors (all with a copy of C, or all without: C = float) in tables of
// ADAMW_MULTI_MAX.
template <typename C>
void adamw_multi_launch(const ops::AdamWTensor* const* list, size_t count, const StepScalars& s, const float* dev_scale,
                        cudaStream_t stream) {
  AdamWTable table{};
  size_t blocks = 0;
  auto flush = [&] {
    if (table.count == 0) return;
    table.first[table.count] = static_cast<unsigned>(blocks);
    DTK_LAUNCH(static_cast<unsigned>(blocks), MULTI_THREADS, 0, stream, adamw_multi_kernel<C>)(table, s, dev_scale);
    DT_CUDA_LAUNCH_CHECK();
    table = AdamWTable{};
    blocks = 0;
  };
  constexpr size_t MAX_BLOCKS = 0x7fffffffu;  // gridDim.x
  for (size_t k = 0; k < count; ++k) {
    const ops::AdamWTensor& x = *list[k];
    const size_t nb = (x.n + MULTI_CHUNK - 1) / MULTI_CHUNK;
    DTK_REQUIRE(nb <= MAX_BLOCKS, UsageError, "adamw_step_multi: a tensor above 2^31 chunks of 4096 elements");
    if (table.count == ADAMW_MULTI_MAX || blocks + nb > MAX_BLOCKS) flush();
    const int t = table.count++;
    table.param[t] = x.param;
    table.grad[t] = x.grad;
    table.m[t] = x.m;
    table.v[t] = x.v;
    table.copy[t] = x.copy;
    table.n[t] = x.n;
    table.first[t] = static_cast<unsigned>(blocks);
    table.decay[t] = x.decay ? 1 : 0;
    table.vec[t] = aligned16(x.param) && aligned16(x.grad) && aligned16(x.m) && aligned16(x.v) &&
                   (x.copy == nullptr || reinterpret_cast<uintptr_t>(x.copy) % (4 * sizeof(C)) == 0);
    blocks += nb;
  }
  flush();
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

void adamw_step_multi(const ops::AdamWTensor* tensors, size_t count, const ops::AdamWConfig& cfg, float lr,
                      int64_t step, float grad_scale, DType compute_dtype, cudaStream_t stream,
                      const float* dev_scale) {
  const StepScalars s = step_scalars(cfg, lr, step, true, grad_scale);  // decay per tensor in the kernel
  std::vector<const ops::AdamWTensor*> plain, copied;
  for (size_t k = 0; k < count; ++k) {
    if (tensors[k].n == 0) continue;
    (tensors[k].copy != nullptr ? copied : plain).push_back(&tensors[k]);
  }
  adamw_multi_launch<float>(plain.data(), plain.size(), s, dev_scale, stream);
  if (copied.empty()) return;
  DTK_REQUIRE(compute_dtype == DType::BF16 || compute_dtype == DType::F16, InternalError,
              "adamw_step_multi: the compute copy must be bf16 or fp16");
  if (compute_dtype == DType::BF16) adamw_multi_launch<bf16>(copied.data(), copied.size(), s, dev_scale, stream);
  else adamw_multi_launch<fp16>(copied.data(), copied.size(), s, dev_scale, stream);
}

}  // namespace dtrain::kernels
