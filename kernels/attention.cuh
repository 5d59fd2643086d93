// Causal multi-head attention with grouped KV heads on the device, flash-attention style:
// the T x T score matrix never exists in memory. Forward walks 32-key tiles with an online
// softmax and saves the per-row log-sum-exp; backward recomputes the probabilities per
// tile from it. Layouts as lib/ops/attention.h: q [B,T,NH,HD], k/v [B,T,NKV,HD], query
// head h reads KV head h / (NH/NKV). q and k are used as given: apply rope_forward
// (rope.cuh) before, the attention tiles do not rotate.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

namespace dtrain::kernels {

/// out [B,T,NH,HD] (dtype) = softmax(q k^T / sqrt(HD) + causal mask) v; lse [B,NH,T] fp32 =
/// log-sum-exp of each row of scaled scores (what backward needs, instead of the CPU's
/// att [B,NH,T,T]). HD <= 256 and NH % NKV == 0, else UsageError.
void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, int B,
                       int T, int NH, int NKV, int HD, DType dtype, cudaStream_t stream);

/// dq, dk, dv += the gradients of attention_forward given dout and the forward's out and
/// lse (ACCUMULATES, as the CPU op). Deterministic: dq is computed per query tile and
/// dk/dv per key tile summing the NH/NKV query heads of its KV head, no atomics.
void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out,
                        const float* lse, const void* q, const void* k, const void* v, int B, int T,
                        int NH, int NKV, int HD, DType dtype, cudaStream_t stream);

}  // namespace dtrain::kernels
