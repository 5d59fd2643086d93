// The Hopper (sm_90a) attention forward, on FlashAttention-3's ideas (the hopper variant,
// kernels/attention_internal.cuh): warp specialisation, a shared-memory K/V ring filled by
// the asynchronous copy engine and drained by warpgroup MMAs, P kept in registers.
//
// Block: 288 threads. Warps 0-7 are two consumer warpgroups, each owning 64 of the block's
// 128 query rows; warp 8 is the producer. Grid (batch*head, query tile), the last query
// tiles (the most key tiles) first, as the mma.sync forward.
//  - The producer loads the block's Q tile once, then each key tile's K and V (64 keys)
//    into a 2-stage ring with cp.async.bulk (16-byte copies: the 1D bulk copy cannot
//    scatter a row into the swizzled layout, a tensor-map TMA would do a tile in one
//    instruction), each stage guarded by a `full` mbarrier (its arrive.expect_tx announces
//    the stage's bytes, the copies complete_tx on it) and an `empty` one (both consumer
//    warpgroups arrive once their MMAs reading the stage have retired; the producer waits
//    for it before refilling the stage).
//  - Each consumer warpgroup, per key tile: S (64 x 64, 32 fp32 a thread) = Q K^T by HD / 16
//    wgmma m64n64k16 with both operands in shared memory (128B-swizzled, K-major); the
//    online softmax in registers in the log2 domain (the mask applied only on tiles it cuts:
//    the causal diagonal, a window's or a document's edge, the tail past T); P rounded to
//    16 bits in registers, where the accumulator's layout of a 16-key slab is the A fragment
//    of a k16 slice; O (64 x HD) += P V by 4 wgmma m64nHDk16 with A from registers and V
//    MN-major (imm-trans-b: V rows are stored as loaded, 128B-swizzled). A warpgroup skips
//    the key tiles none of its rows sees (it still waits for and releases their stage).
//  - Rows and keys past T: their copies read row T - 1 (finite data, masked out), nothing
//    past T is stored.
// Results: O and the log-sum-exp (natural log) the tensor-core backward reads, as the
// mma.sync forward writes them; the products are summed in a different order (a tensor
// core's k16 steps), so the two agree to rounding, not bitwise.
// Built only for sm_90a (kernels/CMakeLists.txt compiles this file for 90a when 90 is among
// the architectures); elsewhere the kernel traps and the host never launches it
// (attention_hopper_runs). The softmax of one tile does not yet overlap the other
// warpgroup's MMAs (FlashAttention-3's ping-pong and intra-warpgroup pipelining), and the
// producer keeps its full register allocation (no setmaxnreg).
#include "kernels/attention_mma_tiles.cuh"
#include "kernels/hopper.cuh"

#include <cmath>

namespace dtrain::kernels::detail {

namespace {

using namespace mma;

constexpr int HBM = 128;            // query rows per block
constexpr int HBN = 64;             // keys per tile
constexpr int HTHREADS = 288;       // two consumer warpgroups and the producer warp
constexpr size_t HSMEM_PAD = 2048;  // the barriers, then the tiles from a 1024-byte boundary

template <int HD>
constexpr size_t hopper_bytes() {
  return HSMEM_PAD + static_cast<size_t>(HBM) * HD * 2 + 4 * static_cast<size_t>(HBN) * HD * 2;
}

// The kernel's own helpers: compiled where its body is (sm_90a; the host pass).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int PRODUCER_WARP = 8;

// Byte offset of 16-byte chunk c (elements 8c..8c+7) of row r in a `rows`-row tile stored
// 128B-swizzled: 64-element column blocks of rows x 128 bytes, 8-row atoms of 1024 bytes,
// the chunk index XORed with r % 8. As K-major Q/K (rows = M/N, chunks along k) and as
// MN-major V (rows = k, chunks along n) the same bytes: each row as the global row.
__device__ __forceinline__ uint32_t swz_off(int r, int c, int rows) {
  return static_cast<uint32_t>((c / 8) * rows * 128 + (r / 8) * 1024 + (r % 8) * 128 + ((c % 8) ^ (r % 8)) * 16);
}

// Copies rows row0.. (ROWS of them; past T: row T - 1) of a [T, stride] source into the
// swizzled tile `dst`, lane by lane of the producer warp, completing on `bar`.
template <int HD, int ROWS>
__device__ __forceinline__ void tile_bulk(char* dst, const void* src, int row0, int T_, size_t stride, uint64_t* bar,
                                          int lane) {
  constexpr int CH = HD / 8;
  for (int idx = lane; idx < ROWS * CH; idx += 32) {
    const int r = idx / CH, c = idx - r * CH, t = row0 + r < T_ ? row0 + r : T_ - 1;
    bulk_copy_g2s(dst + swz_off(r, c, ROWS),
                  static_cast<const char*>(src) + (static_cast<size_t>(t) * stride + 8 * c) * 2, 16, bar);
  }
}

#endif

template <typename T, int HD>
__global__ void __launch_bounds__(HTHREADS, 1)
    attn_fwd_hopper_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                           const T* __restrict__ k, const T* __restrict__ v, Args a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(char, smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);  // [2]
  uint64_t* empty = full + 2;                          // [2]
  uint64_t* qbar = full + 4;
  char* Qs = smem + (1024 - shared_addr(smem) % 1024) % 1024 + 1024;
  constexpr uint32_t QB = HBM * HD * 2, KVB = HBN * HD * 2;
  char* KV = Qs + QB;  // stage i: K at KV + 2 i KVB, V after it

  const int bh = blockIdx.x, qt = a.nt - 1 - static_cast<int>(blockIdx.y), b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const T* qb = q + static_cast<size_t>(b) * s.T * s.qs + static_cast<size_t>(h) * s.HD;
  const T* kb = k + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  const T* vb = v + static_cast<size_t>(b) * s.T * s.ks + static_cast<size_t>(kh) * s.HD;
  // Key tiles from the one holding the block's first row's lo to the one holding its last
  // row below T (causal), as the mma.sync forward.
  const int kt0 = attn_lo(s, b, qt * HBM) / HBN;
  const int kt_last = (qt * HBM + HBM - 1 < s.T ? qt * HBM + HBM - 1 : s.T - 1) / HBN;
  const int ntiles = kt_last - kt0 + 1;

  if (threadIdx.x == 0) {
    mbarrier_init(&full[0], 1);
    mbarrier_init(&full[1], 1);
    mbarrier_init(&empty[0], 2);  // one arrival per consumer warpgroup
    mbarrier_init(&empty[1], 2);
    mbarrier_init(qbar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == PRODUCER_WARP) {
    if (lane == 0) mbarrier_arrive_expect_tx(qbar, QB);
    __syncwarp();
    tile_bulk<HD, HBM>(Qs, qb, qt * HBM, s.T, s.qs, qbar, lane);
    for (int i = 0; i < ntiles; ++i) {
      const int st = i & 1, key0 = (kt0 + i) * HBN;
      if (i >= 2) {  // the consumers released this stage's previous tile (i - 2)
        while (!mbarrier_try_wait_parity(&empty[st], static_cast<uint32_t>((i >> 1) - 1) & 1)) {
        }
      }
      if (lane == 0) mbarrier_arrive_expect_tx(&full[st], 2 * KVB);
      __syncwarp();
      char* Ks = KV + st * 2 * KVB;
      tile_bulk<HD, HBN>(Ks, kb, key0, s.T, s.ks, &full[st], lane);
      tile_bulk<HD, HBN>(Ks + KVB, vb, key0, s.T, s.ks, &full[st], lane);
    }
  } else {
    const int wg = warp >> 2, tw = static_cast<int>(threadIdx.x) & 127, w = tw >> 5, g = (tw & 31) >> 2, tq = tw & 3;
    const int wrow0 = qt * HBM + wg * 64;  // this warpgroup's first row
    const int wrow_last = wrow0 + 63 < s.T ? wrow0 + 63 : s.T - 1;
    const int lo_first = wrow0 < s.T ? attn_lo(s, b, wrow0) : s.T, lo_last = wrow0 < s.T ? attn_lo(s, b, wrow_last) : 0;
    // This thread's rows (16 w + g, + 8) and their visible keys lo..last (a row past T: 0..T-1).
    int lo[2], last[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wrow0 + 16 * w + g + 8 * r;
      lo[r] = row < s.T ? attn_lo(s, b, row) : 0;
      last[r] = row < s.T ? row : s.T - 1;
    }
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = s.scale * LOG2E;
    const char* Qw = Qs + wg * 8 * 1024;  // rows 64 wg.. of every column block
    while (!mbarrier_try_wait_parity(qbar, 0)) {
    }
    for (int i = 0; i < ntiles; ++i) {
      const int st = i & 1, key0 = (kt0 + i) * HBN;
      const char* Ks = KV + st * 2 * KVB;
      const char* Vs = Ks + KVB;
      while (!mbarrier_try_wait_parity(&full[st], static_cast<uint32_t>(i >> 1) & 1)) {
      }
      // No row of this warpgroup sees the tile: all its keys after the last row, or before
      // the first row's lo (lo grows with the row). Uniform in the warpgroup.
      const bool skip = wrow0 >= s.T || key0 > wrow_last || key0 + HBN - 1 < lo_first;
      if (!skip) {
        // Every row sees every key of the tile: none after the first row, none before the
        // last row's lo (the tile then ends at or before the first row, so below T).
        const bool whole = key0 + HBN - 1 <= wrow0 && lo_last <= key0;
        float sc[HBN / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
          const uint32_t at = (ks / 4) * 128 * 128 + (ks % 4) * 32, bt = (ks / 4) * HBN * 128 + (ks % 4) * 32;
          wgmma_m64k16<T, HBN>(sc, wgmma_desc(Qw + at, 128, 1024, WgmmaSwizzle::B128),
                               wgmma_desc(Ks + bt, 128, 1024, WgmmaSwizzle::B128), ks > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        // Online softmax: element i of S is row (i >> 1) & 1, key key0 + 8 (i >> 2) + 2 tq + (i & 1).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int e = 0; e < HBN / 2; ++e) {
          const int r = (e >> 1) & 1, key = key0 + 8 * (e >> 2) + 2 * tq + (e & 1);
          const float x = !whole && (key < lo[r] || key > last[r]) ? -INFINITY : sc[e] * sl2;
          sc[e] = x;
          mx[r] = fmaxf(mx[r], x);
        }
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          // A row that has seen nothing yet (mx = -inf): reference 0, so alpha and p are 0.
          mref[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
          alpha[r] = exp2f(m[r] - mref[r]);
          m[r] = mx[r];
          l[r] *= alpha[r];
        }
#pragma unroll
        for (int e = 0; e < HD / 2; ++e) o[e] *= alpha[(e >> 1) & 1];
        uint32_t pa[HBN / 16][4];  // P's k16 slices: S entries 8 c..8 c + 7 are slice c's A
#pragma unroll
        for (int e = 0; e < HBN / 2; e += 2) {
          const float p0 = exp2f(sc[e] - mref[(e >> 1) & 1]), p1 = exp2f(sc[e + 1] - mref[(e >> 1) & 1]);
          l[(e >> 1) & 1] += p0 + p1;
          pa[e / 8][(e % 8) / 2] = pack2<T>(p0, p1);
        }
        wgmma_fence();
#pragma unroll
        for (int c = 0; c < HBN / 16; ++c)  // keys 16 c..: two 8-row atoms further into V
          wgmma_m64k16_rs<T, HD, 1>(o, pa[c], wgmma_desc(Vs + c * 2048, HBN * 128, 1024, WgmmaSwizzle::B128), true);
        wgmma_commit();
        wgmma_wait<0>();
      }
      if (tw == 0) mbarrier_arrive(&empty[st]);  // this warpgroup's MMAs on the stage have retired
    }
    // O / l and the log-sum-exp; pairs of O stored 4 bytes at a time.
    const size_t op = static_cast<size_t>(s.NH) * s.HD;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      const int row = wrow0 + 16 * w + g + 8 * r;
      if (row >= s.T) continue;
      const float inv = 1.0f / l[r];
      T* dst = out + (static_cast<size_t>(b) * s.T + row) * op + static_cast<size_t>(h) * s.HD + 2 * tq;
#pragma unroll
      for (int e = 2 * r; e < HD / 2; e += 4) store_u32(dst + 8 * (e >> 2), pack2<T>(o[e] * inv, o[e + 1] * inv));
      if (tq == 0) lse[static_cast<size_t>(bh) * s.T + row] = (m[r] + log2f(l[r])) * LN2;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < 5; ++i) mbarrier_inval(&full[i]);
  }
#endif
}

// Whether this binary holds the kernel's sm_90a image (kernels/CMakeLists.txt defines
// DTRAIN_ATTN_SM90A on this file when it builds it for 90a); under the CPU execution
// engine the engine's device profile decides.
constexpr bool kSm90aImage =
#if defined(DTRAIN_CUDA_EMU) || defined(DTRAIN_ATTN_SM90A)
    true;
#else
    false;
#endif

}  // namespace

bool attention_hopper_runs(int HD, DType dtype) {
  if (!kSm90aImage || (dtype != DType::BF16 && dtype != DType::F16) || (HD != 64 && HD != 128)) return false;
  if (device_attr<cudaDevAttrComputeCapabilityMajor>() != 9 || device_attr<cudaDevAttrComputeCapabilityMinor>() != 0)
    return false;
  return (HD == 64 ? hopper_bytes<64>() : hopper_bytes<128>()) <= attention_smem_optin();
}

bool attention_forward_hopper(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& s,
                              DType dtype, cudaStream_t stream) {
  // The bulk copies read 16-byte chunks of rows: every row 16-byte aligned; O is stored in
  // pairs.
  if (!attention_hopper_runs(s.HD, dtype) || !rows_aligned(q, s.qs, s.HD) || !rows_aligned(k, s.ks, s.HD) ||
      !rows_aligned(v, s.ks, s.HD) || (reinterpret_cast<uintptr_t>(out) & 3u) != 0)
    return false;
  Args a{s, (s.T + HBM - 1) / HBM, true};
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    auto launch = [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      auto kernel = attn_fwd_hopper_kernel<Ty, HD>;
      smem_allow(kernel, hopper_bytes<HD>());
      DTK_LAUNCH(dim3(s.B * s.NH, a.nt), HTHREADS, hopper_bytes<HD>(), stream, kernel)
      (static_cast<Ty*>(out), lse, static_cast<const Ty*>(q), static_cast<const Ty*>(k), static_cast<const Ty*>(v), a);
      DT_CUDA_LAUNCH_CHECK();
    };
    if (s.HD == 64) launch(std::integral_constant<int, 64>{});
    else launch(std::integral_constant<int, 128>{});
  });
  return true;
}

}  // namespace dtrain::kernels::detail
