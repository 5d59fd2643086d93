// INTERNAL to kernels/*.cu (device code: never include it from host-only .cpp files):
// storage-type conversions, 16-byte packs, warp/block reductions, the DType -> C++ type
// dispatch, grid sizing and the host-side argument check the launchers use.
#pragma once

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/error.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

// One launch syntax for both compilers: DTK_LAUNCH(grid, block, smem, stream, kernel)(args)
// is kernel<<<grid, block, smem, stream>>>(args) under nvcc and the CPU execution
// engine's launcher under g++ (tests/cuda_emu). The kernel comes last so template
// arguments may contain commas. DTK_EXTERN_SHARED declares the dynamic shared memory.
#ifdef DTRAIN_CUDA_EMU
#define DTK_LAUNCH(grid, block, smem, stream, ...) \
  ::cuda_emu::launch(#__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream, __VA_ARGS__)
#define DTK_EXTERN_SHARED(type, name) type* name = static_cast<type*>(::cuda_emu::dynamic_smem())
#else
#define DTK_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define DTK_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif

// Launcher argument check without fmt (nvcc code): throws ::dtrain::Type (UsageError,
// InternalError, ...) with the failed condition and file:line.
#define DTK_REQUIRE(cond, Type, message)                                                                         \
  do {                                                                                                           \
    if (!(cond))                                                                                                 \
      throw ::dtrain::Type(std::string(message) + " (" #cond ")" + ::dtrain::detail::where(__FILE__, __LINE__)); \
  } while (0)

namespace dtrain::kernels::detail {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// ----------------------------------------------------------------------------
// Storage <-> fp32. Rounding is to nearest even, as core/dtype.h on the host.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(fp16 x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ fp16 from_f32<fp16>(float x) {
  return __float2half_rn(x);
}

// Rounds x to T and back: what storing to T and re-reading gives.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_f32(from_f32<T>(x));
}

// ----------------------------------------------------------------------------
// Packs: N elements moved as one aligned access (N * sizeof(T) = 16 bytes is the
// vector path; N = 1 is the unaligned fallback of the same kernel template).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <typename T>
inline constexpr int VEC16 = 16 / static_cast<int>(sizeof(T));

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> pack_load(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void pack_store(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ----------------------------------------------------------------------------
// Reductions. block_* need blockDim.x a multiple of 32 (<= 1024) and every thread of
// the block to call them; the result is returned to every thread.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename V>
__device__ __forceinline__ V block_sum(V v) {
  __shared__ V partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : V(0);
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

// ----------------------------------------------------------------------------
// DType -> C++ storage type: dispatch(dtype, [&](auto tag) { using T = typename
// decltype(tag)::type; ... }).
template <typename T>
struct Tag {
  using type = T;
};
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f(Tag<float>{}); return;
    case DType::BF16: f(Tag<bf16>{}); return;
    case DType::F16: f(Tag<fp16>{}); return;
  }
  ::dtrain::detail::throw_error(Exit::INTERNAL, "unknown dtype", __FILE__, __LINE__);
}

// Grid for a grid-stride loop over `items`: enough blocks to fill any current GPU,
// a function of the size only (so results never depend on the device).
inline unsigned grid_for(size_t items, int threads, unsigned max_blocks = 8192) {
  size_t b = (items + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < max_blocks ? b : max_blocks);
}
inline unsigned blocks_for(size_t items, int per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

// Stream-ordered scratch (cudaMallocAsync/cudaFreeAsync): safe on any stream, pooled by
// the driver so repeated calls do not hit cudaMalloc.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes) DT_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
  }
  ~Scratch() {
    if (ptr_) (void)cudaFreeAsync(ptr_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace dtrain::kernels::detail

namespace dtrain::kernels::detail {
/// The current device's attribute A (cudaDeviceGetAttribute), read once per device and
/// attribute: the tile and grid choices ask for it on every launch.
template <cudaDeviceAttr A>
int device_attr() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int dev = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) dev = kMaxDevices - 1;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v <= 0) {
    DT_CUDA_CHECK(cudaDeviceGetAttribute(&v, A, dev));
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// out[c] += sum over rows n of x[n, c] (x: [N, C] of dtype, rows ld >= C apart; out: fp32
// [C]); deterministic (defined in norm.cu; linear's bias gradient uses it when cuBLASLt has
// no BGRADB algo).
void column_sum_accumulate(float* out, const void* x, int N, int C, int ld, DType dtype, cudaStream_t stream);
}  // namespace dtrain::kernels::detail
