// Norm kernels. Forward and the dinp part of backward: one warp per row (8 rows per
// block), three passes over the row (stats, then apply) that hit L1/L2 after the first.
// Parameter gradients: a column kernel sums fixed 128-row chunks into fp32 partials,
// then one thread per column adds the chunks in order into dweight / dbias (one launch for
// both).
#include "kernels/norm.cuh"

#include "kernels/common.cuh"

#include "core/env.h"

#include <cstring>

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int ROWS_PER_BLOCK = 8;  // warps per block
constexpr int CHUNK_ROWS = 128;    // rows per partial in the parameter-gradient sums

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

// dinp += ...: LayerNorm r (w d - mean(w d) - xhat mean(w d xhat)); RMSNorm r w d - x r^3 mean(w d x).
// One lane's part of a row's two backward sums (both norm backwards): s1 = sum of w * dout
// (LayerNorm only), s2 = sum of w * dout * xhat (LayerNorm) or w * dout * x (RMSNorm), over
// the lane's packs of the row; the caller reduces them over the warp.
template <typename T, int V, Norm K>
__device__ __forceinline__ void norm_row_sums(float& s1, float& s2, const T* __restrict__ dout,
                                              const T* __restrict__ inp, const T* __restrict__ w, float m, float r,
                                              int C, int lane) {
  s1 = 0.0f;
  s2 = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    const Pack<T, V> dv = pack_load<T, V>(dout + c), xv = pack_load<T, V>(inp + c), wv = pack_load<T, V>(w + c);
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
}

template <typename T, int V, Norm K>
__global__ void norm_dinp_kernel(T* __restrict__ dinp, const T* __restrict__ dout, const T* __restrict__ inp,
                                 const T* __restrict__ w, const float* __restrict__ mean,
                                 const float* __restrict__ rstd, int N, int C) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const float m = K == Norm::LAYER ? mean[row] : 0.0f, r = rstd[row];
  float s1, s2;
  norm_row_sums<T, V, K>(s1, s2, dout + off, inp + off, w, m, r, C, lane);
  const float md = warp_sum(s1) / C, mdx = warp_sum(s2) / C;
  const float k3 = mdx * r * r * r;
  for (int c = lane * V; c < C; c += 32 * V) {
    const Pack<T, V> dv = pack_load<T, V>(dout + off + c), xv = pack_load<T, V>(inp + off + c),
                     wv = pack_load<T, V>(w + c);
    Pack<T, V> di = pack_load<T, V>(dinp + off + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float x = to_f32(xv.v[j]), dn = to_f32(wv.v[j]) * to_f32(dv.v[j]);
      float g;
      if constexpr (K == Norm::LAYER) {
        g = r * (dn - md - (x - m) * r * mdx);
      } else {
        g = r * dn - x * k3;
      }
      di.v[j] = from_f32<T>(to_f32(di.v[j]) + g);
    }
    pack_store<T, V>(dinp + off + c, di);
  }
}

// Column partial sums over one CHUNK_ROWS chunk (blockIdx.x: N/128 may exceed grid.y's
// 65535) for 32 columns (blockIdx.y), rows ld apart:
// MODE 0 = LayerNorm (pw: d*xhat, pb: d), 1 = RMSNorm (pw: d*x*rstd), 2 = plain sum (pb: x).
template <typename T, int MODE>
__global__ void column_partial_kernel(float* __restrict__ pw, float* __restrict__ pb, const T* __restrict__ dout,
                                      const T* __restrict__ inp, const float* __restrict__ mean,
                                      const float* __restrict__ rstd, int N, int C, int ld) {
  __shared__ float sw[8][33], sb[8][33];
  const int c = blockIdx.y * 32 + threadIdx.x;
  const int r0 = blockIdx.x * CHUNK_ROWS, r1 = min(N, r0 + CHUNK_ROWS);
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int n = r0 + threadIdx.y; n < r1; n += 8) {
      const size_t i = static_cast<size_t>(n) * ld + c;
      const float d = to_f32(dout[i]);
      if constexpr (MODE == 0) {
        aw += d * ((to_f32(inp[i]) - mean[n]) * rstd[n]);
        ab += d;
      } else if constexpr (MODE == 1) {
        aw += d * (to_f32(inp[i]) * rstd[n]);
      } else {
        ab += d;
      }
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) {
      tw += sw[y][threadIdx.x];
      tb += sb[y][threadIdx.x];
    }
    const size_t o = static_cast<size_t>(blockIdx.x) * C + c;
    if (pw) pw[o] = tw;
    if (pb) pb[o] = tb;
  }
}

// out[c] += the chunks' partials of column c, in chunk order. blockIdx.y picks the output:
// out0 from partial, out1 (dbias beside dweight: one launch for both) from the next
// chunks x C partials.
__global__ void column_finish_kernel(float* __restrict__ out0, float* __restrict__ out1,
                                     const float* __restrict__ partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* out = blockIdx.y == 0 ? out0 : out1;
  partial += static_cast<size_t>(blockIdx.y) * chunks * C;
  float s = 0.0f;
  for (int k = 0; k < chunks; ++k) s += partial[static_cast<size_t>(k) * C + c];
  out[c] += s;
}

template <typename T, int MODE>
void column_sums(float* dw, float* db, const T* dout, const T* inp, const float* mean, const float* rstd, int N, int C,
                 int ld, cudaStream_t stream) {
  const int chunks = static_cast<int>(blocks_for(N, CHUNK_ROWS));
  const size_t part = static_cast<size_t>(chunks) * C;
  Scratch scratch(part * sizeof(float) * ((dw ? 1 : 0) + (db ? 1 : 0)), stream);
  float* pw = dw ? scratch.as<float>() : nullptr;
  float* pb = db ? scratch.as<float>() + (dw ? part : 0) : nullptr;
  DTK_LAUNCH(dim3(chunks, blocks_for(C, 32)), dim3(32, 8), 0, stream, column_partial_kernel<T, MODE>)
  (pw, pb, dout, inp, mean, rstd, N, C, ld);
  DT_CUDA_LAUNCH_CHECK();
  // pb follows pw in the scratch: both outputs in one launch.
  DTK_LAUNCH(dim3(blocks_for(C, 256), dw && db ? 2 : 1), 256, 0, stream, column_finish_kernel)
  (dw ? dw : db, db, dw ? pw : pb, chunks, C);
  DT_CUDA_LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// The fused backward (DTRAIN_NORM_BACKWARD=fused, an alternative to the three kernels above
// until a GPU measures both): one block per FUSED_ROWS-row chunk. The warps find each row's
// two means (as norm_dinp_kernel's first pass); then the threads walk the chunk by columns,
// re-reading dout and inp from L1/L2, adding to dinp and summing the chunk's dweight (and
// dbias) column partials in registers. Where a row has fewer packs than the block has
// threads, G groups of threads take every G-th row of the same columns and add their sums in
// group order through shared memory. dout and inp come from DRAM once instead of twice; the
// partials (one row per chunk) are summed by column_finish_wide_kernel.
constexpr int FUSED_ROWS = 32;
constexpr int FUSED_THREADS = 256;

template <typename T, int V, Norm K>
__global__ void __launch_bounds__(FUSED_THREADS)
    norm_backward_fused_kernel(T* __restrict__ dinp, float* __restrict__ pw, float* __restrict__ pb,
                               const T* __restrict__ dout, const T* __restrict__ inp, const T* __restrict__ w,
                               const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C) {
  constexpr int NA = K == Norm::LAYER ? 2 : 1;  // partial arrays: dweight (and dbias)
  __shared__ float stats[FUSED_ROWS][4];        // mean(w d), mean(w d xhat) (RMS: w d x), mean, rstd
  __shared__ float red[NA][FUSED_THREADS * V];  // the groups' column sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r0 = blockIdx.x * FUSED_ROWS, rows = min(FUSED_ROWS, N - r0);
  for (int i = warp; i < rows; i += FUSED_THREADS / 32) {
    const int row = r0 + i;
    const size_t off = static_cast<size_t>(row) * C;
    const float m = K == Norm::LAYER ? mean[row] : 0.0f, r = rstd[row];
    float s1, s2;
    norm_row_sums<T, V, K>(s1, s2, dout + off, inp + off, w, m, r, C, lane);
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    if (lane == 0) {
      stats[i][0] = s1 / C;
      stats[i][1] = s2 / C;
      stats[i][2] = m;
      stats[i][3] = r;
    }
  }
  __syncthreads();
  // Columns: P packs a row; G groups of P threads when P < the block (else one group that
  // loops over the packs).
  const int P = C / V, G = P >= FUSED_THREADS ? 1 : FUSED_THREADS / P;
  const int g = G > 1 ? static_cast<int>(threadIdx.x) / P : 0;
  const int c0 = G > 1 ? static_cast<int>(threadIdx.x) % P : static_cast<int>(threadIdx.x);
  const int cstep = G > 1 ? P : FUSED_THREADS;
  float* part_w = pw ? pw + static_cast<size_t>(blockIdx.x) * C : nullptr;
  float* part_b = pb ? pb + static_cast<size_t>(blockIdx.x) * C : nullptr;
  for (int cp = c0; cp < P && g < G; cp += cstep) {
    const int c = cp * V;
    const Pack<T, V> wv = pack_load<T, V>(w + c);
    float aw[V], ab[V];
#pragma unroll
    for (int j = 0; j < V; ++j) aw[j] = ab[j] = 0.0f;
    for (int i = g; i < rows; i += G) {
      const size_t off = static_cast<size_t>(r0 + i) * C + c;
      const float md = stats[i][0], mdx = stats[i][1], m = stats[i][2], r = stats[i][3];
      const float k3 = mdx * r * r * r;
      const Pack<T, V> dv = pack_load<T, V>(dout + off), xv = pack_load<T, V>(inp + off);
      Pack<T, V> di = pack_load<T, V>(dinp + off);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float x = to_f32(xv.v[j]), d = to_f32(dv.v[j]), dn = to_f32(wv.v[j]) * d;
        float gr;
        if constexpr (K == Norm::LAYER) {
          gr = r * (dn - md - (x - m) * r * mdx);
          aw[j] += d * ((x - m) * r);
          ab[j] += d;
        } else {
          gr = r * dn - x * k3;
          aw[j] += d * (x * r);
        }
        di.v[j] = from_f32<T>(to_f32(di.v[j]) + gr);
      }
      pack_store<T, V>(dinp + off, di);
    }
    if (G == 1) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (part_w) part_w[c + j] = aw[j];
        if constexpr (NA == 2)
          if (part_b) part_b[c + j] = ab[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        red[0][threadIdx.x * V + j] = aw[j];
        if constexpr (NA == 2) red[NA - 1][threadIdx.x * V + j] = ab[j];
      }
    }
  }
  if (G == 1) return;
  __syncthreads();
  if (g != 0) return;
  for (int cp = c0; cp < P; cp += cstep) {  // one pack: the group-0 thread of these columns
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float sw = 0.0f, sb = 0.0f;
      for (int k = 0; k < G; ++k) {
        sw += red[0][(k * P + cp) * V + j];
        if constexpr (NA == 2) sb += red[NA - 1][(k * P + cp) * V + j];
      }
      if (part_w) part_w[cp * V + j] = sw;
      if constexpr (NA == 2)
        if (part_b) part_b[cp * V + j] = sb;
    }
  }
}

// out[c] += the chunks' partials of column c (blockIdx.y picks the output, as
// column_finish_kernel): 32 columns a block, 32 threads a column each add every 32nd chunk,
// then one thread adds their 32 sums in order.
__global__ void column_finish_wide_kernel(float* __restrict__ out0, float* __restrict__ out1,
                                          const float* __restrict__ partial, int chunks, int C) {
  __shared__ float s[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  partial += static_cast<size_t>(blockIdx.y) * chunks * C;
  float a = 0.0f;
  if (c < C)
    for (int k = threadIdx.y; k < chunks; k += 32) a += partial[static_cast<size_t>(k) * C + c];
  s[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float t = 0.0f;
#pragma unroll
  for (int y = 0; y < 32; ++y) t += s[y][threadIdx.x];
  (blockIdx.y == 0 ? out0 : out1)[c] += t;
}

// DTRAIN_NORM_BACKWARD (core/env.cpp's table; a config load refuses a value other than split
// or fused): the fused backward above instead of the dinp + column-sum kernels. Read at every
// call (a host getenv beside a launch), so one process can run both.
bool norm_backward_fused() {
  const char* v = env_get("DTRAIN_NORM_BACKWARD");
  return v != nullptr && std::strcmp(v, "fused") == 0;
}

template <typename T, int V, Norm K>
void norm_backward_fused_launch(T* dinp, float* dw, float* db, const T* dout, const T* inp, const T* w,
                                const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  const int chunks = static_cast<int>(blocks_for(N, FUSED_ROWS));
  const size_t part = static_cast<size_t>(chunks) * C;
  Scratch scratch(part * sizeof(float) * ((dw ? 1 : 0) + (db ? 1 : 0)), stream);
  float* pw = dw ? scratch.as<float>() : nullptr;
  float* pb = db ? scratch.as<float>() + (dw ? part : 0) : nullptr;
  DTK_LAUNCH(chunks, FUSED_THREADS, 0, stream, norm_backward_fused_kernel<T, V, K>)
  (dinp, pw, pb, dout, inp, w, mean, rstd, N, C);
  DT_CUDA_LAUNCH_CHECK();
  // pb follows pw in the scratch: both outputs in one launch.
  DTK_LAUNCH(dim3(blocks_for(C, 32), dw && db ? 2 : 1), dim3(32, 32), 0, stream, column_finish_wide_kernel)
  (dw ? dw : db, db, dw ? pw : pb, chunks, C);
  DT_CUDA_LAUNCH_CHECK();
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

template <Norm K>
void norm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                   const float* mean, const float* rstd, int N, int C, DType dtype, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = VEC16<T>;
    const bool vec = C % V == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    if (dinp && (dw || db) && norm_backward_fused()) {
      auto* db_ = K == Norm::LAYER ? db : nullptr;
      if (vec) {
        norm_backward_fused_launch<T, V, K>(static_cast<T*>(dinp), dw, db_, static_cast<const T*>(dout),
                                            static_cast<const T*>(inp), static_cast<const T*>(w), mean, rstd, N, C,
                                            stream);
      } else {
        norm_backward_fused_launch<T, 1, K>(static_cast<T*>(dinp), dw, db_, static_cast<const T*>(dout),
                                            static_cast<const T*>(inp), static_cast<const T*>(w), mean, rstd, N, C,
                                            stream);
      }
      return;
    }
    if (dinp) {
      const unsigned grid = blocks_for(N, ROWS_PER_BLOCK);
      if (vec) {
        DTK_LAUNCH(grid, 32 * ROWS_PER_BLOCK, 0, stream, norm_dinp_kernel<T, V, K>)
        (static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), static_cast<const T*>(w), mean,
         rstd, N, C);
      } else {
        DTK_LAUNCH(grid, 32 * ROWS_PER_BLOCK, 0, stream, norm_dinp_kernel<T, 1, K>)
        (static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), static_cast<const T*>(w), mean,
         rstd, N, C);
      }
      DT_CUDA_LAUNCH_CHECK();
    }
    if (dw || db) {
      column_sums<T, K == Norm::LAYER ? 0 : 1>(dw, K == Norm::LAYER ? db : nullptr, static_cast<const T*>(dout),
                                               static_cast<const T*>(inp), mean, rstd, N, C, C, stream);
    }
  });
}
}  // namespace

void detail::column_sum_accumulate(float* out, const void* x, int N, int C, int ld, DType dtype, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    column_sums<T, 2>(nullptr, out, static_cast<const T*>(x), nullptr, nullptr, nullptr, N, C, ld, stream);
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
