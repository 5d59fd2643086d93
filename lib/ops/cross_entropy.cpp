// Cross-entropy: per-row max-shifted logsumexp (vectorised fp32 exp, sums in simd::LANES
// double partial sums added in a fixed order), per-row losses reduced serially in double
// so the mean is deterministic. The forward can hand each row's logsumexp to the
// backward, which then makes one pass (exp and write) instead of three.
#include "ops/cross_entropy.h"

#include "core/check.h"
#include "ops/parallel.h"
#include "ops/simd.h"

#include <cmath>
#include <cstddef>

namespace dtrain::ops {

namespace {

using simd::LANES;

void targets_check(const int32_t* targets, int N, int V, int32_t ignore_index) {
  for (int n = 0; n < N; ++n)
    DT_ENFORCE(targets[n] == ignore_index || (targets[n] >= 0 && targets[n] < V), UsageError,
               "target {} at row {} is outside the vocabulary [0, {}) and not the ignore index {}", targets[n], n, V,
               ignore_index);
}

DT_OPS_SIMD float row_max(const float* __restrict x, int V) {
  float acc[LANES];
  for (size_t k = 0; k < LANES; ++k) acc[k] = x[0];
  size_t i = 0;
  const size_t n = static_cast<size_t>(V);
  for (; i + LANES <= n; i += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  for (size_t k = 0; i + k < n; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  float m = acc[0];
  for (size_t k = 1; k < LANES; ++k) m = acc[k] > m ? acc[k] : m;
  return m;
}

DT_OPS_SIMD double row_sum_exp(const float* __restrict x, float m, int V) {
  double acc[LANES] = {};
  size_t i = 0;
  const size_t n = static_cast<size_t>(V);
  for (; i + LANES <= n; i += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] += static_cast<double>(simd::exp(x[i + k] - m));
  for (size_t k = 0; i + k < n; ++k) acc[k] += static_cast<double>(simd::exp(x[i + k] - m));
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// logsumexp of one row, rounded to fp32 (what the backward subtracts).
float row_lse(const float* x, int V) {
  const float m = row_max(x, V);
  return m + static_cast<float>(std::log(row_sum_exp(x, m, V)));
}

// d = exp(x - lse) * scale, then the target's -scale; d may alias x.
DT_OPS_SIMD void row_dlogits(float* d, const float* x, float lse, float scale, int V) {
  for (int i = 0; i < V; ++i) d[i] = simd::exp(x[i] - lse) * scale;
}

}  // namespace

int cross_entropy_count(const int32_t* targets, int N, int32_t ignore_index) {
  int c = 0;
  for (int n = 0; n < N; ++n) c += targets[n] != ignore_index;
  return c;
}

float cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V, int ld,
                            int32_t ignore_index, float* row_lse_out) {
  DT_ENFORCE_GE(ld, V, UsageError, "cross_entropy_forward: the logits' row pitch is below the vocabulary");
  targets_check(targets, N, V, ignore_index);
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * V * 8, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      if (targets[n] == ignore_index) {
        losses[n] = 0.0f;
        if (row_lse_out) row_lse_out[n] = NAN;  // not computed: a backward with other targets recomputes
        continue;
      }
      const float* x = logits + n * static_cast<size_t>(ld);
      const float lse = row_lse(x, V);
      losses[n] = lse - x[targets[n]];
      if (row_lse_out) row_lse_out[n] = lse;
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

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V, int ld,
                            float scale, int32_t ignore_index, const float* row_lse_in) {
  DT_ENFORCE_GE(ld, V, UsageError, "cross_entropy_backward: the logits' row pitch is below the vocabulary");
  targets_check(targets, N, V, ignore_index);
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * V * 8, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      float* d = dlogits + n * static_cast<size_t>(ld);
      if (targets[n] == ignore_index) {
        for (int i = 0; i < V; ++i) d[i] = 0.0f;
        continue;
      }
      const float* x = logits + n * static_cast<size_t>(ld);
      const float lse = row_lse_in && !std::isnan(row_lse_in[n]) ? row_lse_in[n] : row_lse(x, V);
      const float xt = x[targets[n]];
      row_dlogits(d, x, lse, scale, V);
      d[targets[n]] = (simd::exp(xt - lse) - 1.0f) * scale;
    }
  });
}

}  // namespace dtrain::ops
