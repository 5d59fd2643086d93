// INTERNAL to kernels/attention_mma*.cu (the tensor-core attention): the tile shape, the kernels'
// arguments, the device steps every kernel shares (tile loads, the K/V pipeline, fragment
// products) and the host's choice of a kernel's instantiation (element type, padded head dim,
// stages, 128-row tiles) from the card's opt-in shared memory.
#pragma once

#include "kernels/attention_internal.cuh"
#include "kernels/common.cuh"
#include "kernels/mma.cuh"
#include "ops/attention.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dtrain::kernels::detail::mma {

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
  int nt;                        // tiles along T
  bool vec;                      // q/k/v/dout rows 16-byte aligned: tiles load 8 elements at a time
  bool rows_vec = false;         // backward: every lse and D row 16-byte aligned (T % 4 == 0, aligned bases)
  bool out_vec = false;          // dK/dV: dk and dv rows 16-byte aligned (stored 8 elements at a time)
  int split = 1;                 // dK/dV: blocks sharing one KV head's query heads (ops::attention_dkdv_split)
  bool mask_every_tile = false;  // dK/dV: the legacy variant's mask on every tile, not only the cut ones
};

// dst[r][0, HDP) = src row (row0 + r) for r < ROWS, zero past T and HD: in-range 16-byte chunks
// are issued as cp.async (visible after this thread's cp_async_wait and a barrier), the rest
// is stored directly.
template <typename T, int HDP, int ROWS = BM>
__device__ __forceinline__ void tile_load_async(T* dst, const T* src, int row0, int T_, size_t stride, int HD,
                                                bool vec) {
  constexpr int CH = HDP / 8, PITCH = Tiles<HDP>::PITCH;
  for (int idx = threadIdx.x; idx < ROWS * CH; idx += THREADS) {
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

// The online softmax's row step once this thread's maxima over a tile are in mx (its two
// rows of an mma / wgmma accumulator, a quad holding a row): the quad's maxima, the
// reference max each p is taken against, alpha = exp2(m - mref) (what the row's O and l so
// far are scaled by), m moved on and l rescaled (O is the caller's: the mma.sync forward
// scales it at once, the Hopper one before its next P V). A row that has seen nothing yet
// (mx = -inf: a sliding window or a later row's document start can hide a whole tile from
// it) takes reference 0, so alpha and every p are exp2(-inf) = 0, not NaN.
__device__ __forceinline__ void softmax_row_step(float (&mx)[2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                 float (&mref)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    mref[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
    alpha[r] = exp2f(m[r] - mref[r]);
    m[r] = mx[r];
    l[r] *= alpha[r];
  }
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
// 16 x 64 each, where A1_w, A2_w are rows arow .. arow + 15 (a warp's slice) of two [rows][PITCH]
// tiles and B1, B2 all 64 rows of two others (dK/dV: K, V against Q, dO; dQ: Q, dO against K, V).
template <typename T, int HDP>
__device__ __forceinline__ void paired_products(float (&c1)[8][4], float (&c2)[8][4], const T* A1, const T* A2,
                                                const T* B1, const T* B2, int arow, int lane) {
  constexpr int P = Tiles<HDP>::PITCH, KC = Tiles<HDP>::KC;
  const int mi = lane >> 3;
#pragma unroll
  for (int nb = 0; nb < 8; ++nb)
#pragma unroll
    for (int i = 0; i < 4; ++i) c1[nb][i] = c2[nb][i] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t a1[4], a2[4];
    ldmatrix_x4(a1, A1 + (arow + (lane & 15)) * P + kc * 16 + (lane >> 4) * 8);
    ldmatrix_x4(a2, A2 + (arow + (lane & 15)) * P + kc * 16 + (lane >> 4) * 8);
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
// Host side.

template <typename Kernel>
void smem_allow(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The smallest opt-in shared memory of the cards the kernels are built for (sm_86 / sm_89:
// 99 KB, CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"): a
// kernel whose two-stage variant fits in it on every card gets no one-stage variant compiled.
constexpr size_t kSmallestOptin = 99 * 1024;

// Calls f(std::integral_constant<int, STAGES>{}): two stages where bytes(2) fits the device's
// opt-in shared memory, else one where bytes(1) fits, else a DeviceError naming both.
template <size_t BYTES2, size_t BYTES1, typename F>
void with_stages(const char* what, int HD, F&& f) {
  const size_t limit = attention_smem_optin();
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

inline bool rows_aligned(const void* p, size_t stride_elems, int HD) {
  return aligned16(p) && HD % 8 == 0 && stride_elems % 8 == 0;
}

// Shared-memory bytes of each kernel, by element type, padded head dim, stages and (forward,
// dQ) 16-row slices per warp.
template <typename Ty, int HDP>
constexpr size_t fwd_bytes(int stages, int wm = 1) {
  return sizeof(Ty) * (wm + 2 * stages) * Tiles<HDP>::ELEMS;
}
template <typename Ty, int HDP>
constexpr size_t dkdv_bytes(int stages) {
  return sizeof(Ty) * (2 + 2 * stages) * Tiles<HDP>::ELEMS + sizeof(float) * 2 * stages * BM;
}
template <typename Ty, int HDP>
constexpr size_t dq_bytes(int stages, int wm = 1) {
  return sizeof(Ty) * (2 * wm + 2 * stages) * Tiles<HDP>::ELEMS;
}

// The head dims with FlashAttention-2's 128-row tiles compiled (two stages only; where they do
// not fit the card, the 64-row tiles run): the forward at 64 and 128, dQ at 64. 32 gains little
// (its 64-row kernels already hold 3-4 blocks per SM) and 256 has no registers for two slices.
// dQ at 128: two slices' dQ (128 registers) beside a slice's S and dP spill (ptxas, sm_90: 64
// bytes at 255 registers, 60 with S and dP one at a time), and their 139 KB of shared memory
// would leave one block per SM where the 64-row tiles' 104 KB hold two.
template <int HDP>
constexpr bool kWideFwd = HDP == 64 || HDP == 128;
template <int HDP>
constexpr bool kWideDq = HDP == 64;

// Whether the forward (dQ: dq = true) takes the 128-row tiles here: the fa2 variant, a head
// dim they are compiled for, and their two stages within the card's opt-in shared memory.
template <typename Ty, int HDP>
bool wide_tiles(bool dq) {
  if (attention_variant() == AttnVariant::LEGACY) return false;  // fa2, and hopper's mma.sync kernels
  if (dq) {
    if constexpr (kWideDq<HDP>) return dq_bytes<Ty, HDP>(2, 2) <= attention_smem_optin();
  } else {
    // Head dim 128's two slices only from sm_90 on (attn_fwd_mma_kernel: sm_80's ptxas spills).
    if constexpr (kWideFwd<HDP>)
      return fwd_bytes<Ty, HDP>(2, 2) <= attention_smem_optin() &&
             (HDP <= 64 || device_attr<cudaDevAttrComputeCapabilityMajor>() >= 9);
  }
  return false;
}

}  // namespace dtrain::kernels::detail::mma
