// Norm kernels. Forward: one warp per row (8 rows per block), passes over the row (stats,
// then apply) that hit L1/L2 after the first. Backward: one kernel per call, dinp per row
// and the parameter gradients from per-block partials summed in a fixed order (below).
// Plain column sums (linear's bias gradient): fixed 128-row chunks into fp32 partials,
// then one thread per column adds the chunks in order.
#include "kernels/norm.cuh"

#include "kernels/common.cuh"

#include <algorithm>
#include <atomic>

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int ROWS_PER_BLOCK = 8;  // warps per block
constexpr int CHUNK_ROWS = 128;    // rows per partial in the plain column sums

enum class Norm { LAYER, RMS };

// residual/a may alias: no __restrict__ on them.
template <typename T, int V, Norm K, bool FUSED>
__global__ void norm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                    T* residual, const T* a, const T* b, const T* __restrict__ w,
                                    const T* __restrict__ bias, int N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const T* x = FUSED ? residual + off : a + off;
  float s = 0.0f, ss = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    Pack<T, V> xv;
    if constexpr (FUSED) {
      const Pack<T, V> av = pack_load<T, V>(a + off + c), bv = pack_load<T, V>(b + off + c);
#pragma unroll
      for (int j = 0; j < V; ++j) xv.v[j] = from_f32<T>(to_f32(av.v[j]) + to_f32(bv.v[j]));
      pack_store<T, V>(residual + off + c, xv);
    } else {
      xv = pack_load<T, V>(x + c);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float f = to_f32(xv.v[j]);
      s += f;
      ss += f * f;
    }
  }
  float m = 0.0f, r;
  if constexpr (K == Norm::LAYER) {
    m = warp_sum(s) / C;
    float var = 0.0f;  // second pass around the mean: no cancellation
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<T, V> xv = pack_load<T, V>(x + c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = to_f32(xv.v[j]) - m;
        var += d * d;
      }
    }
    r = rsqrtf(warp_sum(var) / C + eps);
  } else {
    r = rsqrtf(warp_sum(ss) / C + eps);
  }
  for (int c = lane * V; c < C; c += 32 * V) {
    const Pack<T, V> xv = pack_load<T, V>(x + c), wv = pack_load<T, V>(w + c);
    Pack<T, V> o;
    if constexpr (K == Norm::LAYER) {
      Pack<T, V> bv;
      if (bias) bv = pack_load<T, V>(bias + c);
#pragma unroll
      for (int j = 0; j < V; ++j)
        o.v[j] = from_f32<T>((to_f32(xv.v[j]) - m) * r * to_f32(wv.v[j]) + (bias ? to_f32(bv.v[j]) : 0.0f));
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(to_f32(xv.v[j]) * r * to_f32(wv.v[j]));
    }
    pack_store<T, V>(out + off + c, o);
  }
  if (lane == 0) {
    if constexpr (K == Norm::LAYER) mean[row] = m;
    rstd[row] = r;
  }
}

// Backward, one kernel per call. Block b takes the 8-row groups b, b + G, b + 2G, ... (G =
// gridDim.x, a function of N only, so the results do not depend on the card). Per group:
// (1) warp w reduces row 8g + w (LayerNorm: md = mean(w d), mdx = mean(w d xhat); RMSNorm:
// mdx = mean(w d x)) into shared memory; (2) thread t owns the packs of columns (t + 256 k) V
// and walks the group's 8 rows in order: dinp += LayerNorm r (w d - md - xhat mdx), RMSNorm
// r w d - x r^3 mdx, and the block's running dweight (d xhat, d x r) / dbias (d) partials of
// its own columns. Pass 2 re-reads rows pass 1 just read (L1/L2), so dout and inp come from
// DRAM once per backward (the old form read them again in a column kernel). The partials
// live in dynamic shared memory where NA * C floats fit the card's opt-in size, else in the
// block's own row of `part` (same order of operations either way). The last block to finish
// (a counter the launcher zeroes) adds every block's partials in block order to dw / db:
// deterministic, no float atomics.
constexpr int BWD_THREADS = 32 * ROWS_PER_BLOCK;
constexpr int BWD_MAX_BLOCKS = 256;  // partial rows, and the finishing block's sum length

template <typename T, int V, Norm K>
__global__ void __launch_bounds__(BWD_THREADS)
    norm_backward_kernel(T* __restrict__ dinp, float* __restrict__ dw, float* __restrict__ db, float* __restrict__ part,
                         unsigned* __restrict__ done, const T* __restrict__ dout, const T* __restrict__ inp,
                         const T* __restrict__ w, const float* __restrict__ mean, const float* __restrict__ rstd, int N,
                         int C, bool smem_acc) {
  constexpr int NA = K == Norm::LAYER ? 2 : 1;   // partial arrays: dweight (and dbias)
  __shared__ float stats[2][ROWS_PER_BLOCK][4];  // md, mdx, mean, rstd; double-buffered by group
  __shared__ bool last;
  DTK_EXTERN_SHARED(float, smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool grads = part != nullptr;
  float* acc = grads ? (smem_acc ? smem : part + static_cast<size_t>(blockIdx.x) * NA * C) : nullptr;
  if (grads)
    for (int c = threadIdx.x * V; c < C; c += BWD_THREADS * V)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        acc[c + j] = 0.0f;
        if constexpr (NA == 2) acc[C + c + j] = 0.0f;
      }
  const int groups = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  int buf = 0;
  for (int g = blockIdx.x; g < groups; g += gridDim.x, buf ^= 1) {
    const int row = g * ROWS_PER_BLOCK + warp;
    if (row < N) {
      const size_t off = static_cast<size_t>(row) * C;
      const float m = K == Norm::LAYER ? mean[row] : 0.0f, r = rstd[row];
      float s1 = 0.0f, s2 = 0.0f;
      if (dinp) {
        for (int c = lane * V; c < C; c += 32 * V) {
          const Pack<T, V> dv = pack_load<T, V>(dout + off + c), xv = pack_load<T, V>(inp + off + c),
                           wv = pack_load<T, V>(w + c);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float dn = to_f32(wv.v[j]) * to_f32(dv.v[j]);
            if constexpr (K == Norm::LAYER) {
              s1 += dn;
              s2 += dn * ((to_f32(xv.v[j]) - m) * r);
            } else {
              s2 += dn * to_f32(xv.v[j]);
            }
          }
        }
        s1 = warp_sum(s1) / C;
        s2 = warp_sum(s2) / C;
      }
      if (lane == 0) {
        stats[buf][warp][0] = s1;
        stats[buf][warp][1] = s2;
        stats[buf][warp][2] = m;
        stats[buf][warp][3] = r;
      }
    }
    __syncthreads();  // stats[buf] ready; the other buffer's readers are past the previous barrier
    const int rows = min(ROWS_PER_BLOCK, N - g * ROWS_PER_BLOCK);
    for (int c = threadIdx.x * V; c < C; c += BWD_THREADS * V) {
      const Pack<T, V> wv = pack_load<T, V>(w + c);
      float aw[V], ab[V];
#pragma unroll
      for (int j = 0; j < V; ++j) aw[j] = ab[j] = 0.0f;
      for (int i = 0; i < rows; ++i) {
        const size_t off = static_cast<size_t>(g * ROWS_PER_BLOCK + i) * C + c;
        const float md = stats[buf][i][0], mdx = stats[buf][i][1], m = stats[buf][i][2], r = stats[buf][i][3];
        const Pack<T, V> dv = pack_load<T, V>(dout + off), xv = pack_load<T, V>(inp + off);
        Pack<T, V> di;
        if (dinp) di = pack_load<T, V>(dinp + off);
        const float k3 = mdx * r * r * r;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float x = to_f32(xv.v[j]), d = to_f32(dv.v[j]), dn = to_f32(wv.v[j]) * d;
          if constexpr (K == Norm::LAYER) {
            const float xhat = (x - m) * r;
            if (dinp) di.v[j] = from_f32<T>(to_f32(di.v[j]) + r * (dn - md - (x - m) * r * mdx));
            aw[j] += d * xhat;
            ab[j] += d;
          } else {
            if (dinp) di.v[j] = from_f32<T>(to_f32(di.v[j]) + (r * dn - x * k3));
            aw[j] += d * (x * r);
          }
        }
        if (dinp) pack_store<T, V>(dinp + off, di);
      }
      if (grads)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          acc[c + j] += aw[j];
          if constexpr (NA == 2) acc[C + c + j] += ab[j];
        }
    }
  }
  if (!grads) return;
  if (smem_acc) {  // each thread copies the columns it owns
    float* mine = part + static_cast<size_t>(blockIdx.x) * NA * C;
    for (int c = threadIdx.x * V; c < C; c += BWD_THREADS * V)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        mine[c + j] = acc[c + j];
        if constexpr (NA == 2) mine[C + c + j] = acc[C + c + j];
      }
  }
  __threadfence();  // this block's partials visible to the block that finishes
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int c = threadIdx.x; c < C; c += BWD_THREADS) {
    float sw = 0.0f, sb = 0.0f;
    for (unsigned b = 0; b < gridDim.x; ++b) {
      const float* pb = part + static_cast<size_t>(b) * NA * C;
      sw += pb[c];
      if constexpr (NA == 2) sb += pb[C + c];
    }
    if (dw) dw[c] += sw;
    if constexpr (NA == 2)
      if (db) db[c] += sb;
  }
}

// Column sums over one CHUNK_ROWS chunk (blockIdx.x: N/128 may exceed grid.y's 65535) for 32
// columns (blockIdx.y), rows ld apart, into fp32 partials.
template <typename T>
__global__ void column_partial_kernel(float* __restrict__ pb, const T* __restrict__ x, int N, int C, int ld) {
  __shared__ float sb[8][33];
  const int c = blockIdx.y * 32 + threadIdx.x;
  const int r0 = blockIdx.x * CHUNK_ROWS, r1 = min(N, r0 + CHUNK_ROWS);
  float ab = 0.0f;
  if (c < C)
    for (int n = r0 + threadIdx.y; n < r1; n += 8) ab += to_f32(x[static_cast<size_t>(n) * ld + c]);
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tb = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) tb += sb[y][threadIdx.x];
    pb[static_cast<size_t>(blockIdx.x) * C + c] = tb;
  }
}

__global__ void column_finish_kernel(float* __restrict__ out, const float* __restrict__ partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; ++k) s += partial[static_cast<size_t>(k) * C + c];
  out[c] += s;
}

// out[c] += sum over rows of x[:, c]: 128-row chunk partials, then one thread per column adds
// the chunks in order.
template <typename T>
void column_sums(float* out, const T* x, int N, int C, int ld, cudaStream_t stream) {
  const int chunks = static_cast<int>(blocks_for(N, CHUNK_ROWS));
  Scratch scratch(static_cast<size_t>(chunks) * C * sizeof(float), stream);
  DTK_LAUNCH(dim3(chunks, blocks_for(C, 32)), dim3(32, 8), 0, stream, column_partial_kernel<T>)
  (scratch.as<float>(), x, N, C, ld);
  DT_CUDA_LAUNCH_CHECK();
  DTK_LAUNCH(blocks_for(C, 256), 256, 0, stream, column_finish_kernel)(out, scratch.as<float>(), chunks, C);
  DT_CUDA_LAUNCH_CHECK();
}

template <typename Kernel>
void smem_allow(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <Norm K, bool FUSED>
void norm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b, const void* w,
                  const void* bias, int N, int C, float eps, DType dtype, cudaStream_t stream) {
  if (N <= 0) return;
  DTK_REQUIRE(C > 0, UsageError, "norm needs at least one channel");
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = VEC16<T>;
    bool vec = C % V == 0 && aligned16(out) && aligned16(a) && aligned16(w) && (!bias || aligned16(bias));
    if (FUSED) vec = vec && aligned16(residual) && aligned16(b);
    const unsigned grid = blocks_for(N, ROWS_PER_BLOCK);
    auto args = [&](auto kernel) {
      DTK_LAUNCH(grid, 32 * ROWS_PER_BLOCK, 0, stream, kernel)
      (static_cast<T*>(out), mean, rstd, static_cast<T*>(residual), static_cast<const T*>(a), static_cast<const T*>(b),
       static_cast<const T*>(w), static_cast<const T*>(bias), N, C, eps);
    };
    if (vec) {
      args(norm_forward_kernel<T, V, K, FUSED>);
    } else {
      args(norm_forward_kernel<T, 1, K, FUSED>);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
}

// The current device's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin),
// read once per device.
size_t smem_optin() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int dev = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) dev = kMaxDevices - 1;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v <= 0) {
    DT_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return static_cast<size_t>(v);
}

template <Norm K>
void norm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                   const float* mean, const float* rstd, int N, int C, DType dtype, cudaStream_t stream) {
  if (N <= 0 || C <= 0 || (!dinp && !dw && !db)) return;
  constexpr int NA = K == Norm::LAYER ? 2 : 1;
  const bool grads = dw || db;
  const unsigned grid = std::min<unsigned>(blocks_for(N, ROWS_PER_BLOCK), BWD_MAX_BLOCKS);
  const size_t part_floats = grads ? static_cast<size_t>(grid) * NA * C : 0;
  // Partials, then the finishing counter (zeroed here: the kernel's last block reads it).
  Scratch scratch(grads ? part_floats * sizeof(float) + sizeof(unsigned) : 0, stream);
  float* part = grads ? scratch.as<float>() : nullptr;
  unsigned* done = grads ? reinterpret_cast<unsigned*>(part + part_floats) : nullptr;
  if (grads) DT_CUDA_CHECK(cudaMemsetAsync(done, 0, sizeof(unsigned), stream));
  const size_t acc_bytes = sizeof(float) * NA * static_cast<size_t>(C);
  const bool smem_acc = grads && acc_bytes <= smem_optin();
  const size_t bytes = smem_acc ? acc_bytes : 0;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = VEC16<T>;
    const bool vec = C % V == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    if (vec) {
      smem_allow(norm_backward_kernel<T, V, K>, bytes);
      DTK_LAUNCH(grid, BWD_THREADS, bytes, stream, norm_backward_kernel<T, V, K>)
      (static_cast<T*>(dinp), dw, db, part, done, static_cast<const T*>(dout), static_cast<const T*>(inp),
       static_cast<const T*>(w), mean, rstd, N, C, smem_acc);
    } else {
      smem_allow(norm_backward_kernel<T, 1, K>, bytes);
      DTK_LAUNCH(grid, BWD_THREADS, bytes, stream, norm_backward_kernel<T, 1, K>)
      (static_cast<T*>(dinp), dw, db, part, done, static_cast<const T*>(dout), static_cast<const T*>(inp),
       static_cast<const T*>(w), mean, rstd, N, C, smem_acc);
    }
    DT_CUDA_LAUNCH_CHECK();
  });
}
}  // namespace

void detail::column_sum_accumulate(float* out, const void* x, int N, int C, int ld, DType dtype, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    column_sums<T>(out, static_cast<const T*>(x), N, C, ld, stream);
  });
}

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                       int N, int C, float eps, DType dtype, cudaStream_t stream) {
  norm_forward<Norm::LAYER, false>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, eps, dtype, stream);
}
void residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b,
                                const void* weight, const void* bias, int N, int C, float eps, DType dtype,
                                cudaStream_t stream) {
  norm_forward<Norm::LAYER, true>(residual, out, mean, rstd, a, b, weight, bias, N, C, eps, dtype, stream);
}
void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight,
                        const float* mean, const float* rstd, int N, int C, DType dtype, cudaStream_t stream) {
  norm_backward<Norm::LAYER>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, dtype, stream);
}
void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C, float eps, DType dtype,
                     cudaStream_t stream) {
  norm_forward<Norm::RMS, false>(nullptr, out, nullptr, rstd, inp, nullptr, weight, nullptr, N, C, eps, dtype, stream);
}
void residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* weight,
                              int N, int C, float eps, DType dtype, cudaStream_t stream) {
  norm_forward<Norm::RMS, true>(residual, out, nullptr, rstd, a, b, weight, nullptr, N, C, eps, dtype, stream);
}
void rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp, const void* weight,
                      const float* rstd, int N, int C, DType dtype, cudaStream_t stream) {
  norm_backward<Norm::RMS>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C, dtype, stream);
}

}  // namespace dtrain::kernels
