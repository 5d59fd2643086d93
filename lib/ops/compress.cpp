// Top-k selection with error feedback and sparse accumulation (ops/compress.h): a
// selection over an index array (std::nth_element with a strict total order, so the
// result does not depend on the library's pivots), then the picked indices sorted.
#include "ops/compress.h"

#include "core/check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace dtrain::ops {

namespace {
float magnitude(float x) { return std::isnan(x) ? std::numeric_limits<float>::infinity() : std::fabs(x); }
}  // namespace

void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) {
  DT_ENFORCE(k <= n, UsageError, "topk_select: k = {} > n = {}", k, n);
  DT_ENFORCE(n < (size_t{1} << 31), UsageError, "topk_select: {} elements do not fit int32 indices", n);
  if (k == 0) return;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    const float ma = magnitude(residual[a]), mb = magnitude(residual[b]);
    return ma > mb || (ma == mb && a < b);
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + static_cast<ptrdiff_t>(k) - 1, order.end(), before);
  std::sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(k));
  for (size_t i = 0; i < k; ++i) {
    const int32_t at = order[i];
    indices[i] = at;
    values[i] = residual[at];
    residual[at] = 0.0f;
  }
}

void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) {
  for (size_t i = 0; i < count; ++i) dense[indices[i]] += values[i];
}

void orthogonalize_columns(float* a, size_t rows, size_t cols) {
  for (size_t i = 0; i < cols; ++i) {
    double sq = 0.0;
    for (size_t r = 0; r < rows; ++r) sq += static_cast<double>(a[r * cols + i]) * a[r * cols + i];
    const double norm = std::sqrt(sq);
    if (norm > 0.0)
      for (size_t r = 0; r < rows; ++r) a[r * cols + i] = static_cast<float>(a[r * cols + i] / norm);
    for (size_t j = i + 1; j < cols; ++j) {
      double dot = 0.0;
      for (size_t r = 0; r < rows; ++r) dot += static_cast<double>(a[r * cols + i]) * a[r * cols + j];
      for (size_t r = 0; r < rows; ++r) a[r * cols + j] -= static_cast<float>(dot * a[r * cols + i]);
    }
  }
}

}  // namespace dtrain::ops
