// grad_norm_sq: per-block fp64 partial sums (block count a function of n only), then one
// block adds them in a fixed tree and accumulates into *accum; grad_norm_sq_multi does the
// same for many buffers in two launches. has_inf_or_nan: a
// block-wide OR and one idempotent store, so it is race-free without atomics.
#include "kernels/reduce.cuh"

#include "kernels/common.cuh"
#include "ops/step_scale.h"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int REDUCE_THREADS = 256;
constexpr unsigned REDUCE_MAX_BLOCKS = 1024;

// This thread's share of sum x[i]^2 over n elements: its packs' squares in fp32, then fp64
// across packs; the elements past the last whole pack in fp64.
template <typename T, int V>
__device__ __forceinline__ double sumsq_range(const T* __restrict__ x, size_t n, size_t tid, size_t stride) {
  double s = 0.0;
  const size_t npack = n / V;
  for (size_t p = tid; p < npack; p += stride) {
    Pack<T, V> a = pack_load<T, V>(x + p * V);
    float f = 0.0f;
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
  return s;
}

template <typename T, int V>
__global__ void sumsq_partial_kernel(double* __restrict__ partial, const T* __restrict__ x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const double s = block_sum(sumsq_range<T, V>(x, n, tid, stride));
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double* __restrict__ accum, const double* __restrict__ partial, int nparts) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *accum += s;
}

// grad_norm_sq_multi: fp32 buffers as a table in the kernels' parameters (about 2 KB of
// the 4 KB allowed). Buffer t owns the grid's blocks [first[t], first[t + 1]) and their
// partials, exactly the blocks and partials grad_norm_sq gives it alone.
constexpr int SUMSQ_MULTI_MAX = 96;
struct SumsqTable {
  const float* x[SUMSQ_MULTI_MAX];
  size_t n[SUMSQ_MULTI_MAX];
  unsigned first[SUMSQ_MULTI_MAX + 1];
  unsigned char vec[SUMSQ_MULTI_MAX];  // 16-byte aligned: packs of 4
  int count;
};

__global__ void sumsq_multi_partial_kernel(double* __restrict__ partial, const SumsqTable table) {
  int lo = 0, hi = table.count - 1;  // this block's buffer: the last t with first[t] <= blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first[mid] <= blockIdx.x) lo = mid;
    else hi = mid - 1;
  }
  const size_t b = blockIdx.x - table.first[lo], blocks = table.first[lo + 1] - table.first[lo];
  const size_t tid = b * blockDim.x + threadIdx.x, stride = blocks * blockDim.x;
  const double s = block_sum(table.vec[lo] ? sumsq_range<float, 4>(table.x[lo], table.n[lo], tid, stride)
                                           : sumsq_range<float, 1>(table.x[lo], table.n[lo], tid, stride));
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// sumsq_final_kernel for each buffer in table order: the same sums added to *accum in the
// same order as one grad_norm_sq per buffer.
__global__ void sumsq_multi_final_kernel(double* __restrict__ accum, const double* __restrict__ partial,
                                         const SumsqTable table) {
  double acc = threadIdx.x == 0 ? *accum : 0.0;
  for (int t = 0; t < table.count; ++t) {
    double s = 0.0;
    for (unsigned i = table.first[t] + threadIdx.x; i < table.first[t + 1]; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) acc += s;
  }
  if (threadIdx.x == 0) *accum = acc;
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

void grad_norm_sq_multi(double* accum, const float* const* x, const size_t* n, size_t count, cudaStream_t stream) {
  size_t k = 0;
  while (k < count) {
    SumsqTable table{};
    unsigned blocks = 0;
    for (; k < count && table.count < SUMSQ_MULTI_MAX; ++k) {
      if (n[k] == 0) continue;
      const bool vec = aligned16(x[k]);  // grad_norm_sq's choice and block count for this buffer alone
      table.x[table.count] = x[k];
      table.n[table.count] = n[k];
      table.vec[table.count] = vec ? 1 : 0;
      table.first[table.count] = blocks;
      blocks += grid_for(vec ? n[k] / 4 + 1 : n[k], REDUCE_THREADS * 4, REDUCE_MAX_BLOCKS);
      ++table.count;
    }
    if (table.count == 0) return;
    table.first[table.count] = blocks;
    Scratch partial(blocks * sizeof(double), stream);
    DTK_LAUNCH(blocks, REDUCE_THREADS, 0, stream, sumsq_multi_partial_kernel)(partial.as<double>(), table);
    DT_CUDA_LAUNCH_CHECK();
    DTK_LAUNCH(1, 1024, 0, stream, sumsq_multi_final_kernel)(accum, partial.as<double>(), table);
    DT_CUDA_LAUNCH_CHECK();
  }
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
