// simd.h: the vectorisable expf against libm's double exp over the range the ops use
// (relative error within 4 fp32 ulp), saturation at both ends, NaN propagation; tanh and
// sigmoid built on it within 2e-7 absolute; the fixed lane tree of lanes_sum.
#include "ops/simd.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace dtrain::ops;

TEST_CASE("simd::exp is within 4 ulp of exp over [-87, 88]") {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
    const double ref = std::exp(static_cast<double>(x));
    const double err = std::abs(static_cast<double>(simd::exp(x)) - ref) / ref;
    worst = std::max(worst, err);
  }
  CHECK(worst <= 4 * std::numeric_limits<float>::epsilon());
  CHECK(simd::exp(0.0f) == 1.0f);
  CHECK(simd::exp(-1000.0f) >= 0.0f);
  CHECK(simd::exp(-1000.0f) < 1e-37f);
  CHECK(std::isfinite(simd::exp(1000.0f)));
  CHECK(simd::exp(1000.0f) > 1e38f);
  CHECK(std::isnan(simd::exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("simd::tanh and simd::sigmoid are within 2e-7 of libm") {
  double wt = 0, ws = 0;
  for (int i = 0; i <= 20000; ++i) {
    const float x = -30.0f + 60.0f * static_cast<float>(i) / 20000.0f;
    wt = std::max(wt, std::abs(static_cast<double>(simd::tanh(x)) - std::tanh(static_cast<double>(x))));
    ws =
        std::max(ws, std::abs(static_cast<double>(simd::sigmoid(x)) - 1.0 / (1.0 + std::exp(-static_cast<double>(x)))));
  }
  CHECK(wt <= 2e-7);
  CHECK(ws <= 2e-7);
  CHECK(simd::tanh(100.0f) == 1.0f);
  CHECK(simd::tanh(-100.0f) == -1.0f);
}

TEST_CASE("lanes_sum adds the lanes in its fixed tree") {
  const float acc[simd::LANES] = {1e8f, 1.0f, 2.0f, 3.0f, -1e8f, 4.0f, 5.0f, 6.0f};
  CHECK(simd::lanes_sum(acc) == 21.0);
}
