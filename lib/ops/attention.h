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

/// dK/dV blocks per SM the tensor-core kernel is built for at a padded head dim (32, 64,
/// 128, 256): its __launch_bounds__ hold 128 and 168 registers at 32 and 64, 255 registers
/// give 2 at 128, shared memory 1 at 256.
constexpr int attention_dkdv_blocks_per_sm(int hdp) { return hdp <= 32 ? 4 : hdp <= 64 ? 3 : hdp <= 128 ? 2 : 1; }

/// How many blocks share the G query heads of one KV head in the tensor-core dK/dV kernel
/// (kernels/attention_mma.cu): a divisor of G, 1 = each block walks the whole group and no
/// partial sums exist. Its blocks run G / split heads' query tiles each, the longest (key
/// tile 0) G / split x nt tiles; the smallest split for which that longest block is at most
/// the mean work per resident block slot twice over (2 x slots / (B x NKV x (nt + 1)),
/// slots = sms x blocks_per_sm, nt = the 64-row tiles along T), so the tail of the grid is
/// not one group's walk. Above 1 the blocks write fp32 partials that one kernel sums in
/// split order (deterministic). The CUDA kernels and the --plan budget both use it (inline:
/// the kernels library does not link the CPU ops). Sizes below 1 count as 1.
inline int attention_dkdv_split(int B, int NKV, int G, int T, int sms, int blocks_per_sm) {
  auto at_least_1 = [](int v) { return v > 0 ? v : 1; };
  G = at_least_1(G);
  const double nt = static_cast<double>((at_least_1(T) + 63) / 64);
  const double need = 2.0 * at_least_1(sms) * at_least_1(blocks_per_sm) /
                      (static_cast<double>(at_least_1(B)) * at_least_1(NKV) * (nt + 1));
  for (int s = 1; s < G; ++s)
    if (G % s == 0 && s >= need) return s;
  return G;
}

}  // namespace dtrain::ops
