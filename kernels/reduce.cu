// grad_norm_sq: per-block fp64 partial sums (block count a function of n only), then one
// block adds them in a fixed tree and accumulates into *accum. has_inf_or_nan: a
// block-wide OR and one idempotent store, so it is race-free without atomics.
#include "kernels/reduce.cuh"

#include "kernels/common.cuh"
#include "ops/step_scale.h"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int REDUCE_THREADS = 256;
constexpr unsigned REDUCE_MAX_BLOCKS = 1024;

template <typename T, int V>
__global__ void sumsq_partial_kernel(double* __restrict__ partial, const T* __restrict__ x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double s = 0.0;
  const size_t npack = n / V;
  for (size_t p = tid; p < npack; p += stride) {
    Pack<T, V> a = pack_load<T, V>(x + p * V);
    float f = 0.0f;  // a pack's squares in fp32, then fp64 across packs
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = to_f32(a.v[j]);
      f += v * v;
    }
    s += f;
  }
  for (size_t i = npack * V + tid; i < n; i += stride) {
    const double v = to_f32(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double* __restrict__ accum, const double* __restrict__ partial, int nparts) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *accum += s;
}

template <typename T, int V>
__global__ void nonfinite_kernel(int* __restrict__ flag, const T* __restrict__ x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int bad = 0;
  const size_t npack = n / V;
  for (size_t p = tid; p < npack; p += stride) {
    Pack<T, V> a = pack_load<T, V>(x + p * V);
#pragma unroll
    for (int j = 0; j < V; ++j) bad |= !isfinite(to_f32(a.v[j]));
  }
  for (size_t i = npack * V + tid; i < n; i += stride) bad |= !isfinite(to_f32(x[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}
__global__ void norm_sq_pack_kernel(float* __restrict__ red, const double* __restrict__ sq) {
  ops::norm_sq_pack(red, *sq);
}

__global__ void step_scale_kernel(float* __restrict__ scale, double* __restrict__ sq, const float* __restrict__ red,
                                  float loss_scale, float max_norm) {
  const double total = red != nullptr ? ops::norm_sq_unpack(red) : *sq;
  *sq = total;
  ops::step_scale(scale, total, loss_scale, max_norm);
}

__global__ void loss_sum_kernel(double* __restrict__ sum, float* __restrict__ sum_f32, const float* __restrict__ means,
                                const float* __restrict__ counts, int n) {
  const double s = ops::step_loss_sum(means, counts, n);
  *sum = s;
  *sum_f32 = static_cast<float>(s);
}
}  // namespace

void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n, cudaStream_t stream) {
  DTK_LAUNCH(1, 1, 0, stream, loss_sum_kernel)(sum, sum_f32, means, counts, n);
  DT_CUDA_LAUNCH_CHECK();
}

void norm_sq_pack(float* red, const double* sq, cudaStream_t stream) {
  DTK_LAUNCH(1, 1, 0, stream, norm_sq_pack_kernel)(red, sq);
  DT_CUDA_LAUNCH_CHECK();
}

void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm, cudaStream_t stream) {
  DTK_LAUNCH(1, 1, 0, stream, step_scale_kernel)(scale, sq, red, loss_scale, max_norm);
  DT_CUDA_LAUNCH_CHECK();
}

void grad_norm_sq(double* accum, const void* x, size_t n, DType dtype, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = VEC16<T>;
    const bool vec = aligned16(x);
    const unsigned blocks = grid_for(vec ? n / V + 1 : n, REDUCE_THREADS * 4, REDUCE_MAX_BLOCKS);
    Scratch partial(blocks * sizeof(double), stream);
    if (vec) {
      DTK_LAUNCH(blocks, REDUCE_THREADS, 0, stream, sumsq_partial_kernel<T, V>)
      (partial.as<double>(), static_cast<const T*>(x), n);
    } else {
      DTK_LAUNCH(blocks, REDUCE_THREADS, 0, stream, sumsq_partial_kernel<T, 1>)
      (partial.as<double>(), static_cast<const T*>(x), n);
    }
    DT_CUDA_LAUNCH_CHECK();
    DTK_LAUNCH(1, 1024, 0, stream, sumsq_final_kernel)(accum, partial.as<double>(), static_cast<int>(blocks));
    DT_CUDA_LAUNCH_CHECK();
  });
}

void has_inf_or_nan(int* flag, const void* x, size_t n, DType dtype, cudaStream_t stream) {
  if (n == 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = VEC16<T>;
    if (aligned16(x)) {
      DTK_LAUNCH(grid_for(n / V + 1, 256, 4096), 256, 0, stream, nonfinite_kernel<T, V>)
      (flag, static_cast<const T*>(x), n);
    } else {
      DTK_LAUNCH(grid_for(n, 256, 4096), 256, 0, stream, nonfinite_kernel<T, 1>)(flag, static_cast<const T*>(x), n);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace dtrain::kernels
