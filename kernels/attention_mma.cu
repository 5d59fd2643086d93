// Flash attention on tensor cores (bf16 / fp16 in, fp32 accumulate), FlashAttention-2's
// algorithm on mma.sync m16n8k16 with ldmatrix (kernels/mma.cuh). Tiles are 64 queries x 64
// keys, 4 warps per block, each warp owning 16 rows; shared-memory rows are padded by 8
// elements (16 bytes) so the 8 row addresses of an ldmatrix fall in different bank groups.
// Every kernel has a two-stage variant (the next tile's cp.async loads in flight while the
// current one is computed) and, for the head dims where two stages exceed a card's opt-in
// shared memory (A100 163 KB, sm_86/sm_89 99 KB), a one-stage variant: the variant is picked
// at run time from cudaDeviceProp::sharedMemPerBlockOptin.
//
// Forward: block = (batch*head, query tile), the longest rows (last query tiles) first. Q's
// fragments stay in registers (at head dim 256, where O's accumulator takes 128, they are
// reloaded from shared memory per key tile); per key tile S = Q K^T (K through ldmatrix),
// online softmax in the log2 domain on the accumulator fragments, and the probabilities are
// reused in registers as the A operand of O += P V (V through ldmatrix.trans): the C layout of
// two adjacent 8-key blocks is exactly the A layout of one 16-key chunk. O is staged through
// shared memory for 16-byte stores.
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
//   it, S = Q K^T and dP = dO V^T (warp = 16 queries), P and dS as above, dQ += dS K.
// S and dP are computed twice (7 tile products instead of FlashAttention-2's 5), which buys
// what FlashAttention-2's dQ atomics would cost: every output has one writer, so the result is
// deterministic, and no fp32 dQ buffer. With grouped KV heads a dK/dV block is one KV head's key
// tile and walks the query tiles of its query heads in head order, summing into the same
// registers: with split = 1 all G of them (no fp32 buffers, no reduction kernel); where that
// would leave the grid's tail to a few long blocks (small batch, short T: see
// ops::attention_dkdv_split) G / split of them, each block writing fp32 partials that a third
// kernel sums in split order.
#include "kernels/attention_internal.cuh"

#include "kernels/common.cuh"
#include "kernels/mma.cuh"
#include "ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

namespace dtrain::kernels::detail {

namespace {

constexpr int BM = 64;  // queries per tile; equal to BN so the causal diagonal is one tile
constexpr int BN = 64;  // keys per tile
constexpr int THREADS = 128;
constexpr int dkdv_blocks_per_sm(int hdp) { return ops::attention_dkdv_blocks_per_sm(hdp); }
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

template <int HDP>
struct Tiles {
  static constexpr int PITCH = HDP + 8;  // elements per shared-memory row
  static constexpr int ELEMS = BM * PITCH;
  static constexpr int KC = HDP / 16;  // 16-wide k chunks of the head dimension
  static constexpr int DN = HDP / 8;   // 8-wide n blocks of the head dimension
};

struct Args {
  AttnShape s;
  int nt;                 // tiles along T
  bool vec;               // q/k/v/dout rows 16-byte aligned: tiles load 8 elements at a time
  bool rows_vec = false;  // backward: every lse and D row 16-byte aligned (T % 4 == 0, aligned bases)
  int split = 1;          // dK/dV: blocks sharing one KV head's query heads (ops::attention_dkdv_split)
};

// dst[r][0, HDP) = src row (row0 + r) for r < 64, zero past T and HD: in-range 16-byte chunks
// are issued as cp.async (visible after this thread's cp_async_wait and a barrier), the rest
// is stored directly.
template <typename T, int HDP>
__device__ __forceinline__ void tile_load_async(T* dst, const T* src, int row0, int T_, size_t stride, int HD,
                                                bool vec) {
  constexpr int CH = HDP / 8, PITCH = Tiles<HDP>::PITCH;
  for (int idx = threadIdx.x; idx < BM * CH; idx += THREADS) {
    const int r = idx / CH, c = (idx - r * CH) * 8, t = row0 + r;
    T* d = dst + r * PITCH + c;
    const T* g = src + static_cast<size_t>(t) * stride + c;
    if (t < T_ && vec && c + 8 <= HD) {
      cp_async_16(d, g);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) d[j] = (t < T_ && c + j < HD) ? g[j] : from_f32<T>(0.0f);
    }
  }
}

__device__ __forceinline__ void store_u32(void* p, uint32_t v) { *static_cast<uint32_t*>(p) = v; }

// Two 16x8 products sharing A: d0 += a b[0..1], d1 += a b[2..3] (the B fragments of two
// adjacent 8-wide n blocks, as one ldmatrix_x4 loads them).
template <typename T>
__device__ __forceinline__ void mma_pair(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16<T>(d0, a, b0);
  mma_m16n8k16<T>(d1, a, b1);
}

// The A fragment of the 16-wide k chunk kk of a 16 x 64 accumulator tile c (eight 8-wide C
// fragments): the C layout of blocks 2kk and 2kk+1 is exactly A's (FlashAttention-2's
// register reuse), rounded to T.
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[8][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// The stage key tile kt goes to (kv_tile_ready).
template <int STAGES>
__device__ __forceinline__ int kv_stage(int kt) {
  return STAGES == 2 ? kt & 1 : 0;
}

// Makes key tile kt (of first..last) ready in shared memory, tile `first` having been
// issued into stage kv_stage<STAGES>(first) before the loop: with two stages, tile kt's loads
// were issued one iteration earlier into stage kt & 1 and the next tile's are issued into the
// other stage (last read two iterations ago, released by the caller's end-of-iteration
// barrier); with one, tile kt > first is loaded into the single stage now. Returns the stage's
// K tile (V follows it). The caller's barrier makes every thread's part visible.
template <typename T, int HDP, int STAGES>
__device__ __forceinline__ const T* kv_tile_ready(T* KV, const T* kb, const T* vb, int kt, int first, int last,
                                                  const AttnShape& s, bool vec) {
  constexpr int E = Tiles<HDP>::ELEMS;
  if constexpr (STAGES == 2) {
    const int stage = kt & 1;  // not relative to first: nothing but kt stays live in the loop
    if (kt < last) {
      T* nk = KV + (stage ^ 1) * 2 * E;
      tile_load_async<T, HDP>(nk, kb, (kt + 1) * BN, s.T, s.ks, s.HD, vec);
      tile_load_async<T, HDP>(nk + E, vb, (kt + 1) * BN, s.T, s.ks, s.HD, vec);
      cp_async_commit();
      cp_async_wait<1>();  // this tile's group is complete, the prefetch may still fly
    } else {
      cp_async_wait<0>();
    }
    return KV + stage * 2 * E;
  } else {
    if (kt > first) {
      tile_load_async<T, HDP>(KV, kb, kt * BN, s.T, s.ks, s.HD, vec);
      tile_load_async<T, HDP>(KV + E, vb, kt * BN, s.T, s.ks, s.HD, vec);
      cp_async_commit();
    }
    cp_async_wait<0>();
    return KV;
  }
}

// The backward's paired products over the head dimension: c1 = A1_w B1^T and c2 = A2_w B2^T,
// 16 x 64 each, where A1_w, A2_w are this warp's 16 rows of two [64][PITCH] tiles and B1, B2
// all 64 rows of two others (dK/dV: K, V against Q, dO; dQ: Q, dO against K, V).
template <typename T, int HDP>
__device__ __forceinline__ void paired_products(float (&c1)[8][4], float (&c2)[8][4], const T* A1, const T* A2,
                                                const T* B1, const T* B2, int warp, int lane) {
  constexpr int P = Tiles<HDP>::PITCH, KC = Tiles<HDP>::KC;
  const int mi = lane >> 3;
#pragma unroll
  for (int nb = 0; nb < 8; ++nb)
#pragma unroll
    for (int i = 0; i < 4; ++i) c1[nb][i] = c2[nb][i] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t a1[4], a2[4];
    ldmatrix_x4(a1, A1 + (warp * 16 + (lane & 15)) * P + kc * 16 + (lane >> 4) * 8);
    ldmatrix_x4(a2, A2 + (warp * 16 + (lane & 15)) * P + kc * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int nb2 = 0; nb2 < 4; ++nb2) {
      uint32_t b1[4], b2[4];
      const int off = ((nb2 * 2 + (mi >> 1)) * 8 + (lane & 7)) * P + kc * 16 + (mi & 1) * 8;
      ldmatrix_x4(b1, B1 + off);
      ldmatrix_x4(b2, B2 + off);
      mma_pair<T>(c1[2 * nb2], c1[2 * nb2 + 1], a1, b1);
      mma_pair<T>(c2[2 * nb2], c2[2 * nb2 + 1], a2, b2);
    }
  }
}

// ----------------------------------------------------------------------------
// Forward. smem: Qs, then STAGES stages of Ks, Vs [64][PITCH] of T: with two, the next key
// tile's loads (cp.async) are in flight while the current one is computed.
// At head dims 32 and 64 it is designed for 4 blocks per SM (scripts/kernel_resources.py's
// REG_TARGETS: 128 registers), which ptxas is held to: left alone it lands either side of 128
// as the loop's code changes. Not on sm_100/sm_120, which take 3 (REG_TARGETS: 144), where
// holding it to 128 spills.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int FWD_SMALL_BLOCKS = 0;  // no minimum
#else
constexpr int FWD_SMALL_BLOCKS = 4;
#endif
template <typename T, int HDP, int STAGES>
__global__ void __launch_bounds__(THREADS, HDP <= 64 ? FWD_SMALL_BLOCKS : 0)
    attn_fwd_mma_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, Args a) {
  using TL = Tiles<HDP>;
  constexpr int P = TL::PITCH, KC = TL::KC, DN = TL::DN;
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(float, smem_raw);
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* KV = Qs + TL::ELEMS;  // stage i: Ks = KV + 2 i ELEMS, Vs = Ks + ELEMS
  // Longest rows first: blocks start in index order, so the last query tiles (the most key
  // tiles) go first and the short ones fill the tail.
  const int bh = blockIdx.x, qt = a.nt - 1 - static_cast<int>(blockIdx.y), b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, mi = lane >> 3;
  const T* qb = q + static_cast<size_t>(b) * s.T * s.qs + static_cast<size_t>(h) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;

  // Key tiles from the one holding the tile's first row's lo (the tile's smallest: no row sees
  // an earlier one) up to the diagonal (causal).
  const int kt0 = attn_lo(s, b, qt * BM) / BN;
  tile_load_async<T, HDP>(Qs, qb, qt * BM, s.T, s.qs, s.HD, a.vec);
  T* KV0 = KV + kv_stage<STAGES>(kt0) * 2 * TL::ELEMS;
  tile_load_async<T, HDP>(KV0, kb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  tile_load_async<T, HDP>(KV0 + TL::ELEMS, vb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // Q's fragments stay in registers, except at head dim 256, where they (64 registers) and O's
  // accumulator (128) leave too few for the rest: there each tile reloads them from Qs.
  constexpr bool QREG = HDP < 256;
  const T* qrow = Qs + (warp * 16 + (lane & 15)) * P + (lane >> 4) * 8;
  uint32_t qf[QREG ? KC : 1][4];
  if constexpr (QREG) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) ldmatrix_x4(qf[kc], qrow + kc * 16);
  }

  float o[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // per row g and g + 8; m in log2 units
  const float sl2 = s.scale * LOG2E;
  const int row0 = qt * BM + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  // Their visible keys, lo..last: lo = attn_lo (0 past T), last = min(row, T - 1) (causal, and
  // no key past T). Kept in shared memory, not in four registers live across the loop: in the
  // 16 bytes of padding that end Qs's row warp * 16 + g (nothing reads a row's padding). Lane tq
  // of the quad writes entry tq: lo of rows row0, row0 + 8, then their last.
  int* bounds = reinterpret_cast<int*>(Qs + (warp * 16 + g) * P + HDP);
  {
    const int row = row0 + (tq & 1) * 8;
    bounds[tq] = tq < 2 ? (row < s.T ? attn_lo(s, b, row) : 0) : (row < s.T ? row : s.T - 1);
  }

  for (int kt = kt0; kt <= qt; ++kt) {
    const T* Ks = kv_tile_ready<T, HDP, STAGES>(KV, kb, vb, kt, kt0, qt, s, a.vec);
    const T* Vs = Ks + TL::ELEMS;
    __syncthreads();  // every thread's part of this tile has landed
    float sc[8][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      if constexpr (!QREG) ldmatrix_x4(qf[0], qrow + kc * 16);
      const uint32_t(&qa)[4] = qf[QREG ? kc : 0];
#pragma unroll
      for (int nb2 = 0; nb2 < 4; ++nb2) {
        uint32_t kf[4];
        ldmatrix_x4(kf, Ks + ((nb2 * 2 + (mi >> 1)) * 8 + (lane & 7)) * P + kc * 16 + (mi & 1) * 8);
        mma_pair<T>(sc[2 * nb2], sc[2 * nb2 + 1], qa, kf);
      }
    }
    // Scale into the log2 domain, mask, and the online softmax of rows row0 (i < 2), row0 + 8.
    const int4 bd = *reinterpret_cast<const int4*>(bounds);  // written before the barrier above
    const int lo[2] = {bd.x, bd.y}, last[2] = {bd.z, bd.w};
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = kt * BN + nb * 8 + 2 * tq + (i & 1);
        // attn_visible(key, row, attn_lo(row)), and no key past T
        const bool masked = key < lo[i >> 1] || key > last[i >> 1];
        const float x = masked ? -INFINITY : sc[nb][i] * sl2;
        sc[nb][i] = x;
        mx[i >> 1] = fmaxf(mx[i >> 1], x);
      }
    }
    float alpha[2], mref[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // The first tile holds the tile's first row's lo, but a sliding window or a later row's
      // document start can hide a whole tile from a row, which then has seen nothing yet
      // (mx = -inf): its reference max is 0, so alpha and every p are exp2(-inf) = 0, not NaN.
      mref[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
      alpha[r] = exp2f(m[r] - mref[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      o[dn][0] *= alpha[0];
      o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1];
      o[dn][3] *= alpha[1];
    }
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f(sc[nb][i] - mref[i >> 1]);
        sc[nb][i] = p;
        l[i >> 1] += p;  // this thread's part of the row sum; the quad adds up at the end
      }
    }
    // O += P V over four 16-key chunks.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[4];
      c_to_a<T>(pa, sc, kk);
#pragma unroll
      for (int dn2 = 0; dn2 < DN / 2; ++dn2) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, Vs + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + (dn2 * 2 + (mi >> 1)) * 8);
        mma_pair<T>(o[2 * dn2], o[2 * dn2 + 1], pa, vf);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.0f / l[r];
  }
  // Stage this warp's 16 rows in its own rows of Qs (read only before the loop), then store
  // them 16 bytes at a time.
  T* Os = Qs + warp * 16 * P;
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) {
    store_u32(Os + g * P + dn * 8 + 2 * tq, pack2<T>(o[dn][0] * inv[0], o[dn][1] * inv[0]));
    store_u32(Os + (g + 8) * P + dn * 8 + 2 * tq, pack2<T>(o[dn][2] * inv[1], o[dn][3] * inv[1]));
  }
  __syncwarp();
  const size_t op = static_cast<size_t>(s.NH) * s.HD;
  constexpr int CH = HDP / 8;
  for (int idx = lane; idx < 16 * CH; idx += 32) {
    const int r = idx / CH, c = (idx - r * CH) * 8, t = qt * BM + warp * 16 + r;
    if (t >= s.T) continue;
    T* dst = out + (static_cast<size_t>(b) * s.T + t) * op + static_cast<size_t>(h) * s.HD + c;
    if (a.vec && c + 8 <= s.HD) {
      pack_store<T, 8>(dst, pack_load<T, 8>(Os + r * P + c));
    } else {
      for (int j = 0; j < 8 && c + j < s.HD; ++j) dst[j] = Os[r * P + c + j];
    }
  }
  if (tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + r * 8;
      if (row < s.T) lse[static_cast<size_t>(bh) * s.T + row] = (m[r] + log2f(l[r])) * LN2;
    }
  }
}

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
  const T* qb = q + static_cast<size_t>(b) * s.T * s.qs;
  const T* ob = dout + static_cast<size_t>(b) * s.T * op;
  const float* lb = lse + static_cast<size_t>(b) * s.NH * s.T;
  const float* db = Dvec + static_cast<size_t>(b) * s.NH * s.T;
  auto load_step = [&](int h, int qt, int st) {
    T* qs = QO + st * 2 * TL::ELEMS;
    tile_load_async<T, HDP>(qs, qb + h * s.HD, qt * BM, s.T, s.qs, s.HD, a.vec);
    tile_load_async<T, HDP>(qs + TL::ELEMS, ob + h * s.HD, qt * BM, s.T, op, s.HD, a.vec);
    float* ls = LD + st * 2 * BM;
    const int row0 = qt * BM;
    if (a.rows_vec && row0 + BM <= s.T) {
      if (threadIdx.x < BM / 2) {  // 16 chunks of 4 floats of lse, then 16 of D
        const int c = (threadIdx.x & (BM / 4 - 1)) * 4;
        const bool d = threadIdx.x >= BM / 4;
        cp_async_16(ls + (d ? BM : 0) + c, (d ? db : lb) + h * s.T + row0 + c);
      }
    } else if (threadIdx.x < BM) {
      const int row = row0 + threadIdx.x;
      ls[threadIdx.x] = row < s.T ? lb[h * s.T + row] : 0.0f;
      ls[BM + threadIdx.x] = row < s.T ? db[h * s.T + row] : 0.0f;
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
  if (tq < 2) his[tq] = key0 + tq * 8 < s.T ? attn_hi(s, b, key0 + tq * 8) : -1;

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
    paired_products<T, HDP>(st, dpt, Ks, Vs, Qs, dOs, warp, lane);
    // P^T = exp(S^T * scale - lse) (0 where masked), dS^T = P^T (dP^T - D).
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
  // dK (scaled) and dV of this key tile, summed over the group's query heads.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + r * 8;
    if (key >= s.T) continue;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int d = dn * 8 + 2 * tq + j;
        if (d >= s.HD) continue;
        const float gk = s.scale * dka[dn][r * 2 + j], gv = dva[dn][r * 2 + j];
        if (a.split == 1) {
          const size_t at = (static_cast<size_t>(b) * s.T + key) * s.ks + static_cast<size_t>(kh) * s.HD + d;
          dk[at] = from_f32<T>(gk);
          dv[at] = from_f32<T>(gv);
        } else {
          const size_t at = (static_cast<size_t>(blockIdx.x) * s.T + key) * s.HD + d;
          dk_part[at] = gk;
          dv_part[at] = gv;
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------
// Backward, dQ. smem: Qs, dOs, then STAGES stages of Ks, Vs [64][PITCH] of T. dq has q's
// layout (stride s.qs).
template <typename T, int HDP, int STAGES>
__global__ void __launch_bounds__(THREADS)
    attn_bwd_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ Dvec, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, Args a) {
  using TL = Tiles<HDP>;
  constexpr int P = TL::PITCH, DN = TL::DN;
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(float, smem_raw);
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* dOs = Qs + TL::ELEMS;
  T* KV = dOs + TL::ELEMS;  // stage i: Ks = KV + 2 i ELEMS, Vs = Ks + ELEMS
  // Longest first, as the forward.
  const int bh = blockIdx.x, qt = a.nt - 1 - static_cast<int>(blockIdx.y), b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, mi = lane >> 3;
  const size_t op = static_cast<size_t>(s.NH) * s.HD;
  const T* qb = q + static_cast<size_t>(b) * s.T * s.qs + static_cast<size_t>(h) * s.HD;
  const T* ob = dout + static_cast<size_t>(b) * s.T * op + static_cast<size_t>(h) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const float sl2 = s.scale * LOG2E;

  // Key tiles from the one holding the tile's first row's lo (its smallest) up to the diagonal.
  const int kt0 = attn_lo(s, b, qt * BM) / BN;
  tile_load_async<T, HDP>(Qs, qb, qt * BM, s.T, s.qs, s.HD, a.vec);
  tile_load_async<T, HDP>(dOs, ob, qt * BM, s.T, op, s.HD, a.vec);
  T* KV0 = KV + kv_stage<STAGES>(kt0) * 2 * TL::ELEMS;
  tile_load_async<T, HDP>(KV0, kb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  tile_load_async<T, HDP>(KV0 + TL::ELEMS, vb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  cp_async_commit();
  const int row0 = qt * BM + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  float lse2[2], dd[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    lse2[r] = row < s.T ? lse[static_cast<size_t>(bh) * s.T + row] * LOG2E : 0.0f;
    dd[r] = row < s.T ? Dvec[static_cast<size_t>(bh) * s.T + row] : 0.0f;
  }
  // Their visible keys, lo..last: lo = attn_lo, last = row (none past T: lo = 0, last = -1), in
  // the 16 bytes of padding that end Qs's row warp * 16 + g (nothing reads a row's padding), not
  // in registers live across the loop. Lane tq of the quad writes entry tq: row row0's lo and
  // last, then row0 + 8's.
  int* bounds = reinterpret_cast<int*>(Qs + (warp * 16 + g) * P + HDP);
  {
    const int row = row0 + (tq >> 1) * 8;
    bounds[tq] = row < s.T ? (tq & 1 ? row : attn_lo(s, b, row)) : (tq & 1 ? -1 : 0);
  }
  float dqa[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) dqa[dn][0] = dqa[dn][1] = dqa[dn][2] = dqa[dn][3] = 0.0f;

  for (int kt = kt0; kt <= qt; ++kt) {
    const T* Ks = kv_tile_ready<T, HDP, STAGES>(KV, kb, vb, kt, kt0, qt, s, a.vec);
    const T* Vs = Ks + TL::ELEMS;
    __syncthreads();  // every thread's part of this tile has landed

    // S = Q_w K^T and dP = dO_w V^T: 16 queries x 64 keys per warp.
    float sc[8][4], dp[8][4];
    paired_products<T, HDP>(sc, dp, Qs, dOs, Ks, Vs, warp, lane);
    // P = exp(S * scale - lse) (0 where masked), dS = P (dP - D), in dp.
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // row row0 + 8 r: elements i = 2 r, 2 r + 1 of each block
      const int2 bd = reinterpret_cast<const int2*>(bounds)[r];  // written before the barrier above
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
        for (int i = 2 * r; i < 2 * r + 2; ++i) {
          const int key = kt * BN + nb * 8 + 2 * tq + (i & 1);
          // row < T && attn_visible(key, row, attn_lo(row))
          const bool ok = bd.x <= key && key <= bd.y;
          const float p = ok ? exp2f(sc[nb][i] * sl2 - lse2[r]) : 0.0f;
          dp[nb][i] = p * (dp[nb][i] - dd[r]);
        }
      }
    }
    // dQ += dS K over the tile's 64 keys (four 16-key chunks; K through ldmatrix.trans).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t da[4];
      c_to_a<T>(da, dp, kk);
#pragma unroll
      for (int dn2 = 0; dn2 < DN / 2; ++dn2) {
        uint32_t kf4[4];
        ldmatrix_x4_trans(kf4, Ks + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + (dn2 * 2 + (mi >> 1)) * 8);
        mma_pair<T>(dqa[2 * dn2], dqa[2 * dn2 + 1], da, kf4);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Stage this warp's 16 rows of scale * dQ in its own rows of Qs (only this warp read them),
  // then store them 16 bytes at a time.
  T* Os = Qs + warp * 16 * P;
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) {
    store_u32(Os + g * P + dn * 8 + 2 * tq, pack2<T>(s.scale * dqa[dn][0], s.scale * dqa[dn][1]));
    store_u32(Os + (g + 8) * P + dn * 8 + 2 * tq, pack2<T>(s.scale * dqa[dn][2], s.scale * dqa[dn][3]));
  }
  __syncwarp();
  constexpr int CH = HDP / 8;
  for (int idx = lane; idx < 16 * CH; idx += 32) {
    const int r = idx / CH, c = (idx - r * CH) * 8, t = qt * BM + warp * 16 + r;
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

template <typename Kernel>
void smem_allow(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

std::atomic<size_t> g_smem_cap{0};  // attention_smem_cap_for_testing
std::atomic<int> g_split_force{0};  // attention_dkdv_split_for_testing

// The current device's multiprocessors, read once per device.
int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int dev = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) dev = kMaxDevices - 1;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v <= 0) {
    DT_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// The split of each KV head's G query heads over dK/dV blocks (ops::attention_dkdv_split).
int dkdv_split(const AttnShape& s, int hdp) {
  const int forced = g_split_force.load(std::memory_order_relaxed);
  if (forced > 0) {
    for (int d = std::min(forced, s.G); d > 1; --d)
      if (s.G % d == 0) return d;
    return 1;
  }
  return ops::attention_dkdv_split(s.B, s.NKV, s.G, s.T, sm_count(), dkdv_blocks_per_sm(hdp));
}

// The current device's opt-in shared memory per block (cudaDeviceProp::sharedMemPerBlockOptin),
// read once per device, under the test cap if one is set.
size_t smem_optin() {
  constexpr int kMaxDevices = 64;
  static std::atomic<long long> cached[kMaxDevices] = {};
  int dev = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) dev = kMaxDevices - 1;
  long long v = cached[dev].load(std::memory_order_relaxed);
  if (v <= 0) {
    cudaDeviceProp p{};
    DT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    v = static_cast<long long>(p.sharedMemPerBlockOptin);
    cached[dev].store(v, std::memory_order_relaxed);
  }
  const size_t cap = g_smem_cap.load(std::memory_order_relaxed);
  return cap > 0 && cap < static_cast<size_t>(v) ? cap : static_cast<size_t>(v);
}

// The smallest opt-in shared memory of the cards the kernels are built for (sm_86 / sm_89:
// 99 KB, CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"): a
// kernel whose two-stage variant fits in it on every card gets no one-stage variant compiled.
constexpr size_t kSmallestOptin = 99 * 1024;

// Calls f(std::integral_constant<int, STAGES>{}): two stages where bytes(2) fits the device's
// opt-in shared memory, else one where bytes(1) fits, else a DeviceError naming both.
template <size_t BYTES2, size_t BYTES1, typename F>
void with_stages(const char* what, int HD, F&& f) {
  const size_t limit = smem_optin();
  if (BYTES2 <= limit) {
    f(std::integral_constant<int, 2>{});
    return;
  }
  if constexpr (BYTES2 > kSmallestOptin) {
    if (BYTES1 <= limit) {
      f(std::integral_constant<int, 1>{});
      return;
    }
  }
  DTK_REQUIRE(false, DeviceError,
              std::string(what) + " at head dim " + std::to_string(HD) + " needs " + std::to_string(BYTES1) +
                  " bytes of shared memory per block even with one stage; this GPU allows " + std::to_string(limit) +
                  " (use a head dim of at most 128 on this card, or train in fp32)");
}

// Calls f(std::integral_constant<int, HDP>) for the smallest padded head dimension >= HD.
template <typename F>
void with_hdp(int HD, F&& f) {
  if (HD <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (HD <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (HD <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    f(std::integral_constant<int, 256>{});
  }
}

template <typename F>
void with_type(DType dtype, F&& f) {
  if (dtype == DType::BF16) {
    f(Tag<bf16>{});
  } else {
    DTK_REQUIRE(dtype == DType::F16, InternalError, "tensor-core attention runs bf16 or fp16");
    f(Tag<fp16>{});
  }
}

bool rows_aligned(const void* p, size_t stride_elems, int HD) {
  return aligned16(p) && HD % 8 == 0 && stride_elems % 8 == 0;
}

// Shared-memory bytes of each kernel, by element type, padded head dim and stages.
template <typename Ty, int HDP>
constexpr size_t fwd_bytes(int stages) {
  return sizeof(Ty) * (1 + 2 * stages) * Tiles<HDP>::ELEMS;
}
template <typename Ty, int HDP>
constexpr size_t dkdv_bytes(int stages) {
  return sizeof(Ty) * (2 + 2 * stages) * Tiles<HDP>::ELEMS + sizeof(float) * 2 * stages * BM;
}
template <typename Ty, int HDP>
constexpr size_t dq_bytes(int stages) {
  return sizeof(Ty) * (2 + 2 * stages) * Tiles<HDP>::ELEMS;
}

}  // namespace

void attention_smem_cap_for_testing(size_t bytes) { g_smem_cap.store(bytes, std::memory_order_relaxed); }
void attention_dkdv_split_for_testing(int split) { g_split_force.store(split, std::memory_order_relaxed); }
size_t attention_smem_optin() { return smem_optin(); }

namespace {
struct KernelBytes {
  size_t fwd = 0, dkdv = 0, dq = 0;
};
// Each tensor-core kernel's shared memory at head dim HD, dtype and `stages`.
KernelBytes kernel_bytes(int HD, DType dtype, int stages) {
  KernelBytes b;
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    with_hdp(HD, [&](auto hdp) {
      constexpr int HDP = decltype(hdp)::value;
      b = {fwd_bytes<Ty, HDP>(stages), dkdv_bytes<Ty, HDP>(stages), dq_bytes<Ty, HDP>(stages)};
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

void attention_forward_mma(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& s,
                           DType dtype, cudaStream_t stream) {
  const Args a{
      s, (s.T + BM - 1) / BM,
      rows_aligned(q, s.qs, s.HD) && rows_aligned(k, s.ks, s.HD) && rows_aligned(v, s.ks, s.HD) && aligned16(out)};
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    with_hdp(s.HD, [&](auto hdp) {
      constexpr int HDP = decltype(hdp)::value;
      with_stages<fwd_bytes<Ty, HDP>(2), fwd_bytes<Ty, HDP>(1)>("the attention forward", s.HD, [&](auto stages) {
        constexpr int STAGES = decltype(stages)::value;
        const size_t bytes = fwd_bytes<Ty, HDP>(STAGES);
        auto kernel = attn_fwd_mma_kernel<Ty, HDP, STAGES>;
        smem_allow(kernel, bytes);
        DTK_LAUNCH(dim3(s.B * s.NH, a.nt), THREADS, bytes, stream, kernel)
        (static_cast<Ty*>(out), lse, static_cast<const Ty*>(q), static_cast<const Ty*>(k), static_cast<const Ty*>(v),
         a);
        DT_CUDA_LAUNCH_CHECK();
      });
    });
  });
}

void attention_backward_mma(void* dq, void* dk, void* dv, const void* dout, const float* lse, const float* D,
                            const void* q, const void* k, const void* v, const AttnShape& s, DType dtype,
                            cudaStream_t stream) {
  Args a{s, (s.T + BM - 1) / BM,
         rows_aligned(q, s.qs, s.HD) && rows_aligned(k, s.ks, s.HD) && rows_aligned(v, s.ks, s.HD) &&
             rows_aligned(dout, static_cast<size_t>(s.NH) * s.HD, s.HD) && rows_aligned(dq, s.qs, s.HD),
         aligned16(lse) && aligned16(D) && s.T % 4 == 0};
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
      with_stages<dq_bytes<Ty, HDP>(2), dq_bytes<Ty, HDP>(1)>("the attention backward (dQ)", s.HD, [&](auto stages) {
        constexpr int STAGES = decltype(stages)::value;
        const size_t bytes = dq_bytes<Ty, HDP>(STAGES);
        auto kernel_dq = attn_bwd_dq_kernel<Ty, HDP, STAGES>;
        smem_allow(kernel_dq, bytes);
        DTK_LAUNCH(dim3(s.B * s.NH, a.nt), THREADS, bytes, stream, kernel_dq)
        (static_cast<Ty*>(dq), static_cast<const Ty*>(dout), lse, D, static_cast<const Ty*>(q),
         static_cast<const Ty*>(k), static_cast<const Ty*>(v), a);
        DT_CUDA_LAUNCH_CHECK();
      });
    });
  });
}

}  // namespace dtrain::kernels::detail
