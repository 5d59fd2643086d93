// Embedding lookup: a row copy per position; backward scatters rows into dwte serially
// (tokens repeat, so rows would race) and is a tiny fraction of a step.
#include "ops/embedding.h"

#include "core/check.h"

namespace dtrain::ops {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int V) {
  for (int i = 0; i < B * T; ++i)
    DT_ENFORCE(tokens[i] >= 0 && tokens[i] < V, UsageError,
               "token id {} at position {} is outside the vocabulary [0, {})", tokens[i], i, V);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* e = wte + static_cast<size_t>(tokens[b * T + t]) * C;
      if (wpe) {
        const float* p = wpe + static_cast<size_t>(t) * C;
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        for (int c = 0; c < C; ++c) o[c] = e[c];
      }
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      float* we = dwte + static_cast<size_t>(tokens[b * T + t]) * C;
      for (int c = 0; c < C; ++c) we[c] += d[c];
      if (dwpe) {
        float* wp = dwpe + static_cast<size_t>(t) * C;
        for (int c = 0; c < C; ++c) wp[c] += d[c];
      }
    }
  }
}

}  // namespace dtrain::ops
