// Flash attention on CUDA cores for fp32 (bf16 and fp16 run on tensor cores: attention_mma.cu).
// fp32 math in shared memory: 32-row
// query tiles x 32-key tiles. A warp owns RPW rows (queries in forward/dq, keys in
// dk/dv); in the score phase lane j takes key (or query) j of the tile, so dot products
// need no shuffles, and the warp writes its probabilities (and dS) to shared memory, read
// back as broadcasts in the accumulation phase, where lane l owns dimensions l, l+32, ...
// (one __syncwarp a tile instead of a shuffle per row and key). Rows read by lane index
// are padded by one float in shared memory (no bank conflicts). Template DPL = head
// dimensions per lane (2, 4, 8: HD <= 64, 128, 256) keeps the accumulators in registers.
// Only tile pairs some row sees are walked: forward and dQ start at the key tile of their
// first row's first visible key (attn_lo: sliding window, packed documents), dK/dV stop at
// the query tile of the last query that sees their last key (attn_hi).
// The backward at DPL 8 asks up to 139,776 B with 32-row tiles, over the 99 KB opt-in limit
// of sm_86/sm_89 cards (L40S, A10, RTX 4090): there (picked at run time from the device's
// opt-in size) its kernels take 16 rows on the warp side (queries in dQ, keys in dK/dV; the
// lane side stays 32 wide), 100,608 B at most, as 8 warps of 2 rows (with 4 rows a warp, in 4
// warps, ptxas caps sm_100/sm_120 at 96 registers and spills).
#include "kernels/attention.cuh"

#include "kernels/attention_internal.cuh"
#include "kernels/common.cuh"

#include <cmath>
#include <string>
#include <type_traits>

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr unsigned FULL = 0xffffffffu;
constexpr int TILE = 32;

template <int DPL, bool SMALL = false>
struct Cfg {
  static constexpr int HDP = DPL * 32;                              // padded head dim
  static constexpr int RPW = (DPL == 8 ? 4 : 8) / (SMALL ? 2 : 1);  // rows per warp (register budget)
  static constexpr int ROWS = SMALL ? 16 : TILE;                    // warp-side rows per block
  static constexpr int NW = ROWS / RPW;                             // warps per block
  static constexpr int THREADS = NW * 32;
  // Blocks per SM the register budget is designed for: 128 registers a thread (REG_TARGETS in
  // scripts/kernel_resources.py), the dQ kernel's minimum for ptxas, which without it spills
  // on sm_80/sm_90 to fit more blocks than that. Not on sm_100/sm_120, where it fits without
  // spilling and the minimum would make it spill.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  static constexpr int MIN_BLOCKS = 0;  // no minimum
#else
  static constexpr int MIN_BLOCKS = 65536 / 128 / THREADS;
#endif
};

using Shape = AttnShape;

// Dynamic shared memory of the backward's kernels: dQ holds ROWS query rows and 32 key rows
// of K and V, and its dS rows ([ROWS][32]); dK/dV holds ROWS key rows and 32 query rows of Q
// and dO, plus lse and D, and its P and dS rows ([ROWS][32] each) where those fit: not in the
// 16-row variant at head dim 256 (DPL 8), sized for a 99 KB card, whose dK/dV broadcasts them
// with shuffles instead.
// The forward's: Q, K, V tiles and, where that stays within a 99 KB card's opt-in size (head
// dims up to 128, DPL 2 and 4), its probabilities ([32][32]); at DPL 8 they are broadcast
// with shuffles.
template <int DPL>
constexpr size_t fwd_base_bytes() {
  return sizeof(float) * TILE * (3 * Cfg<DPL>::HDP + 1);
}
template <int DPL>
constexpr bool fwd_staged() {
  return fwd_base_bytes<DPL>() + sizeof(float) * TILE * TILE <= 99 * 1024;
}
template <int DPL>
constexpr size_t fwd_bytes() {
  return fwd_base_bytes<DPL>() + (fwd_staged<DPL>() ? sizeof(float) * TILE * TILE : 0);
}
static_assert(fwd_staged<4>() && !fwd_staged<8>());

template <int DPL, bool SMALL>
constexpr size_t dq_bytes() {
  constexpr size_t HDP = Cfg<DPL, SMALL>::HDP, ROWS = Cfg<DPL, SMALL>::ROWS;
  return sizeof(float) * (2 * ROWS * HDP + 2 * TILE * (HDP + 1) + ROWS * TILE);
}
template <int DPL, bool SMALL>
constexpr size_t dkdv_base_bytes() {
  constexpr size_t HDP = Cfg<DPL, SMALL>::HDP, ROWS = Cfg<DPL, SMALL>::ROWS;
  return sizeof(float) * (2 * ROWS * HDP + 2 * TILE * (HDP + 1) + 2 * TILE);
}
template <int DPL, bool SMALL>
constexpr bool dkdv_staged() {
  constexpr size_t staged = dkdv_base_bytes<DPL, SMALL>() + sizeof(float) * 2 * Cfg<DPL, SMALL>::ROWS * TILE;
  return !SMALL || staged <= 99 * 1024;
}
template <int DPL, bool SMALL>
constexpr size_t dkdv_bytes() {
  return dkdv_base_bytes<DPL, SMALL>() +
         (dkdv_staged<DPL, SMALL>() ? sizeof(float) * 2 * Cfg<DPL, SMALL>::ROWS * TILE : 0);
}
static_assert(!dkdv_staged<8, true>() && dkdv_staged<8, false>());
static_assert(dq_bytes<8, true>() <= 99 * 1024 && dkdv_bytes<8, true>() <= 99 * 1024);

// dst[r * stride + d] = src[(row0 + r) * pitch + d] for r < rows, d < HDP; zero past T or HD.
template <typename T>
__device__ __forceinline__ void tile_load(float* dst, int stride, const T* src, int row0, int T_, size_t pitch, int HD,
                                          int HDP, int rows = TILE) {
  for (int idx = threadIdx.x; idx < rows * HDP; idx += blockDim.x) {
    const int r = idx / HDP, d = idx - r * HDP, t = row0 + r;
    dst[r * stride + d] = (t < T_ && d < HD) ? to_f32(src[static_cast<size_t>(t) * pitch + d]) : 0.0f;
  }
}

// ----------------------------------------------------------------------------
// Forward: grid (B*NH, T/32 query tiles); B*NH goes in x because it may exceed 65535,
// grid.y's limit. smem: Qs [32][HDP], Ks [32][HDP+1], Vs [32][HDP], Ps [32][32] (probabilities, fwd_staged).
template <typename T, int DPL>
__global__ void __launch_bounds__(Cfg<DPL>::THREADS)
    attn_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q, const T* __restrict__ k,
                    const T* __restrict__ v, Shape s) {
  constexpr int HDP = Cfg<DPL>::HDP, RPW = Cfg<DPL>::RPW;
  constexpr bool STAGED = fwd_staged<DPL>();
  DTK_EXTERN_SHARED(float, smem);
  float* Qs = smem;
  float* Ks = Qs + TILE * HDP;
  float* Vs = Ks + TILE * (HDP + 1);
  float* Ps = Vs + TILE * HDP;  // [TILE][TILE]: row r's probabilities of the key tile (STAGED)
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
  const int r0 = warp * RPW;        // first row of this warp within the tile
  const int row0 = qt * TILE + r0;  // its sequence position
  // Lane i < RPW holds row row0 + i's first visible key (attn_lo), shuffled to the warp per
  // row (one register, not RPW).
  const int lo_lane = lane < RPW && row0 + lane < s.T ? attn_lo(s, b, row0 + lane) : 0;
  // Key tiles from the one holding the tile's first row's lo (the tile's smallest: no row sees
  // an earlier one) up to the diagonal (causal).
  for (int kt = attn_lo(s, b, qt * TILE) / TILE; kt <= qt; ++kt) {
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
    float* Pw = Ps + r0 * TILE;  // this warp's rows
    float p[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int row = row0 + i;
      const bool ok = row < s.T && attn_visible(key, row, __shfl_sync(FULL, lo_lane, i));
      const float sv = ok ? sc[i] * s.scale : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(sv));
      if (mn == -INFINITY) {  // warp-uniform: nothing visible to this row yet
        p[i] = 0.0f;
      } else {
        p[i] = ok ? expf(sv - mn) : 0.0f;
        const float alpha = expf(m[i] - mn);
        l[i] = l[i] * alpha + warp_sum(p[i]);
#pragma unroll
        for (int c = 0; c < DPL; ++c) o[i][c] *= alpha;
        m[i] = mn;
      }
      if constexpr (STAGED) Pw[i * TILE + lane] = p[i];
    }
    // The warp's probabilities, read back as broadcasts (the next tile's writes follow the
    // loop's __syncthreads).
    if constexpr (STAGED) __syncwarp();
    for (int j = 0; j < TILE; ++j) {
      float vv[DPL];
#pragma unroll
      for (int c = 0; c < DPL; ++c) vv[c] = Vs[j * HDP + lane + 32 * c];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        float pj;
        if constexpr (STAGED) {
          pj = Pw[i * TILE + j];
        } else {
          pj = __shfl_sync(FULL, p[i], j);
        }
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

// dq += scale * sum_j ds_ij k_j. Grid (B*NH, T/ROWS). smem: Qs, dOs [ROWS][HDP]; Ks, Vs [32][HDP+1];
// dS [ROWS][32].
template <typename T, int DPL, bool SMALL>
__global__ void __launch_bounds__(Cfg<DPL, SMALL>::THREADS, Cfg<DPL, SMALL>::MIN_BLOCKS)
    attn_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const float* __restrict__ lse,
                   const float* __restrict__ D, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, Shape s) {
  constexpr int HDP = Cfg<DPL, SMALL>::HDP, RPW = Cfg<DPL, SMALL>::RPW, ROWS = Cfg<DPL, SMALL>::ROWS;
  DTK_EXTERN_SHARED(float, smem);
  float* Qs = smem;
  float* dOs = Qs + ROWS * HDP;
  float* Ks = dOs + ROWS * HDP;
  float* Vs = Ks + TILE * (HDP + 1);
  const int bh = blockIdx.x, qt = blockIdx.y, b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* dSw = Vs + TILE * (HDP + 1) + warp * RPW * TILE;  // this warp's rows of dS [ROWS][TILE]
  const size_t qp = s.qs, kp = s.ks, op = static_cast<size_t>(s.NH) * s.HD;
  const size_t qoff = static_cast<size_t>(b) * s.T * qp + static_cast<size_t>(h) * s.HD;
  const size_t ooff = static_cast<size_t>(b) * s.T * op + static_cast<size_t>(h) * s.HD;
  const size_t koff = static_cast<size_t>(b) * s.T * kp + static_cast<size_t>(kh) * s.HD;
  tile_load(Qs, HDP, q + qoff, qt * ROWS, s.T, qp, s.HD, HDP, ROWS);
  tile_load(dOs, HDP, dout + ooff, qt * ROWS, s.T, op, s.HD, HDP, ROWS);
  const int r0 = warp * RPW, row0 = qt * ROWS + r0;
  float acc[RPW][DPL];
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[i][c] = 0.0f;
  }
  // Lane i < RPW holds row row0 + i's lse, D and first visible key (attn_lo), shuffled to the
  // warp per row: three registers across the key loop, not 3 * RPW.
  float lse_lane = 0.0f, d_lane = 0.0f;
  int lo_lane = 0;
  if (lane < RPW && row0 + lane < s.T) {
    const int row = row0 + lane;
    lse_lane = lse[static_cast<size_t>(bh) * s.T + row];
    d_lane = D[static_cast<size_t>(bh) * s.T + row];
    lo_lane = attn_lo(s, b, row);
  }
  // Key tiles from the one holding the block's first row's lo (its smallest) up to the one
  // holding its last row (causal).
  const int last_kt = (qt * ROWS + ROWS - 1) / TILE;
  for (int kt = attn_lo(s, b, qt * ROWS) / TILE; kt <= last_kt; ++kt) {
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
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int row = row0 + i, lo = __shfl_sync(FULL, lo_lane, i);
      const float lrow = __shfl_sync(FULL, lse_lane, i), drow = __shfl_sync(FULL, d_lane, i);
      const bool ok = row < s.T && attn_visible(key, row, lo);
      const float p = ok ? expf(sc[i] * s.scale - lrow) : 0.0f;
      dSw[i * TILE + lane] = p * (dp[i] - drow);
    }
    __syncwarp();  // read back as broadcasts; the next tile's writes follow its __syncthreads
    for (int j = 0; j < TILE; ++j) {
      float kk[DPL];
#pragma unroll
      for (int c = 0; c < DPL; ++c) kk[c] = Ks[j * (HDP + 1) + lane + 32 * c];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const float dsj = dSw[i * TILE + j];
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
// head. Grid (B*NKV, T/ROWS key tiles). smem: Ks, Vs [ROWS][HDP]; Qs, dOs [32][HDP+1]; lse, D [32];
// P, dS [ROWS][32] (dkdv_staged).
template <typename T, int DPL, bool SMALL>
__global__ void __launch_bounds__(Cfg<DPL, SMALL>::THREADS)
    attn_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ dout, const float* __restrict__ lse,
                     const float* __restrict__ D, const T* __restrict__ q, const T* __restrict__ k,
                     const T* __restrict__ v, Shape s) {
  constexpr int HDP = Cfg<DPL, SMALL>::HDP, RPW = Cfg<DPL, SMALL>::RPW, ROWS = Cfg<DPL, SMALL>::ROWS;
  constexpr bool STAGED = dkdv_staged<DPL, SMALL>();
  DTK_EXTERN_SHARED(float, smem);
  float* Ks = smem;
  float* Vs = Ks + ROWS * HDP;
  float* Qs = Vs + ROWS * HDP;
  float* dOs = Qs + TILE * (HDP + 1);
  float* Ls = dOs + TILE * (HDP + 1);
  float* Ds = Ls + TILE;
  const int kt = blockIdx.y, b = blockIdx.x / s.NKV, kh = blockIdx.x % s.NKV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This warp's keys' P and dS over the query tile ([ROWS][TILE] each), where they fit.
  float* Pw = Ds + TILE + warp * RPW * TILE;
  float* dSw = Pw + ROWS * TILE;
  const size_t qp = s.qs, kp = s.ks, op = static_cast<size_t>(s.NH) * s.HD;
  const size_t koff = static_cast<size_t>(b) * s.T * kp + static_cast<size_t>(kh) * s.HD;
  tile_load(Ks, HDP, k + koff, kt * ROWS, s.T, kp, s.HD, HDP, ROWS);
  tile_load(Vs, HDP, v + koff, kt * ROWS, s.T, kp, s.HD, HDP, ROWS);
  const int j0 = warp * RPW;  // this warp's first key within the tile
  const int key0 = kt * ROWS + j0;
  float ak[RPW][DPL], av[RPW][DPL];
  int hi[RPW];  // the last query that sees each key (attn_hi; -1 past T: none)
#pragma unroll
  for (int jj = 0; jj < RPW; ++jj) {
    hi[jj] = key0 + jj < s.T ? attn_hi(s, b, key0 + jj) : -1;
#pragma unroll
    for (int c = 0; c < DPL; ++c) ak[jj][c] = av[jj][c] = 0.0f;
  }
  // Query tiles from the one holding the block's first key (causal) up to the one holding the
  // last query that sees its last key: a later tile's first row, the tile's smallest lo, is
  // past every key of the block.
  const int first_qt = kt * ROWS / TILE;
  const int last_qt = attn_hi(s, b, kt * ROWS + ROWS - 1 < s.T ? kt * ROWS + ROWS - 1 : s.T - 1) / TILE;
  for (int h = kh * s.G; h < (kh + 1) * s.G; ++h) {
    const size_t qoff = static_cast<size_t>(b) * s.T * qp + static_cast<size_t>(h) * s.HD;
    const size_t ooff = static_cast<size_t>(b) * s.T * op + static_cast<size_t>(h) * s.HD;
    const size_t bh = static_cast<size_t>(b) * s.NH + h;
    for (int qt = first_qt; qt <= last_qt; ++qt) {
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
        // attn_visible(key, query, attn_lo(query)), which is key <= query <= attn_hi(key)
        const bool ok = key0 + jj <= query && query <= hi[jj];
        p[jj] = ok ? expf(sc[jj] * s.scale - Ls[lane]) : 0.0f;
        ds[jj] = p[jj] * (dp[jj] - Ds[lane]);
        if constexpr (STAGED) {
          Pw[jj * TILE + lane] = p[jj];
          dSw[jj * TILE + lane] = ds[jj];
        }
      }
      if constexpr (STAGED) __syncwarp();  // read back as broadcasts (next writes: after __syncthreads)
      for (int i = 0; i < TILE; ++i) {
        float qrow[DPL], drow[DPL];
#pragma unroll
        for (int c = 0; c < DPL; ++c) {
          qrow[c] = Qs[i * (HDP + 1) + lane + 32 * c];
          drow[c] = dOs[i * (HDP + 1) + lane + 32 * c];
        }
#pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
          float pi, dsi;
          if constexpr (STAGED) {
            pi = Pw[jj * TILE + i];
            dsi = dSw[jj * TILE + i];
          } else {
            pi = __shfl_sync(FULL, p[jj], i);
            dsi = __shfl_sync(FULL, ds[jj], i);
          }
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
Shape shape_check(int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride, int window,
                  const int32_t* doc_start) {
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
               window,
               doc_start};
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

template <typename Ty, int DPL, bool SMALL>
void backward_run(void* dq, void* dk, void* dv, const void* dout, const float* lse, const float* dvec, const void* q,
                  const void* k, const void* v, const Shape& s, cudaStream_t stream) {
  using C = Cfg<DPL, SMALL>;
  constexpr size_t bytes = dq_bytes<DPL, SMALL>(), bytes_kv = dkdv_bytes<DPL, SMALL>();
  const dim3 grid_q(s.B * s.NH, blocks_for(s.T, C::ROWS)), grid_kv(s.B * s.NKV, blocks_for(s.T, C::ROWS));
  auto kq = attn_dq_kernel<Ty, DPL, SMALL>;
  smem_allow(kq, bytes);
  DTK_LAUNCH(grid_q, C::THREADS, bytes, stream, kq)
  (static_cast<Ty*>(dq), static_cast<const Ty*>(dout), lse, dvec, static_cast<const Ty*>(q), static_cast<const Ty*>(k),
   static_cast<const Ty*>(v), s);
  DT_CUDA_LAUNCH_CHECK();
  auto kkv = attn_dkdv_kernel<Ty, DPL, SMALL>;
  smem_allow(kkv, bytes_kv);
  DTK_LAUNCH(grid_kv, C::THREADS, bytes_kv, stream, kkv)
  (static_cast<Ty*>(dk), static_cast<Ty*>(dv), static_cast<const Ty*>(dout), lse, dvec, static_cast<const Ty*>(q),
   static_cast<const Ty*>(k), static_cast<const Ty*>(v), s);
  DT_CUDA_LAUNCH_CHECK();
}

// The CUDA-core backward: 32-row tiles, or 16 on the warp side where those exceed the
// device's opt-in shared memory (DPL 8 on sm_86/sm_89 cards). bf16/fp16 rows come here only
// where the tensor-core backward does not fit (under its 135,680 B), where the 32-row tiles'
// 131,584 B do not either: only the 16-row variant is compiled for them.
template <typename Ty, int DPL>
void backward_cc(void* dq, void* dk, void* dv, const void* dout, const float* lse, const float* dvec, const void* q,
                 const void* k, const void* v, const Shape& s, cudaStream_t stream) {
  constexpr size_t large = dkdv_bytes<DPL, false>();
  constexpr bool only_small = !std::is_same_v<Ty, float>;
  if constexpr (only_small || large > 99 * 1024) {  // over an sm_86/sm_89 card's opt-in size
    constexpr size_t small = dkdv_bytes<DPL, true>();
    const size_t limit = attention_smem_optin();
    if (only_small || large > limit) {
      DTK_REQUIRE(small <= limit, DeviceError,
                  "the CUDA-core attention backward at head dim " + std::to_string(s.HD) + " needs " +
                      std::to_string(small) + " bytes of shared memory per block; this GPU allows " +
                      std::to_string(limit) + " (use a head dim of at most 128 on this card)");
      constexpr int max_t = 65535 * Cfg<DPL, true>::ROWS;  // grid.y's limit with 16-row tiles
      DTK_REQUIRE(s.T <= max_t, UsageError,
                  "the attention backward at head dims 129-256 on this GPU supports T <= " + std::to_string(max_t));
      backward_run<Ty, DPL, true>(dq, dk, dv, dout, lse, dvec, q, k, v, s, stream);
      return;
    }
  }
  if constexpr (!only_small) backward_run<Ty, DPL, false>(dq, dk, dv, dout, lse, dvec, q, k, v, s, stream);
}
}  // namespace

namespace detail {
bool attention_largest_tiles(int HD, DType dtype) {
  if (dtype != DType::F32) return attention_mma_largest_tiles(HD, dtype);
  bool large = false;
  with_dpl(HD, [&](auto dpl) { large = dkdv_bytes<decltype(dpl)::value, false>() <= attention_smem_optin(); });
  return large;
}
}  // namespace detail

void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride, int kv_stride, DType dtype, cudaStream_t stream, int window,
                       const int32_t* doc_start) {
  const Shape s = shape_check(B, T, NH, NKV, HD, q_stride, kv_stride, window, doc_start);
  if (B == 0 || T == 0) return;
  if (dtype != DType::F32) {
    // The hopper variant's wgmma forward where it runs; elsewhere (and otherwise) mma.sync.
    if (attention_variant() == AttnVariant::HOPPER && attention_forward_hopper(out, lse, q, k, v, s, dtype, stream))
      return;
    attention_forward_mma(out, lse, q, k, v, s, dtype, stream);
    return;
  }
  using Ty = float;
  with_dpl(HD, [&](auto dpl) {
    constexpr int DPL = decltype(dpl)::value;
    const size_t bytes = fwd_bytes<DPL>();
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
                        int q_stride, int kv_stride, DType dtype, cudaStream_t stream, int window,
                        const int32_t* doc_start) {
  const Shape s = shape_check(B, T, NH, NKV, HD, q_stride, kv_stride, window, doc_start);
  if (B == 0 || T == 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  Scratch dvec(rows * sizeof(float), stream);
  dispatch(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    DTK_LAUNCH(blocks_for(rows * 32, 256), 256, 0, stream, attn_dvec_kernel<Ty>)
    (dvec.as<float>(), static_cast<const Ty*>(dout), static_cast<const Ty*>(out), s);
    DT_CUDA_LAUNCH_CHECK();
  });
  if (dtype != DType::F32 && (HD <= 128 || attention_backward_mma_fits(HD, dtype))) {
    attention_backward_mma(dq, dk, dv, dout, lse, dvec.as<float>(), q, k, v, s, dtype, stream);
    return;
  }
  if (dtype != DType::F32) {  // head dims 129-256 where the tensor-core backward does not fit
    dispatch(dtype, [&](auto tag) {
      using Ty = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<Ty, float>)
        backward_cc<Ty, 8>(dq, dk, dv, dout, lse, dvec.as<float>(), q, k, v, s, stream);
    });
    return;
  }
  with_dpl(HD, [&](auto dpl) {
    backward_cc<float, decltype(dpl)::value>(dq, dk, dv, dout, lse, dvec.as<float>(), q, k, v, s, stream);
  });
}

AttnForwardKernels attention_forward_kernels(int HD, DType dtype) {
  if (dtype == DType::F32) return {"cuda-core", "-", ""};
  const AttnVariant v = attention_variant();
  if (v == AttnVariant::LEGACY) return {"legacy", "legacy", ""};
  if (v == AttnVariant::FA2) return {"fa2", "fa2", ""};
  std::string why = attention_hopper_unavailable(HD, dtype);
  if (why.empty()) return {"hopper", "hopper", ""};
  return {"fa2", "hopper", std::move(why)};
}

}  // namespace dtrain::kernels
