// dtype conversion kernel: one grid-stride loop over packs (4 elements when either side
// is fp32, 8 for 16-bit pairs) with a scalar tail, or all scalar when misaligned.
#include "kernels/cast.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

template <typename In, typename Out, int V>
__global__ void cast_kernel(Out* __restrict__ out, const In* __restrict__ inp, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t npack = n / V;
  for (size_t p = tid; p < npack; p += stride) {
    Pack<In, V> a = pack_load<In, V>(inp + p * V);
    Pack<Out, V> b;
#pragma unroll
    for (int j = 0; j < V; ++j) b.v[j] = from_f32<Out>(to_f32(a.v[j]));
    pack_store<Out, V>(out + p * V, b);
  }
  for (size_t i = npack * V + tid; i < n; i += stride) out[i] = from_f32<Out>(to_f32(inp[i]));
}

template <typename In, typename Out>
void cast_launch(Out* out, const In* inp, size_t n, cudaStream_t stream) {
  constexpr int V = (sizeof(In) == 4 || sizeof(Out) == 4) ? 4 : 8;
  const bool vec = reinterpret_cast<uintptr_t>(out) % (V * sizeof(Out)) == 0 &&
                   reinterpret_cast<uintptr_t>(inp) % (V * sizeof(In)) == 0;
  if (vec) {
    DTK_LAUNCH(grid_for(n / V + 1, 256), 256, 0, stream, cast_kernel<In, Out, V>)(out, inp, n);
  } else {
    DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, cast_kernel<In, Out, 1>)(out, inp, n);
  }
  DT_CUDA_LAUNCH_CHECK();
}
template <typename T>
__global__ void round_kernel(float* __restrict__ p, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = to_f32(from_f32<T>(p[i]));
}

__global__ void add_kernel(float* __restrict__ dst, const float* __restrict__ src, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] += src[i];
}
__global__ void scale_kernel(float* __restrict__ p, size_t n, float s) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p[i] *= s;
}
}  // namespace

void dtype_round(float* p, size_t n, DType dtype, cudaStream_t stream) {
  if (n == 0 || dtype == DType::F32) return;
  dispatch(dtype, [&](auto tt) {
    using T = typename decltype(tt)::type;
    DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, round_kernel<T>)(p, n);
  });
  DT_CUDA_LAUNCH_CHECK();
}

void add_f32(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, add_kernel)(dst, src, n);
  DT_CUDA_LAUNCH_CHECK();
}

void scale_f32(float* p, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, scale_kernel)(p, n, s);
  DT_CUDA_LAUNCH_CHECK();
}

void dtype_cast(void* out, DType out_dtype, const void* inp, DType in_dtype, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (out_dtype == in_dtype) {
    if (out != inp)
      DT_CUDA_CHECK(cudaMemcpyAsync(out, inp, n * dtype_size(in_dtype), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dispatch(in_dtype, [&](auto ti) {
    using In = typename decltype(ti)::type;
    dispatch(out_dtype, [&](auto to) {
      using Out = typename decltype(to)::type;
      cast_launch<In, Out>(static_cast<Out*>(out), static_cast<const In*>(inp), n, stream);
    });
  });
}

}  // namespace dtrain::kernels
