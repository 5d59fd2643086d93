// INTERNAL to kernels/attention*.cu: the shape both attention implementations take and the
// tensor-core path's entry points (attention_mma.cu). attention.cu checks the shapes and
// picks the path: fp32 on CUDA cores, bf16/fp16 on tensor cores.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::kernels::detail {

struct AttnShape {
  int B, T, NH, NKV, HD, G;  // G = NH / NKV query heads per KV head
  float scale;               // 1 / sqrt(HD)
  size_t qs, ks;             // elements between consecutive tokens of q/dq and of k, v, dk, dv
  int W;                     // sliding window (0: none): query i sees keys i - W < j <= i
  const int32_t* ds;         // [B*T] first position of each query's document in its row, or nullptr
};

/// The first key query `row` (< T) of batch row b sees: its document's start (s.ds, the
/// packed documents' mask) and, when W > 0, row - W + 1 (Mistral's sliding window, HF's
/// `kv_idx > q_idx - sliding_window`). Never above row, and non-decreasing in row (the
/// doc_start layout ops::attention_doc_starts_check states), so a tile's first row has the
/// tile's smallest.
__device__ __forceinline__ int attn_lo(const AttnShape& s, int b, int row) {
  const int w = s.W > 0 ? row - s.W + 1 : 0;
  const int d = s.ds != nullptr ? s.ds[static_cast<size_t>(b) * s.T + row] : 0;
  return w > d ? w : d;
}

/// Whether query `row` sees key `key`, given lo = attn_lo(row): the one mask rule of every
/// attention kernel (causal, and nothing before lo).
__host__ __device__ __forceinline__ bool attn_visible(int key, int row, int lo) { return lo <= key && key <= row; }

/// The last query that sees key `key` (< T) of batch row b: the largest row in [key, T) with
/// attn_lo(row) <= key (lo is non-decreasing), so attn_visible(key, row, attn_lo(s, b, row))
/// holds exactly for key <= row <= attn_hi(s, b, key). What the dK/dV kernels mask by (their
/// keys are fixed per thread, their queries are not) and stop at. A binary search over
/// s.ds when set; closed form otherwise.
__device__ __forceinline__ int attn_hi(const AttnShape& s, int b, int key) {
  int hi = s.T - 1;
  if (s.W > 0 && s.W - 1 < hi - key) hi = key + s.W - 1;  // the window's last row
  if (s.ds == nullptr) return hi;
  int lo = key;  // attn_lo(key) <= key: key sees itself
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (attn_lo(s, b, mid) <= key) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// out, lse as kernels::attention_forward; dtype BF16 or F16.
void attention_forward_mma(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& s,
                           DType dtype, cudaStream_t stream);

/// WRITES dq, dk, dv; D [B,NH,T] = rowsum(dout * out) from the caller. dtype BF16 or F16.
void attention_backward_mma(void* dq, void* dk, void* dv, const void* dout, const float* lse, const float* D,
                            const void* q, const void* k, const void* v, const AttnShape& s, DType dtype,
                            cudaStream_t stream);

/// Caps the opt-in shared memory per block the tensor-core attention plans with (0: the
/// device's own). Lets a test run, on any GPU, the one-stage variants an A100 (163 KB) or an
/// sm_86/sm_89 card (99 KB) picks. Process-wide; for tests.
void attention_smem_cap_for_testing(size_t bytes);

/// Forces the tensor-core dK/dV kernel's split of each KV head's query heads (0: automatic,
/// ops::attention_dkdv_split; else the largest divisor of G not above it). Lets a test run
/// every split, whatever its shapes' grid would pick. Process-wide; for tests.
void attention_dkdv_split_for_testing(int split);

/// Which tensor-core kernels run (DTRAIN_ATTN_VARIANT, core/env.cpp's table): LEGACY, the
/// 64-row forward and dQ tiles (16 rows a warp) and a dK/dV mask on every tile; FA2,
/// FlashAttention-2's shape, 128-row forward and dQ tiles (32 rows a warp) at head dims 33-128
/// where their two stages fit the card (else the 64-row ones) and the dK/dV mask only on the
/// tiles it cuts. Both give the same results (the same products per row in the same order).
/// HOPPER: the forward by attention_forward_hopper (wgmma, FlashAttention-3's ideas) where it
/// runs (attention_hopper_runs and 16-byte aligned rows), else as FA2 (a documented fall back,
/// not an error: one setting serves a mixed fleet); the backward always as FA2. Its forward
/// agrees with the others to rounding (a tensor core's k16 sums), not bitwise. All are kept
/// until a GPU run picks one by speed (scripts/gpu_check.py's attention stage).
enum class AttnVariant { LEGACY = 1, FA2 = 2, HOPPER = 3 };

/// Whether the hopper forward runs here at head dim HD and dtype: its sm_90a image is in this
/// binary (kernels/CMakeLists.txt), the device is compute capability 9.0, HD is 64 or 128,
/// dtype BF16 or F16, its shared memory fits the card and the driver can make tensor maps.
bool attention_hopper_runs(int HD, DType dtype);
/// Why it does not ("" where it runs): no sm_90a image in this binary, not bf16/fp16, compute
/// capability other than 9.0, head dim other than 64 or 128, its shared memory over the card's
/// opt-in limit, or no cuTensorMapEncodeTiled in the driver. attention_hopper_runs' verdict.
std::string attention_hopper_unavailable(int HD, DType dtype);

/// The hopper forward (attention_hopper.cu): out, lse as attention_forward_mma. Returns false,
/// having done nothing, where it does not run (attention_hopper_runs, or rows of q, k, v not
/// 16-byte aligned, or out not 4-byte aligned).
bool attention_forward_hopper(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& s,
                              DType dtype, cudaStream_t stream);

/// The variant the kernels run now: the test hook's, else $DTRAIN_ATTN_VARIANT (read once;
/// unset or empty: LEGACY; another value: UsageError).
AttnVariant attention_variant();

/// Forces the variant (0: $DTRAIN_ATTN_VARIANT's; else an AttnVariant's value). Process-wide;
/// for tests.
void attention_variant_for_testing(int variant);

/// Whether every tensor-core kernel takes here the tiles it takes on a card of the most shared
/// memory under the current variant: attention_mma_two_stages, and under fa2 the 128-row tiles
/// wherever they are compiled (not head dim 128's forward on a 99 KB card).
bool attention_mma_largest_tiles(int HD, DType dtype);

/// Whether the forward (dq = false) or dQ (dq = true) kernel takes the 128-row tiles on this
/// device at head dim HD and dtype (BF16 or F16) under the current variant.
bool attention_mma_wide_tiles(int HD, DType dtype, bool dq);

/// The current device's opt-in shared memory per block (cudaDeviceProp::sharedMemPerBlockOptin),
/// under attention_smem_cap_for_testing's cap: what both attention paths pick tiles by.
size_t attention_smem_optin();

/// Whether the tensor-core backward fits this device at head dim HD (dtype BF16 or F16), with
/// one stage at least. Where it does not (head dims 129-256 on 99 KB cards), attention.cu
/// runs the CUDA-core backward on the bf16/fp16 rows instead.
bool attention_backward_mma_fits(int HD, DType dtype);

/// Whether every tensor-core attention kernel (forward, dK/dV, dQ) takes its two-stage tiles
/// on this device at head dim HD (dtype BF16 or F16), as on the largest cards.
bool attention_mma_two_stages(int HD, DType dtype);

/// Whether this device (under attention_smem_cap_for_testing's cap) runs the attention at
/// head dim HD and dtype with the same kernels as a card of the most shared memory: the
/// tensor-core kernels' two-stage tiles (bf16/fp16), the CUDA-core backward's 32-row tiles
/// (fp32). Lets a test skip what another card's run already covered.
bool attention_largest_tiles(int HD, DType dtype);

}  // namespace dtrain::kernels::detail
