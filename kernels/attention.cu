// Flash attention on CUDA cores for fp32 (bf16 and fp16 run on tensor cores: attention_mma.cu).
// fp32 math in shared memory: 32-row
// query tiles x 32-key tiles. A warp owns RPW rows (queries in forward/dq, keys in
// dk/dv); in the score phase lane j takes key (or query) j of the tile, so dot products
// need no shuffles, and probabilities are broadcast back with __shfl_sync for the
// accumulation phase, where lane l owns dimensions l, l+32, ... Rows read by lane index
// are padded by one float in shared memory (no bank conflicts). Template DPL = head
// dimensions per lane (2, 4, 8: HD <= 64, 128, 256) keeps the accumulators in registers.
#include "kernels/attention.cuh"

#include "kernels/attention_internal.cuh"
#include "kernels/common.cuh"

#include <cmath>
#include <type_traits>

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr unsigned FULL = 0xffffffffu;
constexpr int TILE = 32;

template <int DPL>
struct Cfg {
  static constexpr int HDP = DPL * 32;          // padded head dim
  static constexpr int RPW = DPL == 8 ? 4 : 8;  // rows per warp (register budget)
  static constexpr int NW = TILE / RPW;         // warps per block
  static constexpr int THREADS = NW * 32;
};

using Shape = AttnShape;

// dst[r * stride + d] = src[(row0 + r) * pitch + d] for r < 32, d < HDP; zero past T or HD.
template <typename T>
__device__ __forceinline__ void tile_load(float* dst, int stride, const T* src, int row0, int T_, size_t pitch, int HD,
                                          int HDP) {
  for (int idx = threadIdx.x; idx < TILE * HDP; idx += blockDim.x) {
    const int r = idx / HDP, d = idx - r * HDP, t = row0 + r;
    dst[r * stride + d] = (t < T_ && d < HD) ? to_f32(src[static_cast<size_t>(t) * pitch + d]) : 0.0f;
  }
}

// ----------------------------------------------------------------------------
// Forward: grid (B*NH, T/32 query tiles); B*NH goes in x because it may exceed 65535,
// grid.y's limit. smem: Qs [32][HDP], Ks [32][HDP+1], Vs [32][HDP].
template <typename T, int DPL>
__global__ void __launch_bounds__(Cfg<DPL>::THREADS)
    attn_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q, const T* __restrict__ k,
                    const T* __restrict__ v, Shape s) {
  constexpr int HDP = Cfg<DPL>::HDP, RPW = Cfg<DPL>::RPW;
  DTK_EXTERN_SHARED(float, smem);
  float* Qs = smem;
  float* Ks = Qs + TILE * HDP;
  float* Vs = Ks + TILE * (HDP + 1);
  const int bh = blockIdx.x, qt = blockIdx.y, b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t qp = s.qs, kp = s.ks, op = static_cast<size_t>(s.NH) * s.HD;
  const T* qb = q + static_cast<size_t>(b) * s.T * qp + static_cast<size_t>(h) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * kp + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * kp + static_cast<size_t>(kh) * s.HD;
  tile_load(Qs, HDP, qb, qt * TILE, s.T, qp, s.HD, HDP);

  float m[RPW], l[RPW], o[RPW][DPL];
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < DPL; ++c) o[i][c] = 0.0f;
  }
  const int r0 = warp * RPW;          // first row of this warp within the tile
  const int row0 = qt * TILE + r0;    // its sequence position
  for (int kt = 0; kt <= qt; ++kt) {  // causal: key tiles up to the diagonal
    __syncthreads();
    tile_load(Ks, HDP + 1, kb, kt * TILE, s.T, kp, s.HD, HDP);
    tile_load(Vs, HDP, vb, kt * TILE, s.T, kp, s.HD, HDP);
    __syncthreads();
    const int key = kt * TILE + lane;
    float sc[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) sc[i] = 0.0f;
    for (int d = 0; d < s.HD; ++d) {
      const float kd = Ks[lane * (HDP + 1) + d];
#pragma unroll
      for (int i = 0; i < RPW; ++i) sc[i] += Qs[(r0 + i) * HDP + d] * kd;
    }
    float p[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int row = row0 + i;
      const bool ok = row < s.T && attn_visible(key, row, s.W);
      const float sv = ok ? sc[i] * s.scale : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(sv));
      if (mn == -INFINITY) {  // warp-uniform: nothing visible to this row yet
        p[i] = 0.0f;
        continue;
      }
      p[i] = ok ? expf(sv - mn) : 0.0f;
      const float alpha = expf(m[i] - mn);
      l[i] = l[i] * alpha + warp_sum(p[i]);
#pragma unroll
      for (int c = 0; c < DPL; ++c) o[i][c] *= alpha;
      m[i] = mn;
    }
    for (int j = 0; j < TILE; ++j) {
      float vv[DPL];
#pragma unroll
      for (int c = 0; c < DPL; ++c) vv[c] = Vs[j * HDP + lane + 32 * c];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const float pj = __shfl_sync(FULL, p[i], j);
#pragma unroll
        for (int c = 0; c < DPL; ++c) o[i][c] += pj * vv[c];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int row = row0 + i;
    if (row >= s.T) continue;
    const float inv = 1.0f / l[i];
    T* orow = out + (static_cast<size_t>(b) * s.T + row) * op + static_cast<size_t>(h) * s.HD;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
      const int d = lane + 32 * c;
      if (d < s.HD) orow[d] = from_f32<T>(o[i][c] * inv);
    }
    if (lane == 0) lse[static_cast<size_t>(bh) * s.T + row] = m[i] + logf(l[i]);
  }
}

// ----------------------------------------------------------------------------
// D[b,h,t] = dout . out over HD (one warp per row), the softmax-backward row term.
template <typename T>
__global__ void attn_dvec_kernel(float* __restrict__ D, const T* __restrict__ dout, const T* __restrict__ out,
                                 Shape s) {
  const size_t w = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= static_cast<size_t>(s.B) * s.T * s.NH) return;
  const T* a = dout + w * s.HD;
  const T* o = out + w * s.HD;
  float acc = 0.0f;
  for (int d = lane; d < s.HD; d += 32) acc += to_f32(a[d]) * to_f32(o[d]);
  acc = warp_sum(acc);
  const int h = static_cast<int>(w % s.NH);
  const size_t bt = w / s.NH;
  const int t = static_cast<int>(bt % s.T), b = static_cast<int>(bt / s.T);
  if (lane == 0) D[(static_cast<size_t>(b) * s.NH + h) * s.T + t] = acc;
}

// dq += scale * sum_j ds_ij k_j. Grid (B*NH, T/32). smem: Qs, dOs [32][HDP]; Ks, Vs [32][HDP+1].
template <typename T, int DPL>
__global__ void __launch_bounds__(Cfg<DPL>::THREADS)
    attn_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const float* __restrict__ lse,
                   const float* __restrict__ D, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, Shape s) {
  constexpr int HDP = Cfg<DPL>::HDP, RPW = Cfg<DPL>::RPW;
  DTK_EXTERN_SHARED(float, smem);
  float* Qs = smem;
  float* dOs = Qs + TILE * HDP;
  float* Ks = dOs + TILE * HDP;
  float* Vs = Ks + TILE * (HDP + 1);
  const int bh = blockIdx.x, qt = blockIdx.y, b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t qp = s.qs, kp = s.ks, op = static_cast<size_t>(s.NH) * s.HD;
  const size_t qoff = static_cast<size_t>(b) * s.T * qp + static_cast<size_t>(h) * s.HD;
  const size_t ooff = static_cast<size_t>(b) * s.T * op + static_cast<size_t>(h) * s.HD;
  const size_t koff = static_cast<size_t>(b) * s.T * kp + static_cast<size_t>(kh) * s.HD;
  tile_load(Qs, HDP, q + qoff, qt * TILE, s.T, qp, s.HD, HDP);
  tile_load(dOs, HDP, dout + ooff, qt * TILE, s.T, op, s.HD, HDP);
  const int r0 = warp * RPW, row0 = qt * TILE + r0;
  float lrow[RPW], drow[RPW], acc[RPW][DPL];
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int row = row0 + i;
    lrow[i] = row < s.T ? lse[static_cast<size_t>(bh) * s.T + row] : 0.0f;
    drow[i] = row < s.T ? D[static_cast<size_t>(bh) * s.T + row] : 0.0f;
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[i][c] = 0.0f;
  }
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();
    tile_load(Ks, HDP + 1, k + koff, kt * TILE, s.T, kp, s.HD, HDP);
    tile_load(Vs, HDP + 1, v + koff, kt * TILE, s.T, kp, s.HD, HDP);
    __syncthreads();
    const int key = kt * TILE + lane;
    float sc[RPW], dp[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) sc[i] = dp[i] = 0.0f;
    for (int d = 0; d < s.HD; ++d) {
      const float kd = Ks[lane * (HDP + 1) + d], vd = Vs[lane * (HDP + 1) + d];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        sc[i] += Qs[(r0 + i) * HDP + d] * kd;
        dp[i] += dOs[(r0 + i) * HDP + d] * vd;
      }
    }
    float ds[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int row = row0 + i;
      const bool ok = row < s.T && attn_visible(key, row, s.W);
      const float p = ok ? expf(sc[i] * s.scale - lrow[i]) : 0.0f;
      ds[i] = p * (dp[i] - drow[i]);
    }
    for (int j = 0; j < TILE; ++j) {
      float kk[DPL];
#pragma unroll
      for (int c = 0; c < DPL; ++c) kk[c] = Ks[j * (HDP + 1) + lane + 32 * c];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const float dsj = __shfl_sync(FULL, ds[i], j);
#pragma unroll
        for (int c = 0; c < DPL; ++c) acc[i][c] += dsj * kk[c];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int row = row0 + i;
    if (row >= s.T) continue;
    T* g = dq + qoff + static_cast<size_t>(row) * qp;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
      const int d = lane + 32 * c;
      if (d < s.HD) g[d] = from_f32<T>(s.scale * acc[i][c]);
    }
  }
}

// dk += scale * sum_i ds_ij q_i, dv += sum_i p_ij dout_i over every query head of the KV
// head. Grid (B*NKV, T/32 key tiles). smem: Ks, Vs [32][HDP]; Qs, dOs [32][HDP+1]; lse, D [32].
template <typename T, int DPL>
__global__ void __launch_bounds__(Cfg<DPL>::THREADS)
    attn_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ dout, const float* __restrict__ lse,
                     const float* __restrict__ D, const T* __restrict__ q, const T* __restrict__ k,
                     const T* __restrict__ v, Shape s) {
  constexpr int HDP = Cfg<DPL>::HDP, RPW = Cfg<DPL>::RPW;
  DTK_EXTERN_SHARED(float, smem);
  float* Ks = smem;
  float* Vs = Ks + TILE * HDP;
  float* Qs = Vs + TILE * HDP;
  float* dOs = Qs + TILE * (HDP + 1);
  float* Ls = dOs + TILE * (HDP + 1);
  float* Ds = Ls + TILE;
  const int kt = blockIdx.y, b = blockIdx.x / s.NKV, kh = blockIdx.x % s.NKV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t qp = s.qs, kp = s.ks, op = static_cast<size_t>(s.NH) * s.HD;
  const size_t koff = static_cast<size_t>(b) * s.T * kp + static_cast<size_t>(kh) * s.HD;
  tile_load(Ks, HDP, k + koff, kt * TILE, s.T, kp, s.HD, HDP);
  tile_load(Vs, HDP, v + koff, kt * TILE, s.T, kp, s.HD, HDP);
  const int j0 = warp * RPW;  // this warp's first key within the tile
  const int key0 = kt * TILE + j0;
  float ak[RPW][DPL], av[RPW][DPL];
#pragma unroll
  for (int jj = 0; jj < RPW; ++jj)
#pragma unroll
    for (int c = 0; c < DPL; ++c) ak[jj][c] = av[jj][c] = 0.0f;
  const int ntiles = (s.T + TILE - 1) / TILE;
  for (int h = kh * s.G; h < (kh + 1) * s.G; ++h) {
    const size_t qoff = static_cast<size_t>(b) * s.T * qp + static_cast<size_t>(h) * s.HD;
    const size_t ooff = static_cast<size_t>(b) * s.T * op + static_cast<size_t>(h) * s.HD;
    const size_t bh = static_cast<size_t>(b) * s.NH + h;
    for (int qt = kt; qt < ntiles; ++qt) {  // causal: queries at or after the keys
      __syncthreads();
      tile_load(Qs, HDP + 1, q + qoff, qt * TILE, s.T, qp, s.HD, HDP);
      tile_load(dOs, HDP + 1, dout + ooff, qt * TILE, s.T, op, s.HD, HDP);
      if (threadIdx.x < TILE) {
        const int row = qt * TILE + threadIdx.x;
        Ls[threadIdx.x] = row < s.T ? lse[bh * s.T + row] : 0.0f;
        Ds[threadIdx.x] = row < s.T ? D[bh * s.T + row] : 0.0f;
      }
      __syncthreads();
      const int query = qt * TILE + lane;
      float sc[RPW], dp[RPW];
#pragma unroll
      for (int jj = 0; jj < RPW; ++jj) sc[jj] = dp[jj] = 0.0f;
      for (int d = 0; d < s.HD; ++d) {
        const float qd = Qs[lane * (HDP + 1) + d], dod = dOs[lane * (HDP + 1) + d];
#pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
          sc[jj] += qd * Ks[(j0 + jj) * HDP + d];
          dp[jj] += dod * Vs[(j0 + jj) * HDP + d];
        }
      }
      float p[RPW], ds[RPW];
#pragma unroll
      for (int jj = 0; jj < RPW; ++jj) {
        const bool ok = query < s.T && attn_visible(key0 + jj, query, s.W);
        p[jj] = ok ? expf(sc[jj] * s.scale - Ls[lane]) : 0.0f;
        ds[jj] = p[jj] * (dp[jj] - Ds[lane]);
      }
      for (int i = 0; i < TILE; ++i) {
        float qrow[DPL], drow[DPL];
#pragma unroll
        for (int c = 0; c < DPL; ++c) {
          qrow[c] = Qs[i * (HDP + 1) + lane + 32 * c];
          drow[c] = dOs[i * (HDP + 1) + lane + 32 * c];
        }
#pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
          const float pi = __shfl_sync(FULL, p[jj], i), dsi = __shfl_sync(FULL, ds[jj], i);
#pragma unroll
          for (int c = 0; c < DPL; ++c) {
            av[jj][c] += pi * drow[c];
            ak[jj][c] += dsi * qrow[c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int jj = 0; jj < RPW; ++jj) {
    const int key = key0 + jj;
    if (key >= s.T) continue;
    T* gk = dk + koff + static_cast<size_t>(key) * kp;
    T* gv = dv + koff + static_cast<size_t>(key) * kp;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
      const int d = lane + 32 * c;
      if (d < s.HD) {
        gk[d] = from_f32<T>(s.scale * ak[jj][c]);
        gv[d] = from_f32<T>(av[jj][c]);
      }
    }
  }
}

// ----------------------------------------------------------------------------
Shape shape_check(int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride, int window) {
  DTK_REQUIRE(window >= 0, UsageError, "attention's sliding window must be >= 0 (0: none)");
  DTK_REQUIRE(NKV > 0 && NH > 0 && NH % NKV == 0, UsageError, "attention needs n_head to be a multiple of n_kv_head");
  DTK_REQUIRE(HD > 0 && HD <= 256, UsageError, "attention supports head dimensions 1..256");
  DTK_REQUIRE(B >= 0 && T >= 0, UsageError, "attention needs non-negative batch and sequence sizes");
  DTK_REQUIRE(static_cast<int64_t>(q_stride) >= static_cast<int64_t>(NH) * HD &&
                  static_cast<int64_t>(kv_stride) >= static_cast<int64_t>(NKV) * HD,
              UsageError, "attention row strides must cover n_head (q) and n_kv_head (k, v) heads of head_dim");
  // Grids are (B * heads, T / 32): x holds up to 2^31 - 1 blocks, y only 65535.
  DTK_REQUIRE(static_cast<int64_t>(B) * NH <= 2147483647 && T <= 65535 * TILE, UsageError,
              "attention supports B * n_head < 2^31 and T <= 2097120");
  return Shape{B,
               T,
               NH,
               NKV,
               HD,
               NH / NKV,
               1.0f / std::sqrt(static_cast<float>(HD)),
               static_cast<size_t>(q_stride),
               static_cast<size_t>(kv_stride),
               window};
}

template <typename Kernel>
void smem_allow(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Calls f(std::integral_constant<int, DPL>) for the smallest DPL covering HD.
template <typename F>
void with_dpl(int HD, F&& f) {
  if (HD <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (HD <= 128) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}
}  // namespace

void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride, int kv_stride, DType dtype, cudaStream_t stream, int window) {
  const Shape s = shape_check(B, T, NH, NKV, HD, q_stride, kv_stride, window);
  if (B == 0 || T == 0) return;
  if (dtype != DType::F32) {
    attention_forward_mma(out, lse, q, k, v, s, dtype, stream);
    return;
  }
  using Ty = float;
  with_dpl(HD, [&](auto dpl) {
    constexpr int DPL = decltype(dpl)::value;
    constexpr int HDP = Cfg<DPL>::HDP;
    const size_t bytes = sizeof(float) * TILE * (2 * HDP + HDP + 1);
    auto kernel = attn_fwd_kernel<Ty, DPL>;
    smem_allow(kernel, bytes);
    const dim3 grid(B * NH, blocks_for(T, TILE));
    DTK_LAUNCH(grid, Cfg<DPL>::THREADS, bytes, stream, kernel)
    (static_cast<Ty*>(out), lse, static_cast<const Ty*>(q), static_cast<const Ty*>(k), static_cast<const Ty*>(v), s);
    DT_CUDA_LAUNCH_CHECK();
  });
}

void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* lse,
                        const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                        int q_stride, int kv_stride, DType dtype, cudaStream_t stream, int window) {
  const Shape s = shape_check(B, T, NH, NKV, HD, q_stride, kv_stride, window);
  if (B == 0 || T == 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  Scratch dvec(rows * sizeof(float), stream);
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    DTK_LAUNCH(blocks_for(rows * 32, 256), 256, 0, stream, attn_dvec_kernel<Ty>)
    (dvec.as<float>(), static_cast<const Ty*>(dout), static_cast<const Ty*>(out), s);
    DT_CUDA_LAUNCH_CHECK();
  });
  if (dtype != DType::F32) {
    attention_backward_mma(dq, dk, dv, dout, lse, dvec.as<float>(), q, k, v, s, dtype, stream);
    return;
  }
  using Ty = float;
  with_dpl(HD, [&](auto dpl) {
    constexpr int DPL = decltype(dpl)::value;
    constexpr int HDP = Cfg<DPL>::HDP;
    const size_t bytes = sizeof(float) * TILE * (2 * HDP + 2 * (HDP + 1));
    auto kq = attn_dq_kernel<Ty, DPL>;
    smem_allow(kq, bytes);
    DTK_LAUNCH(dim3(B * NH, blocks_for(T, TILE)), Cfg<DPL>::THREADS, bytes, stream, kq)
    (static_cast<Ty*>(dq), static_cast<const Ty*>(dout), lse, dvec.as<float>(), static_cast<const Ty*>(q),
     static_cast<const Ty*>(k), static_cast<const Ty*>(v), s);
    DT_CUDA_LAUNCH_CHECK();
    auto kkv = attn_dkdv_kernel<Ty, DPL>;
    const size_t bytes_kv = bytes + sizeof(float) * 2 * TILE;
    smem_allow(kkv, bytes_kv);
    DTK_LAUNCH(dim3(B * NKV, blocks_for(T, TILE)), Cfg<DPL>::THREADS, bytes_kv, stream, kkv)
    (static_cast<Ty*>(dk), static_cast<Ty*>(dv), static_cast<const Ty*>(dout), lse, dvec.as<float>(),
     static_cast<const Ty*>(q), static_cast<const Ty*>(k), static_cast<const Ty*>(v), s);
    DT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace dtrain::kernels
