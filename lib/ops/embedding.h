// Token (+ learned position) embedding lookup, forward and backward.
// Backward ACCUMULATES (+=) into dwte / dwpe, so gradient accumulation over micro-batches
// works by calling it repeatedly; zero the gradients yourself between optimizer steps.
#pragma once

#include <cstdint>

namespace dtrain::ops {

/// out[B,T,C] = wte[tokens[b,t]] (+ wpe[p] when wpe != nullptr, p = t, or t - doc_start[b*T + t]
/// with packed documents: ops/attention.h's layout). wte is [V,C], wpe is [>=T, C]. Throws
/// UsageError if a token is outside [0, V).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V, const int32_t* doc_start = nullptr);

/// dwte[tokens[b,t]] += dout[b,t]; dwpe[p] += dout[b,t] with p as in the forward, in row
/// order (skipped when dwpe is null).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        const int32_t* doc_start = nullptr);

}  // namespace dtrain::ops
