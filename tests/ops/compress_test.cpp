// Top-k selection with error feedback and the sparse accumulation, against a full sort
// computed apart: the picked set (ties to the lower index, NaN as the largest), the
// residual keeping exactly what was not sent, indices ascending.
#include "ops/compress.h"

#include "core/rng.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

using namespace dtrain;

namespace {

// The k indices a full stable sort by decreasing magnitude puts first, ascending.
std::vector<int32_t> reference_topk(const std::vector<float>& x, size_t k) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto mag = [&](int32_t i) {
    return std::isnan(x[i]) ? std::numeric_limits<double>::infinity() : std::fabs(static_cast<double>(x[i]));
  };
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return mag(a) > mag(b); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

TEST_CASE("topk_select: the k largest magnitudes, ties to the lower index, the rest kept as residual") {
  Rng rng(11);
  for (size_t n : {1u, 7u, 100u, 4099u}) {
    for (size_t k : {size_t{1}, n / 3 + 1, n}) {
      CAPTURE(n);
      CAPTURE(k);
      std::vector<float> x(n);
      // Few distinct values, both signs: many ties in magnitude.
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng.below(9)) - 4);
      const std::vector<float> before = x;
      std::vector<float> vals(k);
      std::vector<int32_t> idx(k);
      ops::topk_select(x.data(), n, k, vals.data(), idx.data());
      CHECK(idx == reference_topk(before, k));
      std::vector<float> rebuilt = x;
      for (size_t i = 0; i < k; ++i) {
        CHECK(vals[i] == before[static_cast<size_t>(idx[i])]);
        CHECK(x[static_cast<size_t>(idx[i])] == 0.0f);
        rebuilt[static_cast<size_t>(idx[i])] += vals[i];
      }
      CHECK(rebuilt == before);  // sent + residual == what came in
    }
  }
}

TEST_CASE("topk_select: NaN and inf count as the largest, so an overflow is sent") {
  std::vector<float> x{1.0f, std::nanf(""), -3.0f, std::numeric_limits<float>::infinity(), 2.0f};
  std::vector<float> vals(2);
  std::vector<int32_t> idx(2);
  ops::topk_select(x.data(), x.size(), 2, vals.data(), idx.data());
  CHECK(idx == std::vector<int32_t>{1, 3});
  CHECK(std::isnan(vals[0]));
  CHECK(std::isinf(vals[1]));
  CHECK(x == std::vector<float>{1.0f, 0.0f, -3.0f, 0.0f, 2.0f});
}

TEST_CASE("sparse_add: gathered pairs summed into a dense buffer, repeated indices added, not overwritten") {
  std::vector<float> dense{1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<float> vals{2.0f, 3.0f, 0.5f, 4.0f};
  const std::vector<int32_t> idx{3, 0, 3, 1};  // two ranks' pairs, both sent index 3
  ops::sparse_add(dense.data(), vals.data(), idx.data(), vals.size());
  CHECK(dense == std::vector<float>{4.0f, 5.0f, 1.0f, 3.5f});
}

TEST_CASE("orthogonalize_columns: orthonormal columns; two power iterations reproduce a rank-2 matrix exactly") {
  Rng rng(5);
  const size_t n = 12, m = 9, r = 2;
  // M = A B^T, rank 2.
  std::vector<float> A(n * r), B(m * r), M(n * m, 0.0f);
  for (auto& v : A) v = rng.normal();
  for (auto& v : B) v = rng.normal();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j)
      for (size_t c = 0; c < r; ++c) M[i * m + j] += A[i * r + c] * B[j * r + c];
  std::vector<float> Q(m * r), P(n * r);
  for (auto& v : Q) v = rng.normal();
  for (int it = 0; it < 2; ++it) {
    ops::orthogonalize_columns(Q.data(), m, r);
    std::fill(P.begin(), P.end(), 0.0f);
    for (size_t i = 0; i < n; ++i)
      for (size_t c = 0; c < r; ++c)
        for (size_t j = 0; j < m; ++j) P[i * r + c] += M[i * m + j] * Q[j * r + c];
    ops::orthogonalize_columns(P.data(), n, r);
    for (size_t a = 0; a < r; ++a)
      for (size_t b = 0; b < r; ++b) {
        double dot = 0;
        for (size_t i = 0; i < n; ++i) dot += static_cast<double>(P[i * r + a]) * P[i * r + b];
        CHECK(dot == doctest::Approx(a == b ? 1.0 : 0.0).epsilon(1e-5).scale(1.0));
      }
    std::fill(Q.begin(), Q.end(), 0.0f);
    for (size_t j = 0; j < m; ++j)
      for (size_t c = 0; c < r; ++c)
        for (size_t i = 0; i < n; ++i) Q[j * r + c] += M[i * m + j] * P[i * r + c];
  }
  double worst = 0, big = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) {
      double a = 0;
      for (size_t c = 0; c < r; ++c) a += static_cast<double>(P[i * r + c]) * Q[j * r + c];
      worst = std::max(worst, std::fabs(a - M[i * m + j]));
      big = std::max(big, std::fabs(static_cast<double>(M[i * m + j])));
    }
  CHECK(worst < 1e-5 * big);
  // A zero column stays zero instead of dividing by 0.
  std::vector<float> z{0.0f, 1.0f, 0.0f, 1.0f};
  ops::orthogonalize_columns(z.data(), 2, 2);
  CHECK(z[0] == 0.0f);
  CHECK(z[2] == 0.0f);
}
