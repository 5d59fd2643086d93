// Flash attention on tensor cores (bf16 / fp16 in, fp32 accumulate), FlashAttention-2's
// algorithm on mma.sync m16n8k16 with ldmatrix (kernels/mma.cuh). Tiles are 64 queries x 64
// keys, 4 warps per block, each warp owning 16 rows (the fa2 variant's forward and dQ: 128
// queries, 32 rows a warp, where they fit); shared-memory rows are padded by 8 elements (16
// bytes) so the 8 row addresses of an ldmatrix fall in different bank groups.
// Every kernel has a two-stage variant (the next tile's cp.async loads in flight while the
// current one is computed) and, for the head dims where two stages exceed a card's opt-in
// shared memory (A100 163 KB, sm_86/sm_89 99 KB), a one-stage variant: the variant is picked
// at run time from cudaDeviceProp::sharedMemPerBlockOptin.
//
// The forward is kernels/attention_mma_fwd.cu; the tile machinery both use, kernels/
// attention_mma_tiles.cuh. This file: the backward, the variant and shared-memory choices
// (tests' hooks included).
//
// Backward, two kernels, each block one 64-row tile, longest first (the H200 measured the
// earlier one-kernel design, one block per head walking every key tile with an fp32 dQ partial
// read-modify-written per tile pair, at 39 TFLOP/s: 384 blocks of 4 warps, 10 GB of partial
// traffic per GPT-2 step):
// - dK/dV: block = (batch*head, key tile); for the query tiles from it to the last one that
//   sees it (a sliding window or packed documents end that early), S^T = K Q^T and
//   dP^T = V dO^T (warp = 16 keys), P^T = exp(S^T - lse), dS^T = P^T (dP^T - D), dV += P^T dO
//   and dK += dS^T Q with P^T / dS^T reused in registers.
// - dQ: block = (batch*head, query tile); for the key tiles from the first its rows see up to
//   it, S = Q K^T and dP = dO V^T (warp = 16 queries), P and dS as above, dQ += dS K. Under the
//   fa2 variant at head dim 64 the tile is 128 queries, each warp's two 16-row slices sharing
//   the K fragments of dQ += dS K.
// S and dP are computed twice (7 tile products instead of FlashAttention-2's 5), which buys
// what FlashAttention-2's dQ atomics would cost: every output has one writer, so the result is
// deterministic, and no fp32 dQ buffer. With grouped KV heads a dK/dV block is one KV head's key
// tile and walks the query tiles of its query heads in head order, summing into the same
// registers: with split = 1 all G of them (no fp32 buffers, no reduction kernel); where that
// would leave the grid's tail to a few long blocks (small batch, short T: see
// ops::attention_dkdv_split) G / split of them, each block writing fp32 partials that a third
// kernel sums in split order.
#include "kernels/attention_mma_tiles.cuh"

#include "core/env.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

namespace dtrain::kernels::detail {

namespace {

using namespace mma;

// ----------------------------------------------------------------------------
// Backward, dK/dV. smem: Ks, Vs, then STAGES stages of Qs, dOs [64][PITCH] of T and of Ls, Ds
// [64] fp32 (with two, the next query tile's loads are in flight while the current one is
// computed). Block = ((batch * KV head) * split + part, key tile); the part's G / split query
// heads of the KV head follow each other through the same pipeline (head-major over the query
// tiles), so their dK and dV sum in registers, in head order, and are written once: strided in
// T (split 1), or as fp32 partials dk_part, dv_part [B * NKV * split][T][HD] for
// attn_dkv_reduce_kernel.
// At head dim 256 it holds one block per SM (shared memory) and spills whatever it does (dK, dV
// of 16 keys x 256 per warp); the minimum of 1 keeps ptxas from spilling more to fit blocks that
// cannot come (sm_80: 168 registers and 3.2 KB of spill loads without it). At head dim 64 the
// minimum of 3 holds it to 168 registers, 3 blocks per SM (65536 / (3 x 128), in steps of 8), at
// 32 the minimum of 4 to 128 (4 blocks; shared memory allows both), which every architecture
// reaches without spilling.
// Which head dims skip the mask on the tiles it does not cut: the branch costs registers, and
// ptxas spills with it at head dims 32 (116 bytes at 128 registers), 256 (about 800 bytes
// more) and 64 on sm_80 (12 bytes at 168), none at 64 on sm_90 nor at 128.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
template <int HDP>
constexpr bool kDkdvMaskCutOnly = HDP == 128;
#else
template <int HDP>
constexpr bool kDkdvMaskCutOnly = HDP == 64 || HDP == 128;
#endif
template <typename T, int HDP, int STAGES>
__global__ void __launch_bounds__(THREADS, HDP == 128 ? 0 : dkdv_blocks_per_sm(HDP))
    attn_bwd_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dk_part,
                         float* __restrict__ dv_part, const T* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ Dvec, const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, Args a) {
  using TL = Tiles<HDP>;
  constexpr int P = TL::PITCH, DN = TL::DN;
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(float, smem_raw);
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Vs = Ks + TL::ELEMS;
  T* QO = Vs + TL::ELEMS;  // stage i: Qs = QO + 2 i ELEMS, dOs = Qs + ELEMS
  float* LD =
      reinterpret_cast<float*>(QO + 2 * STAGES * TL::ELEMS);  // stage i: Ls = LD + 2 i BM, Ds = Ls + BM (lse, D)
  // Longest first: key tile 0 sees every query tile, and blocks start in index order.
  const int bk = blockIdx.x / a.split, kt = blockIdx.y, b = bk / s.NKV, kh = bk % s.NKV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, mi = lane >> 3;
  const size_t op = static_cast<size_t>(s.NH) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const float sl2 = s.scale * LOG2E;
  // Query tiles from the keys' own (causal) up to the one holding the last query that sees the
  // tile's last key: a later tile's first row, the tile's smallest lo, is past every key here.
  // The same for every query head of the group, walked head by head: heads h0 .. h_last.
  const int last_qt = attn_hi(s, b, kt * BN + BN - 1 < s.T ? kt * BN + BN - 1 : s.T - 1) / BM;
  const int gs = s.G / a.split, h0 = kh * s.G + static_cast<int>(blockIdx.x % a.split) * gs, h_last = h0 + gs - 1;
  // Issues the loads of query head h's tile qt into stage st: Q, dO, lse and D by cp.async
  // (lse and D for a whole tile of 16-byte aligned rows; else stored directly), all in the
  // step's group: no thread waits on a global load before the current tile's work.
  // The batch row's bases of q, dout, lse and D: held across the loop at head dim 32, computed
  // per step above it, which leaves the accumulators eight registers more (ptxas spills at head
  // dims 64 and 128 on sm_90 with them held, and at 32 on sm_90 without).
  struct Bases {
    const T *q, *o;
    const float *l, *d;
  };
  auto row_bases = [&] {
    return Bases{q + static_cast<size_t>(b) * s.T * s.qs, dout + static_cast<size_t>(b) * s.T * op,
                 lse + static_cast<size_t>(b) * s.NH * s.T, Dvec + static_cast<size_t>(b) * s.NH * s.T};
  };
  const Bases held = row_bases();  // unused (and dropped) above head dim 32
  auto load_step = [&](int h, int qt, int st) {
    const Bases bs = HDP <= 32 ? held : row_bases();
    T* qs = QO + st * 2 * TL::ELEMS;
    tile_load_async<T, HDP>(qs, bs.q + h * s.HD, qt * BM, s.T, s.qs, s.HD, a.vec);
    tile_load_async<T, HDP>(qs + TL::ELEMS, bs.o + h * s.HD, qt * BM, s.T, op, s.HD, a.vec);
    float* ls = LD + st * 2 * BM;
    const int row0 = qt * BM;
    if (a.rows_vec && row0 + BM <= s.T) {
      if (threadIdx.x < BM / 2) {  // 16 chunks of 4 floats of lse, then 16 of D
        const int c = (threadIdx.x & (BM / 4 - 1)) * 4;
        const bool d = threadIdx.x >= BM / 4;
        cp_async_16(ls + (d ? BM : 0) + c, (d ? bs.d : bs.l) + h * s.T + row0 + c);
      }
    } else if (threadIdx.x < BM) {
      const int row = row0 + threadIdx.x;
      ls[threadIdx.x] = row < s.T ? bs.l[h * s.T + row] : 0.0f;
      ls[BM + threadIdx.x] = row < s.T ? bs.d[h * s.T + row] : 0.0f;
    }
  };

  tile_load_async<T, HDP>(Ks, kb, kt * BN, s.T, s.ks, s.HD, a.vec);
  tile_load_async<T, HDP>(Vs, vb, kt * BN, s.T, s.ks, s.HD, a.vec);
  load_step(h0, kt, 0);
  cp_async_commit();
  float dka[DN][4], dva[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn)
#pragma unroll
    for (int i = 0; i < 4; ++i) dka[dn][i] = dva[dn][i] = 0.0f;
  const int key0 = kt * BN + warp * 16 + g;  // this thread's keys: key0 and key0 + 8
  // The last queries that see them (attn_hi; -1 past T), kept in shared memory, not in two
  // registers live across the loop: in the 16 bytes of padding that end Ks's row warp * 16 + g
  // (nothing reads a row's padding). Lanes tq = 0, 1 of the quad write entries 0, 1.
  int* his = reinterpret_cast<int*>(Ks + (warp * 16 + g) * P + HDP);
  // Entry 2 (lane tq = 2): the tile's least attn_hi, its first key's (< T), the mask test's.
  if (tq < 2) his[tq] = key0 + tq * 8 < s.T ? attn_hi(s, b, key0 + tq * 8) : -1;
  if (kDkdvMaskCutOnly<HDP> && tq == 2) his[2] = attn_hi(s, b, kt * BN);

  // Step by step: (h, qt) from (h0, kt), the tiles of one head before the next head's; stage
  // alternates with each step.
  int stage = 0;
  for (int h = h0, qt = kt; h <= h_last; stage ^= STAGES - 1) {
    const T* Qs = QO + stage * 2 * TL::ELEMS;
    const T* dOs = Qs + TL::ELEMS;
    const float* Ls = LD + stage * 2 * BM;
    const float* Ds = Ls + BM;
    const bool head_end = qt == last_qt;
    if constexpr (STAGES == 2) {
      if (!head_end || h < h_last) {  // the other stage was released by the previous step's last barrier
        load_step(head_end ? h + 1 : h, head_end ? kt : qt + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else {
      if (h != h0 || qt != kt) {
        load_step(h, qt, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's part of this tile has landed

    // S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x 64 queries per warp.
    float st[8][4], dpt[8][4];
    paired_products<T, HDP>(st, dpt, Ks, Vs, Qs, dOs, warp * 16, lane);
    // P^T = exp(S^T * scale - lse) (0 where masked), dS^T = P^T (dP^T - D). Only a tile the
    // mask cuts computes it (uniform over the block): the diagonal tile (queries before keys) and
    // one with queries past the first key's attn_hi (the least: attn_hi is non-decreasing in the
    // key), which covers a window, packed documents, queries past T and keys past T (hi -1,
    // only in the last key tile, whose walk is its diagonal tile alone).
    if (!kDkdvMaskCutOnly<HDP> || a.mask_every_tile || qt == kt || qt * BM + BM - 1 > his[2]) {
      const int2 hi2 = *reinterpret_cast<const int2*>(his);  // written before the barrier above
      const int hi[2] = {hi2.x, hi2.y};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = key0 + (i >> 1) * 8, col = nb * 8 + 2 * tq + (i & 1), query = qt * BM + col;
          // attn_visible(key, query, attn_lo(query)), which is key <= query <= attn_hi(key)
          const bool ok = key <= query && query <= hi[i >> 1];
          const float p = ok ? exp2f(st[nb][i] * sl2 - Ls[col] * LOG2E) : 0.0f;
          st[nb][i] = p;
          dpt[nb][i] = p * (dpt[nb][i] - Ds[col]);
        }
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = nb * 8 + 2 * tq + (i & 1);
          const float p = exp2f(st[nb][i] * sl2 - Ls[col] * LOG2E);
          st[nb][i] = p;
          dpt[nb][i] = p * (dpt[nb][i] - Ds[col]);
        }
      }
    }
    // dV += P^T dO, dK += dS^T Q (k = the 64 queries in four 16-query chunks).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[4], sa[4];
      c_to_a<T>(pa, st, kk);
      c_to_a<T>(sa, dpt, kk);
#pragma unroll
      for (int dn2 = 0; dn2 < DN / 2; ++dn2) {
        uint32_t of4[4], qf4[4];
        const int off = (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + (dn2 * 2 + (mi >> 1)) * 8;
        ldmatrix_x4_trans(of4, dOs + off);
        ldmatrix_x4_trans(qf4, Qs + off);
        mma_pair<T>(dva[2 * dn2], dva[2 * dn2 + 1], pa, of4);
        mma_pair<T>(dka[2 * dn2], dka[2 * dn2 + 1], sa, qf4);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
    if (head_end) {
      qt = kt;
      ++h;
    } else {
      ++qt;
    }
  }
  // dK (scaled) and dV of this key tile, summed over the group's query heads. With split 1,
  // staged as T in this warp's own rows of Ks and Vs (every warp passed the loop's last barrier,
  // so no warp reads them any more; their padding, his, is not written) and stored 16 bytes at a
  // time, as the forward's output: no per-element address arithmetic beside 128 accumulators.
  if (a.split == 1) {
    T* Ko = Ks + warp * 16 * P;
    T* Vo = Vs + warp * 16 * P;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      store_u32(Ko + g * P + dn * 8 + 2 * tq, pack2<T>(s.scale * dka[dn][0], s.scale * dka[dn][1]));
      store_u32(Ko + (g + 8) * P + dn * 8 + 2 * tq, pack2<T>(s.scale * dka[dn][2], s.scale * dka[dn][3]));
      store_u32(Vo + g * P + dn * 8 + 2 * tq, pack2<T>(dva[dn][0], dva[dn][1]));
      store_u32(Vo + (g + 8) * P + dn * 8 + 2 * tq, pack2<T>(dva[dn][2], dva[dn][3]));
    }
    __syncwarp();
    constexpr int CH = HDP / 8;
    for (int idx = lane; idx < 16 * CH; idx += 32) {
      const int r = idx / CH, c = (idx - r * CH) * 8, key = kt * BN + warp * 16 + r;
      if (key >= s.T) continue;
      const size_t at = (static_cast<size_t>(b) * s.T + key) * s.ks + static_cast<size_t>(kh) * s.HD + c;
      if (a.out_vec && c + 8 <= s.HD) {
        pack_store<T, 8>(dk + at, pack_load<T, 8>(Ko + r * P + c));
        pack_store<T, 8>(dv + at, pack_load<T, 8>(Vo + r * P + c));
      } else {
        for (int j = 0; j < 8 && c + j < s.HD; ++j) {
          dk[at + j] = Ko[r * P + c + j];
          dv[at + j] = Vo[r * P + c + j];
        }
      }
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + r * 8;
    if (key >= s.T) continue;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      const int d = dn * 8 + 2 * tq;
      const size_t at = (static_cast<size_t>(blockIdx.x) * s.T + key) * s.HD + d;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (d + j >= s.HD) continue;
        dk_part[at + j] = s.scale * dka[dn][r * 2 + j];
        dv_part[at + j] = dva[dn][r * 2 + j];
      }
    }
  }
}

// ----------------------------------------------------------------------------
// Backward, dQ. smem: Qs, dOs [64 WM][PITCH], then STAGES stages of Ks, Vs [64][PITCH] of T. dq
// has q's layout (stride s.qs). WM as the forward's: with two slices a warp computes S and dP
// slice by slice (one slice's 64 accumulators at a time), keeps the first slice's dS packed as A
// fragments, and shares each K fragment of dQ += dS K between the slices.
template <typename T, int HDP, int STAGES, int WM>
__global__ void __launch_bounds__(THREADS)
    attn_bwd_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ Dvec, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, Args a) {
  using TL = Tiles<HDP>;
  constexpr int P = TL::PITCH, DN = TL::DN, BMQ = BM * WM, WR = 16 * WM;
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(float, smem_raw);
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* dOs = Qs + WM * TL::ELEMS;
  T* KV = dOs + WM * TL::ELEMS;  // stage i: Ks = KV + 2 i ELEMS, Vs = Ks + ELEMS
  // Longest first, as the forward.
  const int bh = blockIdx.x, qt = a.nt - 1 - static_cast<int>(blockIdx.y), b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, mi = lane >> 3;
  const size_t op = static_cast<size_t>(s.NH) * s.HD;
  const T* qb = q + static_cast<size_t>(b) * s.T * s.qs + static_cast<size_t>(h) * s.HD;
  const T* ob = dout + static_cast<size_t>(b) * s.T * op + static_cast<size_t>(h) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const float sl2 = s.scale * LOG2E;

  // Key tiles from the one holding the tile's first row's lo (its smallest) up to the one
  // holding its last row below T.
  const int kt0 = attn_lo(s, b, qt * BMQ) / BN;
  const int kt_last = (qt * BMQ + BMQ - 1 < s.T ? qt * BMQ + BMQ - 1 : s.T - 1) / BN;
  tile_load_async<T, HDP, BMQ>(Qs, qb, qt * BMQ, s.T, s.qs, s.HD, a.vec);
  tile_load_async<T, HDP, BMQ>(dOs, ob, qt * BMQ, s.T, op, s.HD, a.vec);
  T* KV0 = KV + kv_stage<STAGES>(kt0) * 2 * TL::ELEMS;
  tile_load_async<T, HDP>(KV0, kb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  tile_load_async<T, HDP>(KV0 + TL::ELEMS, vb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  cp_async_commit();
  const int wrow0 = qt * BMQ + warp * WR;  // this warp's first row; slice j's thread rows: + 16 j + g (+ 8)
  // The rows' lse (log2 units) and D: in registers with one slice; with two, in the 16 bytes of
  // padding that end Qs's row warp * WR + 16 j + g + 8 (lane tq of the quad writes entry tq:
  // lse of rows r0, r0 + 8, then their D), read per tile instead of 8 registers held.
  constexpr bool ROWS_REG = WM == 1;
  float lse2[ROWS_REG ? WM : 1][2], dd[ROWS_REG ? WM : 1][2];
  if constexpr (ROWS_REG) {
#pragma unroll
    for (int j = 0; j < WM; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wrow0 + 16 * j + g + r * 8;
        lse2[j][r] = row < s.T ? lse[static_cast<size_t>(bh) * s.T + row] * LOG2E : 0.0f;
        dd[j][r] = row < s.T ? Dvec[static_cast<size_t>(bh) * s.T + row] : 0.0f;
      }
  } else {
#pragma unroll
    for (int j = 0; j < WM; ++j) {
      const int row = wrow0 + 16 * j + g + (tq & 1) * 8;
      float* rows = reinterpret_cast<float*>(Qs + (warp * WR + 16 * j + g + 8) * P + HDP);
      rows[tq] = row >= s.T ? 0.0f
                 : tq < 2   ? lse[static_cast<size_t>(bh) * s.T + row] * LOG2E
                            : Dvec[static_cast<size_t>(bh) * s.T + row];
    }
  }
  // Their visible keys, lo..last: lo = attn_lo, last = row (none past T: lo = 0, last = -1), in
  // the 16 bytes of padding that end Qs's row warp * WR + 16 j + g (nothing reads a row's
  // padding), not in registers live across the loop. Lane tq of the quad writes entry tq: row
  // r0's lo and last, then r0 + 8's.
  const T* brow = Qs + (warp * WR + g) * P + HDP;  // slice j's bounds: + 16 j P
#pragma unroll
  for (int j = 0; j < WM; ++j) {
    const int row = wrow0 + 16 * j + g + (tq >> 1) * 8;
    int* bounds = reinterpret_cast<int*>(const_cast<T*>(brow + 16 * j * P));
    bounds[tq] = row < s.T ? (tq & 1 ? row : attn_lo(s, b, row)) : (tq & 1 ? -1 : 0);
  }
  float dqa[WM][DN][4];
#pragma unroll
  for (int j = 0; j < WM; ++j)
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) dqa[j][dn][0] = dqa[j][dn][1] = dqa[j][dn][2] = dqa[j][dn][3] = 0.0f;

  for (int kt = kt0; kt <= kt_last; ++kt) {
    const T* Ks = kv_tile_ready<T, HDP, STAGES>(KV, kb, vb, kt, kt0, kt_last, s, a.vec);
    const T* Vs = Ks + TL::ELEMS;
    __syncthreads();  // every thread's part of this tile has landed
    // A warp whose rows all precede the tile's keys sees none of them: dS = 0, skipped.
    if (WM == 1 || wrow0 + WR - 1 >= kt * BN) {
      // Slices before the last: dS packed as the A fragments of dQ += dS K (16 registers).
      uint32_t dsa[WM > 1 ? WM - 1 : 1][4][4];
      float dp[8][4];  // the last slice's dS, packed at use
#pragma unroll
      for (int j = 0; j < WM; ++j) {
        // S = Q_w K^T and dP = dO_w V^T: 16 queries x 64 keys.
        float sc[8][4];
        paired_products<T, HDP>(sc, dp, Qs, dOs, Ks, Vs, warp * WR + 16 * j, lane);
        // P = exp(S * scale - lse) (0 where masked), dS = P (dP - D), in dp.
        float4 ld = {0.0f, 0.0f, 0.0f, 0.0f};  // with two slices: lse of rows r0, r0 + 8, then D
        if constexpr (!ROWS_REG) ld = *reinterpret_cast<const float4*>(Qs + (warp * WR + 16 * j + g + 8) * P + HDP);
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // row r0 + 8 r: elements i = 2 r, 2 r + 1 of each block
          const int2 bd = reinterpret_cast<const int2*>(brow + 16 * j * P)[r];  // written before the barrier above
          const float l2 = ROWS_REG ? lse2[ROWS_REG ? j : 0][r] : r == 0 ? ld.x : ld.y;
          const float d = ROWS_REG ? dd[ROWS_REG ? j : 0][r] : r == 0 ? ld.z : ld.w;
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
            for (int i = 2 * r; i < 2 * r + 2; ++i) {
              const int key = kt * BN + nb * 8 + 2 * tq + (i & 1);
              // row < T && attn_visible(key, row, attn_lo(row))
              const bool ok = bd.x <= key && key <= bd.y;
              const float p = ok ? exp2f(sc[nb][i] * sl2 - l2) : 0.0f;
              dp[nb][i] = p * (dp[nb][i] - d);
            }
          }
        }
        if (j < WM - 1) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) c_to_a<T>(dsa[j < WM - 1 ? j : 0][kk], dp, kk);
        }
      }
      // dQ += dS K over the tile's 64 keys (four 16-key chunks; K through ldmatrix.trans, each
      // fragment feeding every slice).
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t da[4];
        c_to_a<T>(da, dp, kk);
#pragma unroll
        for (int dn2 = 0; dn2 < DN / 2; ++dn2) {
          uint32_t kf4[4];
          ldmatrix_x4_trans(kf4, Ks + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + (dn2 * 2 + (mi >> 1)) * 8);
#pragma unroll
          for (int j = 0; j < WM - 1; ++j) mma_pair<T>(dqa[j][2 * dn2], dqa[j][2 * dn2 + 1], dsa[j][kk], kf4);
          mma_pair<T>(dqa[WM - 1][2 * dn2], dqa[WM - 1][2 * dn2 + 1], da, kf4);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Stage this warp's rows of scale * dQ in its own rows of Qs (only this warp read them),
  // then store them 16 bytes at a time.
  T* Os = Qs + warp * WR * P;
#pragma unroll
  for (int j = 0; j < WM; ++j)
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      store_u32(Os + (16 * j + g) * P + dn * 8 + 2 * tq, pack2<T>(s.scale * dqa[j][dn][0], s.scale * dqa[j][dn][1]));
      store_u32(Os + (16 * j + g + 8) * P + dn * 8 + 2 * tq,
                pack2<T>(s.scale * dqa[j][dn][2], s.scale * dqa[j][dn][3]));
    }
  __syncwarp();
  constexpr int CH = HDP / 8;
  for (int idx = lane; idx < WR * CH; idx += 32) {
    const int r = idx / CH, c = (idx - r * CH) * 8, t = wrow0 + r;
    if (t >= s.T) continue;
    T* dst = dq + (static_cast<size_t>(b) * s.T + t) * s.qs + static_cast<size_t>(h) * s.HD + c;
    if (a.vec && c + 8 <= s.HD) {
      pack_store<T, 8>(dst, pack_load<T, 8>(Os + r * P + c));
    } else {
      for (int j = 0; j < 8 && c + j < s.HD; ++j) dst[j] = Os[r * P + c + j];
    }
  }
}

// dk/dv[b,t,kh,:] = the sum over the split parts of dk_part/dv_part, in part order.
template <typename T>
__global__ void attn_dkv_reduce_kernel(T* __restrict__ dk, T* __restrict__ dv, const float* __restrict__ dk_part,
                                       const float* __restrict__ dv_part, AttnShape s, int split) {
  const size_t total = static_cast<size_t>(s.B) * s.NKV * s.T * s.HD;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t part = static_cast<size_t>(s.T) * s.HD;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const size_t bk = idx / part, rest = idx - bk * part;  // (b * NKV + kh), t * HD + d
    const int t = static_cast<int>(rest / s.HD), d = static_cast<int>(rest % s.HD);
    const size_t src = bk * split * part + rest;
    float gk = 0.0f, gv = 0.0f;
    for (int j = 0; j < split; ++j) {
      gk += dk_part[src + j * part];
      gv += dv_part[src + j * part];
    }
    const int b = static_cast<int>(bk / s.NKV), kh = static_cast<int>(bk % s.NKV);
    const size_t at = (static_cast<size_t>(b) * s.T + t) * s.ks + static_cast<size_t>(kh) * s.HD + d;
    dk[at] = from_f32<T>(gk);
    dv[at] = from_f32<T>(gv);
  }
}

std::atomic<size_t> g_smem_cap{0};  // attention_smem_cap_for_testing
std::atomic<int> g_split_force{0};  // attention_dkdv_split_for_testing

// The split of each KV head's G query heads over dK/dV blocks (ops::attention_dkdv_split).
int dkdv_split(const AttnShape& s, int hdp) {
  const int forced = g_split_force.load(std::memory_order_relaxed);
  if (forced > 0) {
    for (int d = std::min(forced, s.G); d > 1; --d)
      if (s.G % d == 0) return d;
    return 1;
  }
  return ops::attention_dkdv_split(s.B, s.NKV, s.G, s.T, device_attr<cudaDevAttrMultiProcessorCount>(),
                                   dkdv_blocks_per_sm(hdp));
}

// The current device's opt-in shared memory per block (cudaDeviceProp::sharedMemPerBlockOptin),
// read once per device, under the test cap if one is set.
size_t smem_optin() {
  const auto v = static_cast<size_t>(device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>());
  const size_t cap = g_smem_cap.load(std::memory_order_relaxed);
  return cap > 0 && cap < v ? cap : v;
}

std::atomic<int> g_variant_force{0};  // attention_variant_for_testing

// DTRAIN_ATTN_VARIANT (core/env.cpp's table), read once; the test hook's choice first.
AttnVariant variant() {
  const int forced = g_variant_force.load(std::memory_order_relaxed);
  if (forced != 0) return static_cast<AttnVariant>(forced);
  static const AttnVariant from_env = [] {
    const char* v = env_get("DTRAIN_ATTN_VARIANT");
    const std::string text = v ? v : "";
    DTK_REQUIRE(text.empty() || text == "legacy" || text == "fa2" || text == "hopper", UsageError,
                "env DTRAIN_ATTN_VARIANT=" + text + ": give legacy, fa2 or hopper (or leave it unset: legacy)");
    return text == "fa2" ? AttnVariant::FA2 : text == "hopper" ? AttnVariant::HOPPER : AttnVariant::LEGACY;
  }();
  return from_env;
}

}  // namespace

void attention_smem_cap_for_testing(size_t bytes) { g_smem_cap.store(bytes, std::memory_order_relaxed); }
void attention_dkdv_split_for_testing(int split) { g_split_force.store(split, std::memory_order_relaxed); }
void attention_variant_for_testing(int v) { g_variant_force.store(v, std::memory_order_relaxed); }
AttnVariant attention_variant() { return variant(); }
size_t attention_smem_optin() { return smem_optin(); }

namespace {
struct KernelBytes {
  size_t fwd = 0, dkdv = 0, dq = 0;
  bool wide_fwd = false, wide_dq = false;          // the 128-row tiles run (the fa2 variant, compiled, fitting)
  bool wide_fwd_any = false, wide_dq_any = false;  // they would on a card of the most shared memory
};
// Each tensor-core kernel's shared memory at head dim HD, dtype and `stages` (64-row tiles).
KernelBytes kernel_bytes(int HD, DType dtype, int stages) {
  KernelBytes b;
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    with_hdp(HD, [&](auto hdp) {
      constexpr int HDP = decltype(hdp)::value;
      const bool fa2 = variant() != AttnVariant::LEGACY;  // hopper's mma.sync kernels are fa2's
      b = {fwd_bytes<Ty, HDP>(stages), dkdv_bytes<Ty, HDP>(stages), dq_bytes<Ty, HDP>(stages),
           wide_tiles<Ty, HDP>(false), wide_tiles<Ty, HDP>(true),   fa2 && kWideFwd<HDP>,
           fa2 && kWideDq<HDP>};
    });
  });
  return b;
}
}  // namespace

bool attention_backward_mma_fits(int HD, DType dtype) {
  const KernelBytes b = kernel_bytes(HD, dtype, 1);
  const size_t limit = smem_optin();
  return b.dkdv <= limit && b.dq <= limit;
}

bool attention_mma_two_stages(int HD, DType dtype) {
  const KernelBytes b = kernel_bytes(HD, dtype, 2);
  const size_t limit = smem_optin();
  return b.fwd <= limit && b.dkdv <= limit && b.dq <= limit;
}

bool attention_mma_largest_tiles(int HD, DType dtype) {
  const KernelBytes b = kernel_bytes(HD, dtype, 2);
  return attention_mma_two_stages(HD, dtype) && b.wide_fwd == b.wide_fwd_any && b.wide_dq == b.wide_dq_any;
}

bool attention_mma_wide_tiles(int HD, DType dtype, bool dq) {
  const KernelBytes b = kernel_bytes(HD, dtype, 2);
  return dq ? b.wide_dq : b.wide_fwd;
}

void attention_backward_mma(void* dq, void* dk, void* dv, const void* dout, const float* lse, const float* D,
                            const void* q, const void* k, const void* v, const AttnShape& s, DType dtype,
                            cudaStream_t stream) {
  Args a{s, (s.T + BM - 1) / BM,
         rows_aligned(q, s.qs, s.HD) && rows_aligned(k, s.ks, s.HD) && rows_aligned(v, s.ks, s.HD) &&
             rows_aligned(dout, static_cast<size_t>(s.NH) * s.HD, s.HD) && rows_aligned(dq, s.qs, s.HD),
         aligned16(lse) && aligned16(D) && s.T % 4 == 0, rows_aligned(dk, s.ks, s.HD) && rows_aligned(dv, s.ks, s.HD)};
  a.mask_every_tile = variant() == AttnVariant::LEGACY;
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    with_hdp(s.HD, [&](auto hdp) {
      constexpr int HDP = decltype(hdp)::value;
      a.split = dkdv_split(s, HDP);
      const size_t part = a.split > 1 ? static_cast<size_t>(s.B) * s.NKV * a.split * s.T * s.HD : 0;
      Scratch parts(sizeof(float) * part * 2, stream);
      float* dk_part = part ? parts.as<float>() : nullptr;
      float* dv_part = part ? dk_part + part : nullptr;
      with_stages<dkdv_bytes<Ty, HDP>(2), dkdv_bytes<Ty, HDP>(1)>(
          "the attention backward (dK, dV)", s.HD, [&](auto stages) {
            constexpr int STAGES = decltype(stages)::value;
            const size_t bytes = dkdv_bytes<Ty, HDP>(STAGES);
            auto kernel_dkdv = attn_bwd_dkdv_kernel<Ty, HDP, STAGES>;
            smem_allow(kernel_dkdv, bytes);
            DTK_LAUNCH(dim3(s.B * s.NKV * a.split, a.nt), THREADS, bytes, stream, kernel_dkdv)
            (static_cast<Ty*>(dk), static_cast<Ty*>(dv), dk_part, dv_part, static_cast<const Ty*>(dout), lse, D,
             static_cast<const Ty*>(q), static_cast<const Ty*>(k), static_cast<const Ty*>(v), a);
            DT_CUDA_LAUNCH_CHECK();
          });
      if (a.split > 1) {
        const size_t kv_total = static_cast<size_t>(s.B) * s.NKV * s.T * s.HD;
        DTK_LAUNCH(grid_for(kv_total, 256), 256, 0, stream, attn_dkv_reduce_kernel<Ty>)
        (static_cast<Ty*>(dk), static_cast<Ty*>(dv), dk_part, dv_part, s, a.split);
        DT_CUDA_LAUNCH_CHECK();
      }
      auto launch_dq = [&](auto stages, auto wm) {
        constexpr int STAGES = decltype(stages)::value, WM = decltype(wm)::value;
        const size_t bytes = dq_bytes<Ty, HDP>(STAGES, WM);
        Args aq = a;
        aq.nt = (s.T + BM * WM - 1) / (BM * WM);
        auto kernel_dq = attn_bwd_dq_kernel<Ty, HDP, STAGES, WM>;
        smem_allow(kernel_dq, bytes);
        DTK_LAUNCH(dim3(s.B * s.NH, aq.nt), THREADS, bytes, stream, kernel_dq)
        (static_cast<Ty*>(dq), static_cast<const Ty*>(dout), lse, D, static_cast<const Ty*>(q),
         static_cast<const Ty*>(k), static_cast<const Ty*>(v), aq);
        DT_CUDA_LAUNCH_CHECK();
      };
      if constexpr (kWideDq<HDP>) {
        if (wide_tiles<Ty, HDP>(true)) {
          launch_dq(std::integral_constant<int, 2>{}, std::integral_constant<int, 2>{});
          return;
        }
      }
      with_stages<dq_bytes<Ty, HDP>(2), dq_bytes<Ty, HDP>(1)>("the attention backward (dQ)", s.HD, [&](auto stages) {
        launch_dq(stages, std::integral_constant<int, 1>{});
      });
    });
  });
}

}  // namespace dtrain::kernels::detail
