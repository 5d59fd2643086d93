// INTERNAL to kernels/attention*.cu: the shape both attention implementations take and the
// tensor-core path's entry points (attention_mma.cu). attention.cu checks the shapes and
// picks the path: fp32 on CUDA cores, bf16/fp16 on tensor cores.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels::detail {

struct AttnShape {
  int B, T, NH, NKV, HD, G;  // G = NH / NKV query heads per KV head
  float scale;               // 1 / sqrt(HD)
  size_t qs, ks;             // elements between consecutive tokens of q/dq and of k, v, dk, dv
  int W;                     // sliding window (0: none): query i sees keys i - W < j <= i
};

/// Whether query `row` sees key `key`: causal, and within the sliding window when W > 0
/// (Mistral's mask, HF's `kv_idx > q_idx - sliding_window`).
__host__ __device__ inline bool attn_visible(int key, int row, int W) {
  return key <= row && (W <= 0 || key > row - W);
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
