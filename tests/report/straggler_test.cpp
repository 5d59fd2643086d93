// The straggler rule: a rank above factor x the median (lower median for even counts)
// in `window` consecutive records is flagged; one fast record resets it; a new world size
// starts over. (The per-rank times travel in the progress record: progress_record_test.)
#include "report/straggler.h"

#include <doctest/doctest.h>

#include <cmath>

using namespace dtrain::report;

TEST_CASE("straggler: median is the lower middle value") {
  CHECK(straggler_median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(straggler_median({10.0, 40.0}) == 10.0);
  CHECK(straggler_median({4.0, 1.0, 3.0, 2.0}) == 2.0);
  CHECK(std::isnan(straggler_median({})));
}

TEST_CASE("straggler: flagged only after window consecutive slow records") {
  StragglerDetector d(1.5, 3);
  CHECK(d.add({10, 11, 30}).empty());
  CHECK(d.add({10, 11, 30}).empty());
  const auto& f = d.add({10, 11, 30});
  REQUIRE(f.size() == 1);
  CHECK(f[0].rank == 2);
  CHECK(f[0].median_ms == 11.0);
  CHECK(f[0].ratio == doctest::Approx(30.0 / 11.0));
  CHECK(f[0].records == 3);
  CHECK(d.add({10, 11, 30}).size() == 1);
  // one record at normal speed: no longer flagged, and the count starts over
  CHECK(d.add({10, 11, 12}).empty());
  CHECK(d.add({10, 11, 30}).empty());
}

TEST_CASE("straggler: not above the factor is not slow; two ranks can tell one slow rank") {
  StragglerDetector d(1.5, 1);
  CHECK(d.add({10, 14.9, 10}).empty());
  CHECK(d.add({10, 15.1, 10}).size() == 1);
  StragglerDetector two(1.5, 2);
  two.add({10, 25});
  const auto& f = two.add({10, 25});
  REQUIRE(f.size() == 1);
  CHECK(f[0].rank == 1);
  StragglerDetector one(1.5, 1);
  CHECK(one.add({100}).empty());  // one rank: nothing to compare with
}

TEST_CASE("straggler: a record of another world size starts the count over") {
  StragglerDetector d(1.5, 2);
  d.add({10, 10, 30});
  CHECK(d.add({10, 30}).empty());  // 2 ranks now: the 3-rank streak does not carry over
  CHECK(d.add({10, 30}).size() == 1);
}

TEST_CASE("straggler: a rank slower at a negligible share of the step is not flagged") {
  StragglerDetector d(1.5, 1);
  // rank 0: 0.6 ms of a 165 ms step against a median 0.2 ms: 3x, but 0.2% of the step
  CHECK(d.add({0.6, 0.2, 0.2}, {164, 164.5, 164.5}).empty());
  // the same ratio when compute is the step: flagged
  CHECK(d.add({60, 20, 20}, {5, 45, 45}).size() == 1);
  // without comm figures the ratio alone decides
  CHECK(d.add({0.6, 0.2, 0.2}).size() == 1);
}
