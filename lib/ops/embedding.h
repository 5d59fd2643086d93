// Token (+ learned position) embedding lookup, forward and backward.
// Backward ACCUMULATES (+=) into dwte / dwpe, so gradient accumulation over micro-batches
// works by calling it repeatedly; zero the gradients yourself between optimizer steps.
#pragma once

#include <cstdint>

namespace dtrain::ops {

/// out[B,T,C] = wte[tokens[b,t]] (+ wpe[t] when wpe != nullptr). wte is [V,C], wpe is
/// [>=T, C]. Throws UsageError if a token is outside [0, V).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V);

/// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t] (skipped when dwpe is null).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

}  // namespace dtrain::ops
