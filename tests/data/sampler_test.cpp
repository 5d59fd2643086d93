// DistributedSampler: exact coverage per epoch across ranks, determinism, reshuffling,
// exact resume, and resume on a different world size.
#include "data/sampler.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <map>
#include <set>

using namespace dtrain;
using namespace dtrain::data;

namespace {

// One epoch's draws of every rank, in step order (rank-major per step).
std::vector<std::vector<size_t>> draw_epoch(size_t n, int W, uint64_t seed, bool shuffle, bool drop_last) {
  std::vector<std::vector<size_t>> per_rank(W);
  for (int r = 0; r < W; ++r) {
    DistributedSampler s(n, r, W, seed, shuffle, drop_last);
    for (size_t k = 0; k < s.steps_per_epoch(); ++k) per_rank[r].push_back(s.next());
    CHECK(s.position() == SamplerPosition{0, s.steps_per_epoch() * static_cast<uint64_t>(W)});
  }
  return per_rank;
}

}  // namespace

TEST_CASE("every sample once per epoch across ranks, W = 1..7, drop_last false and true") {
  for (size_t n : {1, 5, 13, 29, 64, 101}) {
    for (int W = 1; W <= 7; ++W) {
      for (bool drop_last : {false, true}) {
        if (drop_last && n < static_cast<size_t>(W)) continue;
        CAPTURE(n);
        CAPTURE(W);
        CAPTURE(drop_last);
        auto per_rank = draw_epoch(n, W, 42, true, drop_last);
        std::map<size_t, int> count;
        size_t steps = per_rank[0].size();
        for (const auto& v : per_rank) {
          CHECK(v.size() == steps);  // every rank takes the same number of steps
          for (size_t i : v) {
            CHECK(i < n);
            ++count[i];
          }
        }
        if (drop_last) {
          CHECK(steps == n / W);
          CHECK(count.size() == (n / W) * W);
          for (auto& [i, c] : count) CHECK(c == 1);
        } else {
          CHECK(steps == (n + W - 1) / W);
          CHECK(count.size() == n);  // all covered
          size_t dups = 0;
          for (auto& [i, c] : count) {
            CHECK(c >= 1);
            dups += c - 1;
          }
          CHECK(dups == steps * W - n);  // only the wrap padding repeats
        }
      }
    }
  }
}

TEST_CASE("rank r takes entries r, r+W, ... of the permutation") {
  DistributedSampler ref(17, 0, 1, 9, true, false);
  std::vector<size_t> perm = ref.permutation(0);
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(17, r, 4, 9, true, false);
    for (size_t k = 0; k < 5; ++k) CHECK(s.next() == perm[(k * 4 + r) % 17]);
  }
  DistributedSampler plain(10, 1, 3, 9, false, false);
  CHECK(plain.next() == 1);
  CHECK(plain.next() == 4);
  CHECK(plain.next() == 7);
  CHECK(plain.next() == 0);  // wrap padding of the last step
}

TEST_CASE("same seed same order, epochs reshuffle, seeds differ") {
  DistributedSampler a(50, 0, 1, 7, true, false), b(50, 0, 1, 7, true, false), c(50, 0, 1, 8, true, false);
  std::vector<size_t> e0a, e1a, e0b, e0c;
  for (int i = 0; i < 50; ++i) e0a.push_back(a.next());
  for (int i = 0; i < 50; ++i) e1a.push_back(a.next());
  for (int i = 0; i < 50; ++i) e0b.push_back(b.next());
  for (int i = 0; i < 50; ++i) e0c.push_back(c.next());
  CHECK(e0a == e0b);
  CHECK(e0a != e1a);
  CHECK(e0a != e0c);
  CHECK(std::set<size_t>(e1a.begin(), e1a.end()).size() == 50);
  CHECK(a.position() == SamplerPosition{1, 50});
  // The next call rolls into epoch 2.
  a.next();
  CHECK(a.position() == SamplerPosition{2, 1});
}

TEST_CASE("resume at an exact position gives the identical continuation") {
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(23, r, 3, 5, true, true);
    for (int i = 0; i < 11; ++i) s.next();  // into epoch 1
    SamplerPosition pos = s.position();
    std::vector<size_t> rest;
    for (int i = 0; i < 20; ++i) rest.push_back(s.next());
    DistributedSampler t(23, r, 3, 5, true, true);
    t.set_position(pos);
    std::vector<size_t> again;
    for (int i = 0; i < 20; ++i) again.push_back(t.next());
    CHECK(rest == again);
  }
}

TEST_CASE("resume at a global position with a different world size covers the rest of the epoch") {
  const size_t n = 41;
  for (int w_old : {2, 3, 4}) {
    for (int w_new : {1, 3, 5, 6}) {
      for (bool drop_last : {false, true}) {
        CAPTURE(w_old);
        CAPTURE(w_new);
        CAPTURE(drop_last);
        // The old job ran 4 steps on w_old ranks.
        std::multiset<size_t> seen;
        SamplerPosition pos;
        for (int r = 0; r < w_old; ++r) {
          DistributedSampler s(n, r, w_old, 11, true, drop_last);
          for (int k = 0; k < 4; ++k) seen.insert(s.next());
          pos = s.position();
        }
        CHECK(pos == SamplerPosition{0, 4u * w_old});
        // The new job continues from the same global point until epoch 0 ends.
        std::vector<std::vector<size_t>> got(w_new);
        for (int r = 0; r < w_new; ++r) {
          DistributedSampler s(n, r, w_new, 11, true, drop_last);
          s.set_position(pos);
          while (true) {
            size_t i = s.next();
            if (s.position().epoch != 0) break;
            got[r].push_back(i);
          }
        }
        for (const auto& v : got) CHECK(v.size() == got[0].size());
        std::multiset<size_t> all = seen;
        for (const auto& v : got) all.insert(v.begin(), v.end());
        std::set<size_t> distinct(all.begin(), all.end());
        if (drop_last) {
          // Every sample at most once; only the tail short of a full step is left out.
          CHECK(distinct.size() == all.size());
          CHECK(n - all.size() < static_cast<size_t>(w_new));
        } else {
          CHECK(distinct.size() == n);  // every sample read
          CHECK(all.size() - n < static_cast<size_t>(w_new));
        }
      }
    }
  }
}

TEST_CASE("invalid sampler arguments are ConfigErrors") {
  CHECK_THROWS_AS(DistributedSampler(0, 0, 1, 0, true, false), ConfigError);
  CHECK_THROWS_AS(DistributedSampler(10, 3, 3, 0, true, false), ConfigError);
  CHECK_THROWS_AS(DistributedSampler(10, -1, 3, 0, true, false), ConfigError);
  CHECK_THROWS_AS(DistributedSampler(2, 0, 3, 0, true, true), ConfigError);
  CHECK_NOTHROW(DistributedSampler(2, 2, 3, 0, true, false));
}
