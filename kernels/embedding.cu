// Embedding kernels. Backward scatters rows without atomics: blockIdx.y owns the tokens
// with tok % EMB_BUCKETS == blockIdx.y, each thread one channel, positions visited in
// order, so every dwte element is summed by one thread in a fixed order.
#include "kernels/embedding.cuh"

#include "kernels/common.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int EMB_BUCKETS = 32;

template <typename T, int V>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens, const T* __restrict__ wte,
                                         const T* __restrict__ wpe, int N, int T_, int C, int Vocab) {
  const int packs = C / V;
  const size_t total = static_cast<size_t>(N) * packs;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int n = static_cast<int>(idx / packs);
    const size_t c = static_cast<size_t>(idx % packs) * V;
    const int tok = tokens[n];
    Pack<T, V> o;
    if (tok < 0 || tok >= Vocab) {
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(NAN);
    } else {
      o = pack_load<T, V>(wte + static_cast<size_t>(tok) * C + c);
      if (wpe) {
        const Pack<T, V> p = pack_load<T, V>(wpe + static_cast<size_t>(n % T_) * C + c);
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(to_f32(o.v[j]) + to_f32(p.v[j]));
      }
    }
    pack_store<T, V>(out + static_cast<size_t>(n) * C + c, o);
  }
}

template <typename T>
__global__ void embedding_dwte_kernel(float* __restrict__ dwte, const T* __restrict__ dout, const int32_t* __restrict__ tokens,
                                      int N, int C, int Vocab) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int bucket = blockIdx.y;
  if (c >= C) return;
  for (int n = 0; n < N; ++n) {
    const int tok = tokens[n];
    if (tok < 0 || tok >= Vocab || tok % EMB_BUCKETS != bucket) continue;
    dwte[static_cast<size_t>(tok) * C + c] += to_f32(dout[static_cast<size_t>(n) * C + c]);
  }
}

template <typename T>
__global__ void embedding_dwpe_kernel(float* __restrict__ dwpe, const T* __restrict__ dout, int B, int T_, int C) {
  const size_t total = static_cast<size_t>(T_) * C;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += to_f32(dout[static_cast<size_t>(b) * total + idx]);
    dwpe[idx] += s;
  }
}
}  // namespace

void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                       DType dtype, cudaStream_t stream) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    constexpr int VEC = VEC16<Ty>;
    const bool vec = C % VEC == 0 && aligned16(out) && aligned16(wte) && (wpe == nullptr || aligned16(wpe));
    if (vec) {
      DTK_LAUNCH(grid_for(static_cast<size_t>(N) * C / VEC, 256), 256, 0, stream, embedding_forward_kernel<Ty, VEC>)(
          static_cast<Ty*>(out), tokens, static_cast<const Ty*>(wte), static_cast<const Ty*>(wpe), N, T, C, V);
    } else {
      DTK_LAUNCH(grid_for(static_cast<size_t>(N) * C, 256), 256, 0, stream, embedding_forward_kernel<Ty, 1>)(
          static_cast<Ty*>(out), tokens, static_cast<const Ty*>(wte), static_cast<const Ty*>(wpe), N, T, C, V);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
}

void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C,
                        int V, DType dtype, cudaStream_t stream) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    const dim3 grid(blocks_for(C, 128), EMB_BUCKETS);
    DTK_LAUNCH(grid, 128, 0, stream, embedding_dwte_kernel<Ty>)(dwte, static_cast<const Ty*>(dout), tokens, N, C, V);
    DT_CUDA_LAUNCH_CHECK();
    if (dwpe) {
      DTK_LAUNCH(grid_for(static_cast<size_t>(T) * C, 256), 256, 0, stream, embedding_dwpe_kernel<Ty>)(
          dwpe, static_cast<const Ty*>(dout), B, T, C);
      DT_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace dtrain::kernels
