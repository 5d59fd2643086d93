// The Hopper (sm_90a) attention forward, on FlashAttention-3's ideas (the hopper variant,
// kernels/attention_internal.cuh): warp specialisation, a shared-memory K/V ring filled by
// the asynchronous copy engine and drained by warpgroup MMAs, P kept in registers.
//
// Block: 288 threads. Warps 0-7 are two consumer warpgroups, each owning 64 of the block's
// 128 query rows; warp 8 is the producer. Grid (batch*head, query tile), the last query
// tiles (the most key tiles) first, as the mma.sync forward.
//  - The producer (one thread) loads the block's Q tile once, then each key tile's K and V
//    (64 keys) into a 2-stage ring, by the Tensor Memory Accelerator: one
//    cp.async.bulk.tensor per 64-column block of a tile, through tensor maps (made per call
//    by the driver's cuTensorMapEncodeTiled) that lay the box out 128B-swizzled and fill
//    rows past T with zeros. K and V of a stage each have a `full` mbarrier (its
//    arrive.expect_tx announces the bytes, the copies complete_tx on it) and an `empty` one
//    (both consumer warpgroups arrive once their MMAs reading it have retired; the producer
//    waits for it before refilling), so K of the next tile loads while V of the last one is
//    still read.
//  - Each consumer warpgroup, per key tile: S (64 x 64, 32 fp32 a thread) = Q K^T by HD / 16
//    wgmma m64n64k16 with both operands in shared memory (128B-swizzled, K-major); the
//    online softmax in registers in the log2 domain (the mask applied only on tiles it cuts:
//    the causal diagonal, a window's or a document's edge, the tail past T); P rounded to
//    16 bits in registers, where the accumulator's layout of a 16-key slab is the A fragment
//    of a k16 slice; O (64 x HD) += P V by 4 wgmma m64nHDk16 with A from registers and V
//    MN-major (imm-trans-b: V rows are stored as loaded, 128B-swizzled). A warpgroup skips
//    the key tiles none of its rows sees (it still waits for and releases their stages).
//  - FlashAttention-3's overlap of softmax and MMAs, both kinds: within a warpgroup, step i
//    issues S of tile i and then P V of tile i - 1, and computes tile i's softmax while that
//    P V runs (O is rescaled to a tile's row max just before its P V is issued); between the
//    warpgroups, each issues its step's MMAs in its turn, taken with named barriers
//    (bar.sync on its own, bar.arrive on the other's), so one's softmax overlaps the other's
//    MMAs (ping-pong).
//  - Rows and keys past T: the copies fill them with zeros (masked out), nothing past T is
//    stored.
// Results: O and the log-sum-exp (natural log) the tensor-core backward reads, as the
// mma.sync forward writes them; the products are summed in a different order (a tensor
// core's k16 steps), so the two agree to rounding, not bitwise.
// Built only for sm_90a (kernels/CMakeLists.txt compiles this file for 90a when 90 is among
// the architectures); elsewhere the kernel traps and the host never launches it
// (attention_hopper_runs). Not done (FlashAttention-3 has it): setmaxnreg (with 288 threads at
// 1 block per SM every thread may hold 224 registers, so the consumers need no more than
// they get; the producer warp's unused ones are 7 % of the register file).
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

// The kernel's own constant: defined where its body is compiled (sm_90a; the host pass).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int PRODUCER_WARP = 8;
#endif

template <typename T, int HD>
__global__ void __launch_bounds__(HTHREADS, 1)
    attn_fwd_hopper_kernel(T* __restrict__ out, float* __restrict__ lse, const __grid_constant__ CUtensorMap tq,
                           const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, Args a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  const AttnShape& s = a.s;
  DTK_EXTERN_SHARED(char, smem);
  uint64_t* full_k = reinterpret_cast<uint64_t*>(smem);  // [2] per stage: its K landed
  uint64_t* full_v = full_k + 2;                         // [2] its V landed
  uint64_t* empty_k = full_k + 4;                        // [2] both warpgroups are done with its K
  uint64_t* empty_v = full_k + 6;                        // [2] ... with its V
  uint64_t* qbar = full_k + 8;
  constexpr int NBARS = 9;
  char* Qs = smem + (1024 - shared_addr(smem) % 1024) % 1024 + 1024;
  constexpr uint32_t QB = HBM * HD * 2, KVB = HBN * HD * 2;
  char* KV = Qs + QB;  // stage i: K at KV + 2 i KVB, V after it

  const int bh = blockIdx.x, qt = a.nt - 1 - static_cast<int>(blockIdx.y), b = bh / s.NH, h = bh % s.NH, kh = h / s.G;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  // Key tiles from the one holding the block's first row's lo to the one holding its last
  // row below T (causal), as the mma.sync forward.
  const int kt0 = attn_lo(s, b, qt * HBM) / HBN;
  const int kt_last = (qt * HBM + HBM - 1 < s.T ? qt * HBM + HBM - 1 : s.T - 1) / HBN;
  const int ntiles = kt_last - kt0 + 1;

  if (threadIdx.x == 0) {
    for (int i = 0; i < 4; ++i) mbarrier_init(&full_k[i], 1);  // full_k, full_v: the producer's expect_tx
    for (int i = 4; i < 8; ++i) mbarrier_init(&full_k[i], 2);  // empty_k, empty_v: one per consumer warpgroup
    mbarrier_init(qbar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == PRODUCER_WARP) {
    if (lane == 0) {
      // One tensor copy per 64-column block of a tile: the maps' boxes are 64 columns (128
      // bytes, the 128B swizzle's span) by 128 (Q) or 64 (K, V) rows of one batch entry.
      mbarrier_arrive_expect_tx(qbar, QB);
#pragma unroll
      for (int cb = 0; cb < HD / 64; ++cb)
        tensor_copy_3d_g2s(Qs + cb * HBM * 128, &tq, h * HD + 64 * cb, qt * HBM, b, qbar);
      // K of tile i + 1 is refilled once both warpgroups' S of tile i - 1 retired, V once
      // their P V of tile i - 1 did (a step later: see the consumers).
      for (int i = 0; i < ntiles; ++i) {
        const int st = i & 1, key0 = (kt0 + i) * HBN;
        const uint32_t prev = static_cast<uint32_t>((i >> 1) - 1) & 1;  // the parity of tile i - 2's release
        // One of the stage's two tiles (K, then V): wait until it is released, then refill it.
        auto refill = [&](char* dst, const CUtensorMap* map, uint64_t* full, uint64_t* empty) {
          if (i >= 2) {
            while (!mbarrier_try_wait_parity(empty, prev)) {
            }
          }
          mbarrier_arrive_expect_tx(full, KVB);
#pragma unroll
          for (int cb = 0; cb < HD / 64; ++cb)
            tensor_copy_3d_g2s(dst + cb * HBN * 128, map, kh * HD + 64 * cb, key0, b, full);
        };
        char* Ks = KV + st * 2 * KVB;
        refill(Ks, &tk, &full_k[st], &empty_k[st]);
        refill(Ks + KVB, &tv, &full_v[st], &empty_v[st]);
      }
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
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};
    const float sl2 = s.scale * LOG2E;
    const char* Qw = Qs + wg * 8 * 1024;  // rows 64 wg.. of every column block
    float sc[HBN / 2];                    // S of the current tile, then its P in fp32
    uint32_t pa[HBN / 16][4];             // P of the previous tile, 16-bit: the k16 slices' A (S entries 8 c..8 c + 7)
    bool prev_act = false;                // the previous tile's P is in pa and its P V not issued yet
    // Turns at the tensor cores (FlashAttention-3's ping-pong): a warpgroup issues its MMAs
    // of step i between bar.sync on its own barrier (1 + wg) and bar.arrive on the other's,
    // so one warpgroup's softmax runs while the other's MMAs do. Both count 256: one
    // warpgroup's sync and the other's arrive. Warpgroup 1 opens warpgroup 0's first turn
    // and skips the arrive after its last, which no turn would consume.
    const uint32_t my_turn = 1 + wg, their_turn = 2 - wg;
    if (wg == 1) named_bar_arrive(1, 256);
    while (!mbarrier_try_wait_parity(qbar, 0)) {
    }
    // Step i issues S of tile i (if the warpgroup sees it) and P V of tile i - 1 (if it saw
    // that), then finishes tile i's softmax while that P V runs (FlashAttention-3's
    // intra-warpgroup pipelining). ntiles + 1 steps: the last only issues P V.
    for (int i = 0; i <= ntiles; ++i) {
      const int st = i & 1, pst = (i - 1) & 1, key0 = (kt0 + i) * HBN;
      // No row of this warpgroup sees the tile: all its keys after the last row, or before
      // the first row's lo (lo grows with the row). Uniform in the warpgroup; the tiles it
      // sees are consecutive.
      const bool act = i < ntiles && !(wrow0 >= s.T || key0 > wrow_last || key0 + HBN - 1 < lo_first);
      if (i < ntiles) {
        while (!mbarrier_try_wait_parity(&full_k[st], static_cast<uint32_t>(i >> 1) & 1)) {
        }
      }
      if (i >= 1) {
        while (!mbarrier_try_wait_parity(&full_v[pst], static_cast<uint32_t>((i - 1) >> 1) & 1)) {
        }
      }
      named_bar_sync(my_turn, 256);
      if (act) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
          const uint32_t at = (ks / 4) * 128 * 128 + (ks % 4) * 32, bt = (ks / 4) * HBN * 128 + (ks % 4) * 32;
          wgmma_m64k16<T, HBN>(sc, wgmma_desc(Qw + at, 128, 1024, WgmmaSwizzle::B128),
                               wgmma_desc(KV + st * 2 * KVB + bt, 128, 1024, WgmmaSwizzle::B128), ks > 0);
        }
        wgmma_commit();
      }
      if (prev_act) {
        // O to the previous tile's row max, then O += P V (V MN-major: keys 16 c.. are two
        // 8-row atoms further).
#pragma unroll
        for (int e = 0; e < HD / 2; ++e) o[e] *= alpha[(e >> 1) & 1];
        const char* Vs = KV + pst * 2 * KVB + KVB;
        wgmma_fence();
#pragma unroll
        for (int c = 0; c < HBN / 16; ++c)
          wgmma_m64k16_rs<T, HD, 1>(o, pa[c], wgmma_desc(Vs + c * 2048, HBN * 128, 1024, WgmmaSwizzle::B128), true);
        wgmma_commit();
      }
      if (wg == 0 || i < ntiles) named_bar_arrive(their_turn, 256);
      if (act) {
        if (prev_act) wgmma_wait<1>();
        else wgmma_wait<0>();
        if (tw == 0) mbarrier_arrive(&empty_k[st]);  // this warpgroup's S of the stage retired
        // Every row sees every key of the tile: none after the first row, none before the
        // last row's lo (the tile then ends at or before the first row, so below T).
        const bool whole = key0 + HBN - 1 <= wrow0 && lo_last <= key0;
        // Online softmax: element e of S is row (e >> 1) & 1, key key0 + 8 (e >> 2) + 2 tq + (e & 1).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int e = 0; e < HBN / 2; ++e) {
          const int r = (e >> 1) & 1, key = key0 + 8 * (e >> 2) + 2 * tq + (e & 1);
          const float x = !whole && (key < lo[r] || key > last[r]) ? -INFINITY : sc[e] * sl2;
          sc[e] = x;
          mx[r] = fmaxf(mx[r], x);
        }
        float mref[2];
        softmax_row_step(mx, m, l, alpha, mref);  // O is scaled by alpha before this tile's P V
#pragma unroll
        for (int e = 0; e < HBN / 2; ++e) {
          sc[e] = exp2f(sc[e] - mref[(e >> 1) & 1]);
          l[(e >> 1) & 1] += sc[e];
        }
      } else if (i < ntiles && tw == 0) {
        mbarrier_arrive(&empty_k[st]);
      }
      if (i >= 1) {
        if (prev_act) wgmma_wait<0>();
        if (tw == 0) mbarrier_arrive(&empty_v[pst]);  // this warpgroup's P V of the stage retired (or none)
      }
      if (act) {
#pragma unroll
        for (int e = 0; e < HBN / 2; e += 2) pa[e / 8][(e % 8) / 2] = pack2<T>(sc[e], sc[e + 1]);
      }
      prev_act = act;
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
    for (int i = 0; i < NBARS; ++i) mbarrier_inval(&full_k[i]);
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

// The driver's tensor-map encoder, reached through the runtime (dtrain links no libcuda):
// null where the driver has none.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if defined(DTRAIN_CUDA_EMU) || CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess) (void)cudaGetLastError();  // not sticky; the fall-back runs
    return e == cudaSuccess && q == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiled>(p) : nullptr;
  }();
  return fn;
}

// Why the hopper forward does not run here (NONE: it does), checked in this order.
enum class HopperMiss { NONE, NO_IMAGE, DTYPE, ARCH, HEAD_DIM, SMEM, NO_ENCODER };
HopperMiss hopper_miss(int HD, DType dtype) {
  if (!kSm90aImage) return HopperMiss::NO_IMAGE;
  if (dtype != DType::BF16 && dtype != DType::F16) return HopperMiss::DTYPE;
  if (device_attr<cudaDevAttrComputeCapabilityMajor>() != 9 || device_attr<cudaDevAttrComputeCapabilityMinor>() != 0)
    return HopperMiss::ARCH;
  if (HD != 64 && HD != 128) return HopperMiss::HEAD_DIM;
  if ((HD == 64 ? hopper_bytes<64>() : hopper_bytes<128>()) > attention_smem_optin()) return HopperMiss::SMEM;
  if (!encode_tiled()) return HopperMiss::NO_ENCODER;
  return HopperMiss::NONE;
}

}  // namespace

bool attention_hopper_runs(int HD, DType dtype) { return hopper_miss(HD, dtype) == HopperMiss::NONE; }

std::string attention_hopper_unavailable(int HD, DType dtype) {
  switch (hopper_miss(HD, dtype)) {
    case HopperMiss::NONE: return "";
    case HopperMiss::NO_IMAGE: return "this binary has no sm_90a image (90 was not among CMAKE_CUDA_ARCHITECTURES)";
    case HopperMiss::DTYPE: return "it takes bf16 or fp16 activations";
    case HopperMiss::ARCH:
      return "compute capability " + std::to_string(device_attr<cudaDevAttrComputeCapabilityMajor>()) + "." +
             std::to_string(device_attr<cudaDevAttrComputeCapabilityMinor>()) + ", the hopper forward needs 9.0";
    case HopperMiss::HEAD_DIM: return "head dim " + std::to_string(HD) + ", the hopper forward takes 64 or 128";
    case HopperMiss::SMEM:
      return "its shared memory does not fit this GPU's " + std::to_string(attention_smem_optin()) + " bytes per block";
    case HopperMiss::NO_ENCODER: return "the driver has no cuTensorMapEncodeTiled (its loads need tensor maps)";
  }
  return "";
}

namespace {

// The map of one of Q, K, V: [B][T][stride] elements of which the first `cols` of a row are
// the tensor's (its heads' HD columns each), boxes of 64 columns by `rows` rows of one batch
// entry, 128B-swizzled, out-of-bounds rows (past T) zero.
bool tensor_map(CUtensorMap* m, const void* base, DType dtype, const AttnShape& s, size_t stride, int cols,
                uint32_t rows) {
  const EncodeTiled enc = encode_tiled();
  if (!enc) return false;
  const cuuint64_t dim[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(s.T), static_cast<cuuint64_t>(s.B)};
  const cuuint64_t strides[2] = {stride * 2, stride * 2 * static_cast<cuuint64_t>(s.T)};
  const cuuint32_t box[3] = {64, rows, 1}, estr[3] = {1, 1, 1};
  return enc(m, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
             const_cast<void*>(base), dim, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool attention_forward_hopper(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& s,
                              DType dtype, cudaStream_t stream) {
  // The tensor maps need 16-byte aligned bases and row strides; O is stored in pairs.
  if (!attention_hopper_runs(s.HD, dtype) || !rows_aligned(q, s.qs, s.HD) || !rows_aligned(k, s.ks, s.HD) ||
      !rows_aligned(v, s.ks, s.HD) || (reinterpret_cast<uintptr_t>(out) & 3u) != 0)
    return false;
  CUtensorMap tq, tk, tv;
  if (!tensor_map(&tq, q, dtype, s, s.qs, s.NH * s.HD, HBM) || !tensor_map(&tk, k, dtype, s, s.ks, s.NKV * s.HD, HBN) ||
      !tensor_map(&tv, v, dtype, s, s.ks, s.NKV * s.HD, HBN))
    return false;
  Args a{s, (s.T + HBM - 1) / HBM, true};
  with_type(dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::type;
    auto launch = [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      auto kernel = attn_fwd_hopper_kernel<Ty, HD>;
      smem_allow(kernel, hopper_bytes<HD>());
      DTK_LAUNCH(dim3(s.B * s.NH, a.nt), HTHREADS, hopper_bytes<HD>(), stream, kernel)
      (static_cast<Ty*>(out), lse, tq, tk, tv, a);
      DT_CUDA_LAUNCH_CHECK();
    };
    if (s.HD == 64) launch(std::integral_constant<int, 64>{});
    else launch(std::integral_constant<int, 128>{});
  });
  return true;
}

}  // namespace dtrain::kernels::detail
