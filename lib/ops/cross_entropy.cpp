// Cross-entropy: per-row max-shifted logsumexp (fp32 exp, sums in double), per-row
// losses reduced serially in double so the mean is deterministic.
#include "ops/cross_entropy.h"

#include "core/check.h"
#include "ops/parallel.h"

#include <cmath>
#include <cstddef>

namespace dtrain::ops {

namespace {
void targets_check(const int32_t* targets, int N, int V, int32_t ignore_index) {
  for (int n = 0; n < N; ++n)
    DT_ENFORCE(targets[n] == ignore_index || (targets[n] >= 0 && targets[n] < V), UsageError,
               "target {} at row {} is outside the vocabulary [0, {}) and not the ignore index {}",
               targets[n], n, V, ignore_index);
}
// (max, log(sum exp(x - max))) of one row.
void row_lse(const float* x, int V, float* mx, double* lse) {
  float m = x[0];
  for (int i = 1; i < V; ++i) m = x[i] > m ? x[i] : m;
  double s = 0;
  for (int i = 0; i < V; ++i) s += std::exp(x[i] - m);
  *mx = m;
  *lse = std::log(s);
}
}  // namespace

int cross_entropy_count(const int32_t* targets, int N, int32_t ignore_index) {
  int c = 0;
  for (int n = 0; n < N; ++n) c += targets[n] != ignore_index;
  return c;
}

float cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                            int V, int ld, int32_t ignore_index) {
  DT_ENFORCE_GE(ld, V, UsageError, "cross_entropy_forward: the logits' row pitch is below the vocabulary");
  targets_check(targets, N, V, ignore_index);
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * V, [&](size_t begin, size_t end) {
    for (int n = static_cast<int>(begin); n < static_cast<int>(end); ++n) {
      if (targets[n] == ignore_index) {
        losses[n] = 0.0f;
        continue;
      }
      const float* x = logits + static_cast<size_t>(n) * ld;
      float m;
      double lse;
      row_lse(x, V, &m, &lse);
      losses[n] = static_cast<float>(lse - static_cast<double>(x[targets[n]] - m));
    }
  });
  double sum = 0;
  int count = 0;
  for (int n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    sum += losses[n];
    ++count;
  }
  return count ? static_cast<float>(sum / count) : 0.0f;
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets, int N,
                            int V, int ld, float scale, int32_t ignore_index) {
  DT_ENFORCE_GE(ld, V, UsageError, "cross_entropy_backward: the logits' row pitch is below the vocabulary");
  targets_check(targets, N, V, ignore_index);
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * V, [&](size_t begin, size_t end) {
    for (int n = static_cast<int>(begin); n < static_cast<int>(end); ++n) {
      float* d = dlogits + static_cast<size_t>(n) * ld;
      if (targets[n] == ignore_index) {
        for (int i = 0; i < V; ++i) d[i] = 0.0f;
        continue;
      }
      const float* x = logits + static_cast<size_t>(n) * ld;
      float m;
      double lse;
      row_lse(x, V, &m, &lse);
      const float lsef = static_cast<float>(lse);
      for (int i = 0; i < V; ++i) {
        float p = std::exp(x[i] - m - lsef);
        d[i] = (p - (i == targets[n] ? 1.0f : 0.0f)) * scale;
      }
    }
  });
}

}  // namespace dtrain::ops
