// Dropout kernels: one grid-stride loop each; the mask is recomputed per element from
// (seed, index), so forward and backward need no mask buffer (bytes moved: n in, n out).
#include "kernels/dropout.cuh"

#include "core/dropout_mask.h"
#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

template <typename T>
__global__ void dropout_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, size_t n, float p, float inv,
                                       uint64_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = dropout_keep(seed, i, p) ? from_f32<T>(to_f32(inp[i]) * inv) : from_f32<T>(0.0f);
}

template <typename T>
__global__ void dropout_backward_kernel(T* __restrict__ dinp, const T* __restrict__ dout, size_t n, float p, float inv,
                                        uint64_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (dropout_keep(seed, i, p)) dinp[i] = from_f32<T>(to_f32(dinp[i]) + to_f32(dout[i]) * inv);
}
}  // namespace

void dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType dtype, cudaStream_t stream) {
  if (n == 0) return;
  DTK_REQUIRE(p >= 0.0f && p < 1.0f, UsageError, "dropout probability must be in [0, 1)");
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, dropout_forward_kernel<T>)
    (static_cast<T*>(out), static_cast<const T*>(inp), n, p, 1.0f / (1.0f - p), seed);
    DT_CUDA_LAUNCH_CHECK();
  });
}

void dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType dtype,
                      cudaStream_t stream) {
  if (n == 0) return;
  DTK_REQUIRE(p >= 0.0f && p < 1.0f, UsageError, "dropout probability must be in [0, 1)");
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DTK_LAUNCH(grid_for(n, 256), 256, 0, stream, dropout_backward_kernel<T>)
    (static_cast<T*>(dinp), static_cast<const T*>(dout), n, p, 1.0f / (1.0f - p), seed);
    DT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace dtrain::kernels
