// The tensor-core attention forward (FlashAttention-2's algorithm on mma.sync; the shared tile
// machinery is kernels/attention_mma_tiles.cuh, the backward kernels/attention_mma.cu).
//
// Forward: block = (batch*head, query tile), the longest rows (last query tiles) first. Q's
// fragments stay in registers (at head dim 256, where O's accumulator takes 128, they are
// reloaded from shared memory per key tile); per key tile S = Q K^T (K through ldmatrix),
// online softmax in the log2 domain on the accumulator fragments, and the probabilities are
// reused in registers as the A operand of O += P V (V through ldmatrix.trans): the C layout of
// two adjacent 8-key blocks is exactly the A layout of one 16-key chunk. O is staged through
// shared memory for 16-byte stores.
// FlashAttention-2's 128-row query tiles (32 rows a warp, the fa2 variant: kernels/
// attention_internal.cuh) at head dims 64 and 128 where their two stages fit the card.
#include "kernels/attention_mma_tiles.cuh"

#include <cmath>

namespace dtrain::kernels::detail {

namespace {

using namespace mma;

// The forward's step for one 16-row slice and key tile kt: scale S (sc) into the log2 domain,
// mask it by the rows' bounds (lo of rows g, g + 8, then their last: attn_lo .. min(row, T - 1)),
// and the online softmax: m, l and O rescaled to the new row max, sc turned into P.
template <int DN>
__device__ __forceinline__ void slice_softmax(float (&sc)[8][4], float (&m)[2], float (&l)[2], float (&o)[DN][4],
                                              const int4 bd, int kt, int tq, float sl2) {
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
  softmax_row_step(mx, m, l, alpha, mref);
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
// WM = 16-row slices per warp: 1, the 64-row query tiles; 2, FlashAttention-2's 128-row tiles
// (32 rows a warp): each K and V fragment loaded from shared memory feeds both slices' products,
// half the shared-memory reads per FLOP, and each K/V tile serves twice the queries (2 blocks per
// SM by registers at head dims 64 and 128; shared memory would allow 4 and 2).
template <typename T, int HDP, int STAGES, int WM>
__device__ __forceinline__ void attn_fwd_mma(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                                             const T* __restrict__ k, const T* __restrict__ v, const Args& a) {
  using TL = Tiles<HDP>;
  constexpr int P = TL::PITCH, KC = TL::KC, DN = TL::DN, BMQ = BM * WM, WR = 16 * WM;  // WR: rows a warp
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(float, smem_raw);
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* KV = Qs + WM * TL::ELEMS;  // stage i: Ks = KV + 2 i ELEMS, Vs = Ks + ELEMS
  // Longest rows first: blocks start in index order, so the last query tiles (the most key
  // tiles) go first and the short ones fill the tail.
  const int bh = blockIdx.x, qt = a.nt - 1 - static_cast<int>(blockIdx.y), b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, mi = lane >> 3;
  const T* qb = q + static_cast<size_t>(b) * s.T * s.qs + static_cast<size_t>(h) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;

  // Key tiles from the one holding the tile's first row's lo (the tile's smallest: no row sees
  // an earlier one) up to the one holding its last row below T (causal).
  const int kt0 = attn_lo(s, b, qt * BMQ) / BN;
  const int kt_last = (qt * BMQ + BMQ - 1 < s.T ? qt * BMQ + BMQ - 1 : s.T - 1) / BN;
  tile_load_async<T, HDP, BMQ>(Qs, qb, qt * BMQ, s.T, s.qs, s.HD, a.vec);
  T* KV0 = KV + kv_stage<STAGES>(kt0) * 2 * TL::ELEMS;
  tile_load_async<T, HDP>(KV0, kb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  tile_load_async<T, HDP>(KV0 + TL::ELEMS, vb, kt0 * BN, s.T, s.ks, s.HD, a.vec);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // Q's fragments stay in registers, except where they (16 KC a slice) and O's accumulator
  // (4 DN a slice) leave too few for the rest (head dim 256; 128 with two slices): there each
  // tile reloads them from Qs.
  constexpr bool QREG = WM * HDP < 256;
  // With two slices at head dim 128 the slices' S (64 registers) beside O (128) spill too: there
  // S and the softmax go slice by slice.
  constexpr bool SLICED = WM > 1 && !QREG;
  const T* qrow = Qs + (warp * WR + (lane & 15)) * P + (lane >> 4) * 8;  // slice j: + 16 j P
  uint32_t qf[QREG ? WM * KC : SLICED ? 1 : WM][4];
  if constexpr (QREG) {
#pragma unroll
    for (int j = 0; j < WM; ++j)
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) ldmatrix_x4(qf[j * KC + kc], qrow + j * 16 * P + kc * 16);
  }

  float o[WM][DN][4];
#pragma unroll
  for (int j = 0; j < WM; ++j)
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) o[j][dn][0] = o[j][dn][1] = o[j][dn][2] = o[j][dn][3] = 0.0f;
  // Per slice j, rows g and g + 8; m in log2 units.
  float m[WM][2], l[WM][2];
#pragma unroll
  for (int j = 0; j < WM; ++j) m[j][0] = m[j][1] = -INFINITY, l[j][0] = l[j][1] = 0.0f;
  const float sl2 = s.scale * LOG2E;
  const int wrow0 = qt * BMQ + warp * WR;  // this warp's first row; slice j's thread rows: + 16 j + g (+ 8)
  // Their visible keys, lo..last: lo = attn_lo (0 past T), last = min(row, T - 1) (causal, and
  // no key past T). Kept in shared memory, not in registers live across the loop: in the 16
  // bytes of padding that end Qs's row warp * WR + 16 j + g (nothing reads a row's padding).
  // Lane tq of the quad writes entry tq: lo of rows r0, r0 + 8, then their last.
  const T* brow = Qs + (warp * WR + g) * P + HDP;  // slice j's bounds: + 16 j P
#pragma unroll
  for (int j = 0; j < WM; ++j) {
    const int row = wrow0 + 16 * j + g + (tq & 1) * 8;
    int* bounds = reinterpret_cast<int*>(const_cast<T*>(brow + 16 * j * P));
    bounds[tq] = tq < 2 ? (row < s.T ? attn_lo(s, b, row) : 0) : (row < s.T ? row : s.T - 1);
  }

  for (int kt = kt0; kt <= kt_last; ++kt) {
    const T* Ks = kv_tile_ready<T, HDP, STAGES>(KV, kb, vb, kt, kt0, kt_last, s, a.vec);
    const T* Vs = Ks + TL::ELEMS;
    __syncthreads();  // every thread's part of this tile has landed
    // With two slices a warp's rows can all precede the tile's keys (the first warps of the
    // last key tile): nothing to see, and the online softmax of a row that sees nothing in a
    // tile changes neither m, l nor O, so the warp skips it (uniform in the warp).
    if (WM == 1 || wrow0 + WR - 1 >= kt * BN) {
      if constexpr (!SLICED) {
        // S = Q K^T for every slice at once, each K fragment feeding all of them.
        float sc[WM][8][4];
#pragma unroll
        for (int j = 0; j < WM; ++j)
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) sc[j][nb][0] = sc[j][nb][1] = sc[j][nb][2] = sc[j][nb][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
          if constexpr (!QREG) {
#pragma unroll
            for (int j = 0; j < WM; ++j) ldmatrix_x4(qf[j], qrow + j * 16 * P + kc * 16);
          }
#pragma unroll
          for (int nb2 = 0; nb2 < 4; ++nb2) {
            uint32_t kf[4];
            ldmatrix_x4(kf, Ks + ((nb2 * 2 + (mi >> 1)) * 8 + (lane & 7)) * P + kc * 16 + (mi & 1) * 8);
#pragma unroll
            for (int j = 0; j < WM; ++j)
              mma_pair<T>(sc[j][2 * nb2], sc[j][2 * nb2 + 1], qf[QREG ? j * KC + kc : j], kf);
          }
        }
#pragma unroll
        for (int j = 0; j < WM; ++j)  // bounds written before the barrier above
          slice_softmax<DN>(sc[j], m[j], l[j], o[j], *reinterpret_cast<const int4*>(brow + 16 * j * P), kt, tq, sl2);
          // O += P V over four 16-key chunks, each V fragment feeding every slice.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t pa[WM][4];
#pragma unroll
          for (int j = 0; j < WM; ++j) c_to_a<T>(pa[j], sc[j], kk);
#pragma unroll
          for (int dn2 = 0; dn2 < DN / 2; ++dn2) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, Vs + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + (dn2 * 2 + (mi >> 1)) * 8);
#pragma unroll
            for (int j = 0; j < WM; ++j) mma_pair<T>(o[j][2 * dn2], o[j][2 * dn2 + 1], pa[j], vf);
          }
        }
      } else {
        // S and the softmax slice by slice (one slice's 32 scores at a time, K fragments loaded
        // per slice), P kept packed as A fragments (16 registers a slice); then O += P V with
        // each V fragment feeding every slice.
        uint32_t pa[WM][4][4];
#pragma unroll
        for (int j = 0; j < WM; ++j) {
          float sc[8][4];
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
#pragma unroll
          for (int kc = 0; kc < KC; ++kc) {
            uint32_t qa[4];
            ldmatrix_x4(qa, qrow + j * 16 * P + kc * 16);
#pragma unroll
            for (int nb2 = 0; nb2 < 4; ++nb2) {
              uint32_t kf[4];
              ldmatrix_x4(kf, Ks + ((nb2 * 2 + (mi >> 1)) * 8 + (lane & 7)) * P + kc * 16 + (mi & 1) * 8);
              mma_pair<T>(sc[2 * nb2], sc[2 * nb2 + 1], qa, kf);
            }
          }
          slice_softmax<DN>(sc, m[j], l[j], o[j], *reinterpret_cast<const int4*>(brow + 16 * j * P), kt, tq, sl2);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) c_to_a<T>(pa[j][kk], sc, kk);
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int dn2 = 0; dn2 < DN / 2; ++dn2) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, Vs + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + (dn2 * 2 + (mi >> 1)) * 8);
#pragma unroll
            for (int j = 0; j < WM; ++j) mma_pair<T>(o[j][2 * dn2], o[j][2 * dn2 + 1], pa[j][kk], vf);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Stage this warp's rows in its own rows of Qs (read only before the loop, and the skipped
  // tiles' reads of Qs are none), then store them 16 bytes at a time.
  T* Os = Qs + warp * WR * P;
  const size_t op = static_cast<size_t>(s.NH) * s.HD;
#pragma unroll
  for (int j = 0; j < WM; ++j) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[j][r] += __shfl_xor_sync(0xffffffffu, l[j][r], 1);
      l[j][r] += __shfl_xor_sync(0xffffffffu, l[j][r], 2);
      inv[r] = 1.0f / l[j][r];
    }
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      store_u32(Os + (16 * j + g) * P + dn * 8 + 2 * tq, pack2<T>(o[j][dn][0] * inv[0], o[j][dn][1] * inv[0]));
      store_u32(Os + (16 * j + g + 8) * P + dn * 8 + 2 * tq, pack2<T>(o[j][dn][2] * inv[1], o[j][dn][3] * inv[1]));
    }
    if (tq == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wrow0 + 16 * j + g + r * 8;
        if (row < s.T) lse[static_cast<size_t>(bh) * s.T + row] = (m[j][r] + log2f(l[j][r])) * LN2;
      }
    }
  }
  __syncwarp();
  constexpr int CH = HDP / 8;
  for (int idx = lane; idx < WR * CH; idx += 32) {
    const int r = idx / CH, c = (idx - r * CH) * 8, t = wrow0 + r;
    if (t >= s.T) continue;
    T* dst = out + (static_cast<size_t>(b) * s.T + t) * op + static_cast<size_t>(h) * s.HD + c;
    if (a.vec && c + 8 <= s.HD) {
      pack_store<T, 8>(dst, pack_load<T, 8>(Os + r * P + c));
    } else {
      for (int j = 0; j < 8 && c + j < s.HD; ++j) dst[j] = Os[r * P + c + j];
    }
  }
}

// The kernel. Two slices at head dim 128 are built for sm_90 and later only: sm_80's ptxas
// spills them (92 bytes at 255 registers), so below sm_90 that instantiation traps, and the
// host never launches it there (mma::wide_tiles asks the device's compute capability).
template <typename T, int HDP, int STAGES, int WM>
__global__ void __launch_bounds__(THREADS, WM == 1 && HDP <= 64 ? FWD_SMALL_BLOCKS : 0)
    attn_fwd_mma_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (WM > 1 && HDP > 64) {
    __trap();
  } else
#endif
  {
    attn_fwd_mma<T, HDP, STAGES, WM>(out, lse, q, k, v, a);
  }
}

}  // namespace

void attention_forward_mma(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& s,
                           DType dtype, cudaStream_t stream) {
  Args a{s, 0,
         rows_aligned(q, s.qs, s.HD) && rows_aligned(k, s.ks, s.HD) && rows_aligned(v, s.ks, s.HD) && aligned16(out)};
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    with_hdp(s.HD, [&](auto hdp) {
      constexpr int HDP = decltype(hdp)::value;
      auto launch = [&](auto stages, auto wm) {
        constexpr int STAGES = decltype(stages)::value, WM = decltype(wm)::value;
        const size_t bytes = fwd_bytes<Ty, HDP>(STAGES, WM);
        a.nt = (s.T + BM * WM - 1) / (BM * WM);
        auto kernel = attn_fwd_mma_kernel<Ty, HDP, STAGES, WM>;
        smem_allow(kernel, bytes);
        DTK_LAUNCH(dim3(s.B * s.NH, a.nt), THREADS, bytes, stream, kernel)
        (static_cast<Ty*>(out), lse, static_cast<const Ty*>(q), static_cast<const Ty*>(k), static_cast<const Ty*>(v),
         a);
        DT_CUDA_LAUNCH_CHECK();
      };
      if constexpr (kWideFwd<HDP>) {
        if (wide_tiles<Ty, HDP>(false)) {
          launch(std::integral_constant<int, 2>{}, std::integral_constant<int, 2>{});
          return;
        }
      }
      with_stages<fwd_bytes<Ty, HDP>(2), fwd_bytes<Ty, HDP>(1)>(
          "the attention forward", s.HD, [&](auto stages) { launch(stages, std::integral_constant<int, 1>{}); });
    });
  });
}

}  // namespace dtrain::kernels::detail
