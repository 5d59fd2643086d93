// Causal multi-head self-attention with grouped KV heads (GQA/MQA): query head h reads
// KV head h / (NH/NKV). Forward saves the softmax probabilities att [B,NH,T,T] (fine on
// CPU at the sizes this backend trains; the CUDA version may save log-sum-exp instead);
// entries above the diagonal are written as 0. Backward ACCUMULATES (+=) into dq, dk, dv;
// dk/dv sum over every query head that shares the KV head.
#pragma once

namespace dtrain::ops {

/// out[B,T,NH,HD] = softmax(q k^T / sqrt(HD) + causal mask) v, per (b, h).
/// q is [B,T,NH,HD]; k, v are [B,T,NKV,HD]; NH % NKV == 0. Rows of q are q_stride floats
/// apart and rows of k and v kv_stride apart (0: dense, NH*HD and NKV*HD), so q, k and v
/// can be read in place as column slices of a fused [B*T, (NH+2*NKV)*HD] projection.
/// window > 0: a sliding window (Mistral), query i sees keys i - window < j <= i only.
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride = 0, int kv_stride = 0, int window = 0);

/// Gradients of attention_forward given dout [B,T,NH,HD] and the saved att; dq has q's
/// row pitch and dk, dv have k's (the strides as in the forward).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* att, const float* q,
                        const float* k, const float* v, int B, int T, int NH, int NKV, int HD, int q_stride = 0,
                        int kv_stride = 0, int window = 0);

}  // namespace dtrain::ops
