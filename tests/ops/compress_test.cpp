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
