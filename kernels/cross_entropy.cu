// Cross-entropy kernels. The row loop handles any row alignment (V is often odd, e.g.
// GPT-2's 50257, and rows may be packed): a scalar head up to the first 16-byte boundary
// (empty for the model's padded rows), 16-byte packs, a scalar tail. Per-thread online
// (max, sum-exp) pairs are merged across the block.
#include "kernels/cross_entropy.cuh"

#include "kernels/common.cuh"
#include "ops/step_scale.h"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int CE_THREADS = 512;

template <typename T>
__device__ __forceinline__ int row_head(const T* row, int V) {
  const int h = static_cast<int>(((16u - (reinterpret_cast<uintptr_t>(row) & 15u)) & 15u) / sizeof(T));
  return h < V ? h : V;
}

// f(i, x) for every element of the row, spread over the block's threads.
template <typename T, typename F>
__device__ __forceinline__ void row_visit(const T* row, int V, F&& f) {
  constexpr int VEC = VEC16<T>;
  const int head = row_head(row, V);
  for (int i = threadIdx.x; i < head; i += blockDim.x) f(i, to_f32(row[i]));
  const int nvec = (V - head) / VEC;
  for (int p = threadIdx.x; p < nvec; p += blockDim.x) {
    const Pack<T, VEC> pk = pack_load<T, VEC>(row + head + p * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) f(head + p * VEC + j, to_f32(pk.v[j]));
  }
  for (int i = head + nvec * VEC + threadIdx.x; i < V; i += blockDim.x) f(i, to_f32(row[i]));
}

// logits and dlogits may alias (no __restrict__).
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    cross_entropy_kernel(float* __restrict__ losses, T* dlogits, const T* logits, const int32_t* __restrict__ targets,
                         int V, int ld, float scale, const float* __restrict__ count, int32_t ignore_index) {
  if (count != nullptr) scale = ops::ce_backward_scale(scale, *count);
  const int n = blockIdx.x;
  const T* x = logits + static_cast<size_t>(n) * ld;
  T* d = dlogits ? dlogits + static_cast<size_t>(n) * ld : nullptr;
  const int32_t tgt = targets[n];
  const bool masked = tgt == ignore_index;
  const bool invalid = !masked && (tgt < 0 || tgt >= V);
  float m = -INFINITY, lse = 0.0f;  // lse: log(sum exp(x - m)) once reduced
  if (!masked && !invalid) {
    __shared__ float x_target;
    if (threadIdx.x == 0) x_target = to_f32(x[tgt]);  // read before any in-place write
    float s = 0.0f;
    row_visit(x, V, [&](int, float v) {
      if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
      } else if (m != -INFINITY) {  // v = m = -inf (masked vocabulary) adds exp(-inf) = 0, not NaN
        s += expf(v - m);
      }
    });
    const float M = block_max(m);
    const float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M));
    m = M;
    lse = logf(S);
    if (losses && threadIdx.x == 0) losses[n] = lse - (x_target - m);
  } else if (losses && threadIdx.x == 0) {
    losses[n] = invalid ? NAN : 0.0f;
  }
  if (!d) return;
  // dlogits: 0 for masked rows, NaN for invalid targets, else (p - onehot) * scale.
  auto grad = [&](int i, float v) -> float {
    if (masked) return 0.0f;
    if (invalid) return NAN;
    return (expf(v - m - lse) - (i == tgt ? 1.0f : 0.0f)) * scale;
  };
  constexpr int VEC = VEC16<T>;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) == (reinterpret_cast<uintptr_t>(d) & 15u)) {
    const int head = row_head(x, V);
    for (int i = threadIdx.x; i < head; i += blockDim.x) d[i] = from_f32<T>(grad(i, to_f32(x[i])));
    const int nvec = (V - head) / VEC;
    for (int p = threadIdx.x; p < nvec; p += blockDim.x) {
      const int i0 = head + p * VEC;
      Pack<T, VEC> pk = pack_load<T, VEC>(x + i0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) pk.v[j] = from_f32<T>(grad(i0 + j, to_f32(pk.v[j])));
      pack_store<T, VEC>(d + i0, pk);
    }
    for (int i = head + nvec * VEC + threadIdx.x; i < V; i += blockDim.x) d[i] = from_f32<T>(grad(i, to_f32(x[i])));
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) d[i] = from_f32<T>(grad(i, to_f32(x[i])));
  }
}

__global__ void loss_mean_kernel(float* __restrict__ mean, const float* __restrict__ losses,
                                 const int32_t* __restrict__ targets, int N, int32_t ignore_index) {
  double s = 0.0, c = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    if (targets[n] == ignore_index) continue;
    s += losses[n];
    c += 1.0;
  }
  s = block_sum(s);
  c = block_sum(c);
  if (threadIdx.x == 0) *mean = c > 0.0 ? static_cast<float>(s / c) : 0.0f;
}
}  // namespace

void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                    const int32_t* targets, int N, int V, int ld, float scale, int32_t ignore_index,
                                    DType dtype, cudaStream_t stream, const float* count) {
  DTK_REQUIRE(V > 0, UsageError, "cross-entropy needs a non-empty vocabulary");
  DTK_REQUIRE(ld >= V, UsageError, "cross-entropy: the logits' row pitch is below the vocabulary");
  if (N <= 0) {
    if (mean) DT_CUDA_CHECK(cudaMemsetAsync(mean, 0, sizeof(float), stream));
    return;
  }
  // The mean needs per-row losses: use a scratch row of losses when the caller has none.
  Scratch tmp(mean && !losses ? N * sizeof(float) : 0, stream);
  float* row_losses = losses ? losses : tmp.as<float>();
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DTK_LAUNCH(N, CE_THREADS, 0, stream, cross_entropy_kernel<T>)
    (row_losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, V, ld, scale, count, ignore_index);
    DT_CUDA_LAUNCH_CHECK();
  });
  if (mean) {
    DTK_LAUNCH(1, 1024, 0, stream, loss_mean_kernel)(mean, row_losses, targets, N, ignore_index);
    DT_CUDA_LAUNCH_CHECK();
  }
}

void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N, int V, int ld,
                           int32_t ignore_index, DType dtype, cudaStream_t stream) {
  cross_entropy_forward_backward(losses, mean, nullptr, logits, targets, N, V, ld, 1.0f, ignore_index, dtype, stream);
}

void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                            float scale, int32_t ignore_index, DType dtype, cudaStream_t stream, const float* count) {
  cross_entropy_forward_backward(nullptr, nullptr, dlogits, logits, targets, N, V, ld, scale, ignore_index, dtype,
                                 stream, count);
}

}  // namespace dtrain::kernels
