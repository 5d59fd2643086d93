// Gradient clipping: the norm in double over a shard split the way ranks split it,
// torch's coefficient formula, and the disabled / non-finite cases.
#include "ops/optim.h"
#include "train/grad_clip.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

using namespace dtrain::train;
using dtrain::ops::grad_norm_sq;

TEST_CASE("grad_norm_sq of known vectors") {
  const float g[] = {3.0f, 4.0f};
  CHECK(grad_norm_sq(g, 2) == 25.0);
  CHECK(grad_norm_sq(g, 0) == 0.0);
  const float h[] = {1, -2, 3, -4, 5, -6, 7};  // tail after the 4-wide part
  CHECK(grad_norm_sq(h, 7) == 140.0);
}

TEST_CASE("grad_norm_sq accumulates in double and splits across shards") {
  // 1e6 values of 1e-3: an fp32 running sum would drift; double stays within ~1e-10.
  std::vector<float> g(1000000, 1e-3f);
  const double expected = 1e6 * static_cast<double>(1e-3f) * static_cast<double>(1e-3f);
  CHECK(grad_norm_sq(g.data(), g.size()) == doctest::Approx(expected).epsilon(1e-9));
  // Sum over uneven shards (what the allreduce adds up) equals the whole.
  const size_t cut1 = 333333, cut2 = 777777;
  const double parts = grad_norm_sq(g.data(), cut1) + grad_norm_sq(g.data() + cut1, cut2 - cut1) +
                       grad_norm_sq(g.data() + cut2, g.size() - cut2);
  CHECK(parts == doctest::Approx(expected).epsilon(1e-9));
  // Values whose squares overflow fp32 stay finite in double.
  const float big[] = {1e30f, 1e30f};
  CHECK(std::isfinite(grad_norm_sq(big, 2)));
  const float bad[] = {1.0f, std::numeric_limits<float>::infinity()};
  CHECK(std::isinf(grad_norm_sq(bad, 2)));
}

TEST_CASE("clip_coefficient follows torch") {
  CHECK(clip_coefficient(10.0, 1.0f) == doctest::Approx(1.0 / (10.0 + 1e-6)));
  CHECK(clip_coefficient(0.5, 1.0f) == 1.0f);
  CHECK(clip_coefficient(1.0, 1.0f) == doctest::Approx(1.0 / 1.000001));
  CHECK(clip_coefficient(0.0, 1.0f) == 1.0f);
  CHECK(clip_coefficient(100.0, 0.0f) == 1.0f);  // gradient_clipping 0 = off
  CHECK(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0f) == 1.0f);
  CHECK(clip_coefficient(std::nan(""), 1.0f) == 1.0f);
  // Applying the coefficient yields a norm of max_norm (up to the 1e-6).
  std::vector<float> g = {3.0f, 4.0f, 12.0f};  // norm 13
  const float c = clip_coefficient(std::sqrt(grad_norm_sq(g.data(), g.size())), 2.0f);
  for (float& x : g) x *= c;
  CHECK(std::sqrt(grad_norm_sq(g.data(), g.size())) == doctest::Approx(2.0).epsilon(1e-6));
}
