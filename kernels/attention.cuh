// Causal multi-head attention with grouped KV heads on the device, flash-attention style:
// the T x T score matrix never exists in memory. bf16 and fp16 run on tensor cores
// (attention_mma*.cu: FlashAttention-2 on mma.sync, 64 x 64 tiles, or 128-row query tiles
// under DTRAIN_ATTN_VARIANT=fa2; fp32 accumulation); fp32 on CUDA cores (attention.cu,
// 32 x 32 tiles). Forward walks key tiles with an online softmax and saves the per-row
// log-sum-exp; backward recomputes the probabilities per tile from it. Layouts: q [B,T,NH,HD] and k/v [B,T,NKV,HD] whose token rows may be further apart
// than one row (q_stride, kv_stride elements: the fused qkv buffer of a GPT-2 block is read
// in place, q at offset 0, k at NH*HD, v at (NH+NKV)*HD, both strides (NH+2*NKV)*HD); out
// and dout are dense [B,T,NH,HD]. Query head h reads KV head h / (NH/NKV). q and k are used
// as given: apply rope_forward (rope.cuh) before, the attention tiles do not rotate.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace dtrain::kernels {

/// out [B,T,NH,HD] (dtype) = softmax(q k^T / sqrt(HD) + causal mask) v; lse [B,NH,T] fp32 =
/// log-sum-exp of each row of scaled scores (what backward needs, instead of the CPU's
/// att [B,NH,T,T]). HD <= 256 and NH % NKV == 0, else UsageError. window > 0 is a sliding
/// window (Mistral): query i sees keys i - window < j <= i only; 0 is plain causal.
/// doc_start (device, int32 [B*T], or nullptr): packed documents without cross-talk, query t
/// of row b sees keys j >= doc_start[b*T + t] only (the layout ops::attention_doc_starts_check
/// states; the kernels trust it). Key tiles no row of a query tile sees are skipped.
void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride, int kv_stride, DType dtype, cudaStream_t stream, int window = 0,
                       const int32_t* doc_start = nullptr);

/// WRITES dq, dk, dv (strided as q, k, v) = the gradients of attention_forward given dout
/// and the forward's out and lse. Deterministic, no float atomics: fp32 dq per query tile
/// and dk/dv per key tile on CUDA cores; on tensor cores one pass per key tile (no more
/// recomputation than FlashAttention-2) with dq summed from per-split fp32 partials in a
/// fixed order (attention_mma.cu).
void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* lse,
                        const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                        int q_stride, int kv_stride, DType dtype, cudaStream_t stream, int window = 0,
                        const int32_t* doc_start = nullptr);

/// Which forward attention_forward runs on the current device at head dim HD and dtype, for
/// reports (`dtrain bench attention`). bf16/fp16: the tensor-core variant ($DTRAIN_ATTN_VARIANT
/// as the kernels read it, test hook included): "legacy", "fa2", or "hopper" where the sm_90a
/// forward runs (its backward is fa2's); where hopper is asked for and its forward does not run
/// here, "fa2" (what runs instead) with `hopper_unavailable` saying why: no sm_90a image in this
/// binary, compute capability other than 9.0, head dim other than 64 or 128, its shared
/// memory over the card's opt-in limit, or no tensor-map encoder in the driver. Rows of q, k, v are taken 16-byte aligned (dense
/// buffers; rows that are not also run fa2's forward). fp32: "cuda-core". UsageError for a bad
/// $DTRAIN_ATTN_VARIANT, as at the first launch.
struct AttnForwardKernels {
  std::string variant;             ///< what runs: "legacy", "fa2", "hopper" or "cuda-core"
  std::string requested;           ///< the variant asked for ("legacy" when unset); "-" for fp32
  std::string hopper_unavailable;  ///< why the hopper forward does not run here (asked for only)
};
AttnForwardKernels attention_forward_kernels(int HD, DType dtype);

}  // namespace dtrain::kernels
