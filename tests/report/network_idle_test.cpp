// network_idle (issue 32): sequences of every node's latest samples -> the alert raised
// once per episode, after `samples` judgements in a row, for the idle node only; what a
// one-rank job, a single-host job, a straggler, a stale peer and a repeated poll do.
#include "report/network_idle.h"

#include <doctest/doctest.h>

#include <optional>
#include <vector>

using namespace dtrain::report;

namespace {

struct RankFig {
  int rank;
  std::optional<double> frac;
};

// One node's latest samples: each rank sampled at t_ms; the node's traffic rx+tx = mbps.
NodeResources node(int k, int64_t t_ms, std::optional<double> mbps, std::vector<RankFig> ranks) {
  NodeResources n;
  n.node = k;
  n.host = "n" + std::to_string(k);
  n.time_ms = t_ms;
  if (mbps) {
    n.net_rx_mbps = *mbps / 2;
    n.net_tx_mbps = *mbps / 2;
  }
  for (const RankFig& r : ranks) {
    RankResources x;
    x.rank = r.rank;
    x.time_ms = t_ms;
    x.in_collective_frac = r.frac;
    n.ranks.push_back(x);
  }
  return n;
}

// Two nodes of two ranks each at sample i (1 s apart): node 1 moves `idle_mbps`, node 0
// 5 MB/s; every rank spends `frac` of the interval in collectives.
std::vector<NodeResources> job(int i, double idle_mbps, double frac) {
  const int64_t t = 1000 * i;
  return {node(0, t, 5.0, {{0, frac}, {1, frac}}), node(1, t + 3, idle_mbps, {{2, frac}, {3, frac}})};
}

}  // namespace

TEST_CASE("network_idle: two idle samples in a row raise one alert for the idle node, then none until it clears") {
  NetworkIdleWatch w({.min_mbps = 0.05, .collective_frac = 0.5, .samples = 2});
  CHECK(w.update(job(0, 4.0, 0.9)).empty());   // moving data
  CHECK(w.update(job(1, 0.01, 0.9)).empty());  // idle once: not yet
  auto a = w.update(job(2, 0.01, 0.9));        // idle twice: the episode starts
  REQUIRE(a.size() == 1);
  CHECK(a[0].node == 1);
  CHECK(a[0].rank == 2);
  CHECK(a[0].host == "n1");
  CHECK(a[0].time_ms == 2003);
  CHECK(a[0].why.find("monitor.min_network") != std::string::npos);
  for (int i = 3; i < 10; ++i) CHECK(w.update(job(i, 0.0, 1.0)).empty());  // same episode
  CHECK(w.update(job(10, 2.0, 0.9)).empty());                              // cleared
  CHECK(w.update(job(11, 0.0, 0.9)).empty());                              // a new episode: once...
  CHECK(w.update(job(12, 0.0, 0.9)).size() == 1);                          // ...and twice
}

TEST_CASE("network_idle: one idle sample between busy ones never alerts") {
  NetworkIdleWatch w({.min_mbps = 0.05, .samples = 2});
  for (int i = 0; i < 20; ++i) CHECK(w.update(job(i, i % 2 ? 0.0 : 3.0, 0.9)).empty());
}

TEST_CASE("network_idle: a poll without a new sample of the node is no judgement") {
  NetworkIdleWatch w({.min_mbps = 0.05, .samples = 2});
  const auto same = job(1, 0.0, 0.9);
  CHECK(w.update(same).empty());
  CHECK(w.update(same).empty());  // the same samples again: still one judgement
  CHECK(w.update(same).empty());
  CHECK(w.update(job(2, 0.0, 0.9)).size() == 1);
}

TEST_CASE("network_idle: no alert unless every rank, the idle node's own included, is in a collective") {
  NetworkIdleWatch w({.min_mbps = 0.05, .collective_frac = 0.5, .samples = 2});
  // Ranks in collectives only 20 % of the time: the job computes, an idle link is normal.
  for (int i = 0; i < 5; ++i) CHECK(w.update(job(i, 0.0, 0.2)).empty());
  // The idle node's ranks compute while the peers wait (a straggler): not the network.
  for (int i = 5; i < 10; ++i) {
    const int64_t t = 1000 * i;
    CHECK(w.update({node(0, t, 0.0, {{0, 0.95}, {1, 0.95}}), node(1, t, 0.0, {{2, 0.1}, {3, 0.95}})}).empty());
  }
  // Everyone waits and node 1 moves nothing: the alert.
  CHECK(w.update(job(10, 0.0, 0.9)).empty());
  CHECK(w.update(job(11, 0.0, 0.9)).size() == 1);
}

TEST_CASE("network_idle: a stalled two-node ring names every node under the threshold") {
  NetworkIdleWatch w({.min_mbps = 0.05, .samples = 2});
  auto both = [](int i) {
    const int64_t t = 1000 * i;
    return std::vector<NodeResources>{node(0, t, 0.01, {{0, 0.99}}), node(1, t, 0.0, {{1, 0.99}})};
  };
  CHECK(w.update(both(0)).empty());
  const auto a = w.update(both(1));
  REQUIRE(a.size() == 2);
  CHECK(a[0].node == 0);
  CHECK(a[1].node == 1);
}

TEST_CASE("network_idle: missing figures, stale peers, one node, one host or a zero threshold: no alert") {
  SUBCASE("a one-rank job (no in_collective_frac)") {
    NetworkIdleWatch w({.min_mbps = 0.05, .samples = 1});
    for (int i = 0; i < 4; ++i) CHECK(w.update({node(0, 1000 * i, 0.0, {{0, std::nullopt}})}).empty());
  }
  SUBCASE("one node of several ranks") {
    NetworkIdleWatch w({.min_mbps = 0.05, .samples = 1});
    for (int i = 0; i < 4; ++i) CHECK(w.update({node(0, 1000 * i, 0.0, {{0, 1.0}, {1, 1.0}})}).empty());
  }
  SUBCASE("the nodes share one host") {
    NetworkIdleWatch w({.min_mbps = 0.05, .samples = 1, .spans_hosts = false});
    for (int i = 0; i < 4; ++i) CHECK(w.update(job(i, 0.0, 1.0)).empty());
  }
  SUBCASE("monitor.min_network 0") {
    NetworkIdleWatch w({.min_mbps = 0, .samples = 1});
    for (int i = 0; i < 4; ++i) CHECK(w.update(job(i, 0.0, 1.0)).empty());
  }
  SUBCASE("no network figures yet (first samples)") {
    NetworkIdleWatch w({.min_mbps = 0.05, .samples = 2});
    for (int i = 0; i < 4; ++i) {
      const int64_t t = 1000 * i;
      CHECK(w.update({node(0, t, std::nullopt, {{0, 1.0}}), node(1, t, std::nullopt, {{1, 1.0}})}).empty());
    }
    // Undecided judgements neither start nor end an episode: two decided ones are needed.
    CHECK(w.update(job(4, 0.0, 1.0)).empty());
    CHECK(w.update(job(5, 0.0, 1.0)).size() == 1);
  }
  SUBCASE("a peer whose last sample is older than max_skew_ms") {
    NetworkIdleWatch w({.min_mbps = 0.05, .samples = 2, .max_skew_ms = 3000});
    for (int i = 10; i < 15; ++i)
      CHECK(w.update({node(0, 0, 5.0, {{0, 1.0}}), node(1, 1000 * i, 0.0, {{1, 1.0}})}).empty());
  }
}
