// Rng: determinism per seed, exact state save/restore, and the statistics of uniform,
// normal and bounded-integer draws (loose bounds, many samples, fixed seeds).
#include "core/rng.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace dtrain;

TEST_CASE("same seed gives the same stream, different seeds differ") {
  Rng a(42), b(42), c(43);
  int differ = 0;
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.next_u64();
    CHECK(x == b.next_u64());
    differ += x != c.next_u64();
  }
  CHECK(differ == 100);
  Rng z(0);
  CHECK(z.next_u64() != 0);  // seed 0 is a valid, non-degenerate seed
}

TEST_CASE("state() / set_state() continue the stream exactly") {
  Rng a(7);
  for (int i = 0; i < 13; ++i) a.normal();
  Rng::State s = a.state();
  std::vector<float> first;
  for (int i = 0; i < 50; ++i) first.push_back(i % 3 == 0 ? a.normal() : i % 3 == 1 ? a.uniform() : float(a.below(10)));
  Rng b(999);
  b.set_state(s);
  for (int i = 0; i < 50; ++i) {
    float v = i % 3 == 0 ? b.normal() : i % 3 == 1 ? b.uniform() : float(b.below(10));
    CHECK(v == first[size_t(i)]);
  }
}

TEST_CASE("uniform is in [0,1) with mean 1/2 and variance 1/12") {
  Rng r(1);
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = r.uniform();
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    s += u;
    s2 += double(u) * u;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  CHECK(std::abs(mean - 0.5) < 0.005);
  CHECK(std::abs(var - 1.0 / 12) < 0.002);
  float lo = r.uniform(-3.0f, -1.0f);
  CHECK(lo >= -3.0f);
  CHECK(lo < -1.0f);
}

TEST_CASE("normal has the requested mean and stddev and gaussian tails") {
  Rng r(2);
  const int n = 200000;
  double s = 0, s2 = 0;
  int beyond2 = 0;
  for (int i = 0; i < n; ++i) {
    float z = r.normal(1.0f, 0.5f);
    REQUIRE(std::isfinite(z));
    s += z;
    s2 += double(z) * z;
    beyond2 += std::abs(z - 1.0f) > 1.0f;  // |z| > 2 sigma: 4.55%
  }
  double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  CHECK(std::abs(mean - 1.0) < 0.01);
  CHECK(std::abs(sd - 0.5) < 0.01);
  CHECK(std::abs(double(beyond2) / n - 0.0455) < 0.004);
}

TEST_CASE("below(n) is unbiased and in range") {
  Rng r(3);
  std::vector<int> counts(7, 0);
  const int n = 70000;
  for (int i = 0; i < n; ++i) {
    uint64_t k = r.below(7);
    REQUIRE(k < 7);
    counts[k]++;
  }
  for (int c : counts) CHECK(std::abs(c - 10000) < 500);
  CHECK(r.below(1) == 0);
  uint64_t big = (1ull << 63) + 5;
  for (int i = 0; i < 100; ++i) CHECK(r.below(big) < big);
  CHECK_THROWS_AS(r.below(0), UsageError);
}

TEST_CASE("splitmix64 decorrelates nearby counters") {
  CHECK(splitmix64(0) != splitmix64(1));
  CHECK(splitmix64(1) != splitmix64(2));
  CHECK(splitmix64(5) == splitmix64(5));
}
