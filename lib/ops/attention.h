// Causal multi-head self-attention with grouped KV heads (GQA/MQA): query head h reads
// KV head h / (NH/NKV). Forward saves the softmax probabilities att [B,NH,T,T] (fine on
// CPU at the sizes this backend trains; the CUDA version may save log-sum-exp instead);
// entries above the diagonal are written as 0. Backward ACCUMULATES (+=) into dq, dk, dv;
// dk/dv sum over every query head that shares the KV head.
#pragma once

#include <cstdint>

namespace dtrain::ops {

/// out[B,T,NH,HD] = softmax(q k^T / sqrt(HD) + causal mask) v, per (b, h).
/// q is [B,T,NH,HD]; k, v are [B,T,NKV,HD]; NH % NKV == 0. Rows of q are q_stride floats
/// apart and rows of k and v kv_stride apart (0: dense, NH*HD and NKV*HD), so q, k and v
/// can be read in place as column slices of a fused [B*T, (NH+2*NKV)*HD] projection.
/// window > 0: a sliding window (Mistral), query i sees keys i - window < j <= i only.
/// doc_start [B*T] (nullptr: none): packed documents without cross-talk, query t of row b
/// sees keys j >= doc_start[b*T + t] only (attention_doc_starts_check states the layout).
/// Key blocks no query of a block sees are skipped, not computed and masked.
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride = 0, int kv_stride = 0, int window = 0,
                       const int32_t* doc_start = nullptr);

/// Gradients of attention_forward given dout [B,T,NH,HD] and the saved att; dq has q's
/// row pitch and dk, dv have k's (the strides as in the forward).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* att, const float* q,
                        const float* k, const float* v, int B, int T, int NH, int NKV, int HD, int q_stride = 0,
                        int kv_stride = 0, int window = 0, const int32_t* doc_start = nullptr);

/// UsageError unless doc_start [B*T] describes documents packed in rows of T: per row,
/// doc_start[t] is the first position of the document holding position t, so 0 at t = 0,
/// t at a document's first position, and the previous entry elsewhere. Every consumer
/// (attention, RoPE and learned positions: position t - doc_start[t]) relies on it; the
/// model checks a batch's starts once, on the host, before they reach a device.
void attention_doc_starts_check(const int32_t* doc_start, int B, int T);

}  // namespace dtrain::ops
