// Embedding lookup: a row copy per position, split over the pool by rows. The backward
// scatters rows into dwte, where tokens repeat, so it is split by channel blocks instead:
// each block walks the positions in order, so every element sums in the serial order.
#include "ops/embedding.h"

#include "core/check.h"
#include "ops/parallel.h"
#include "ops/simd.h"

namespace dtrain::ops {

namespace {
DT_OPS_SIMD void row_set(float* __restrict o, const float* __restrict e, const float* __restrict p, int C) {
  if (p) {
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  } else {
    for (int c = 0; c < C; ++c) o[c] = e[c];
  }
}

DT_OPS_SIMD void row_acc(float* __restrict dst, const float* __restrict src, int n) {
  for (int c = 0; c < n; ++c) dst[c] += src[c];
}
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V, const int32_t* doc_start) {
  for (int i = 0; i < B * T; ++i)
    DT_ENFORCE(tokens[i] >= 0 && tokens[i] < V, UsageError,
               "token id {} at position {} is outside the vocabulary [0, {})", tokens[i], i, V);
  const size_t rows = static_cast<size_t>(B) * T;
  parallel_for(rows, rows * C, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const size_t t = r % static_cast<size_t>(T) - (doc_start != nullptr ? static_cast<size_t>(doc_start[r]) : 0);
      row_set(out + r * C, wte + static_cast<size_t>(tokens[r]) * C, wpe ? wpe + t * C : nullptr, C);
    }
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        const int32_t* doc_start) {
  const size_t rows = static_cast<size_t>(B) * T;
  parallel_for(static_cast<size_t>(C), rows * C, [&](size_t begin, size_t end) {
    const int c0 = static_cast<int>(begin), w = static_cast<int>(end - begin);
    for (size_t r = 0; r < rows; ++r) {
      const float* d = dout + r * C + c0;
      row_acc(dwte + static_cast<size_t>(tokens[r]) * C + c0, d, w);
      if (!dwpe) continue;
      const size_t p = r % static_cast<size_t>(T) - (doc_start != nullptr ? static_cast<size_t>(doc_start[r]) : 0);
      row_acc(dwpe + p * C + c0, d, w);
    }
  });
}

}  // namespace dtrain::ops
