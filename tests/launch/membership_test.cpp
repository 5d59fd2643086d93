// Elastic membership bookkeeping: first round over the first max_nodes hosts that pass
// the probe, a member failing the probe or max_node_failures rounds in a row is left out
// (with its cause), a host left out for failures sits out one round, hosts rejoin when
// they pass again, and too few hosts is a problem naming each host's cause.
#include "launch/membership.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain::launch;

namespace {

dtrain::config::Hostfile hosts(int n) {
  dtrain::config::Hostfile hf;
  for (int i = 0; i < n; ++i) {
    dtrain::config::HostEntry h;
    h.host = "node" + std::to_string(i);
    h.slots = 2;
    h.slot_ids = {0, 1};
    hf.hosts.push_back(h);
  }
  return hf;
}

std::vector<ProbeResult> all_ok(int n) {
  return std::vector<ProbeResult>(static_cast<size_t>(n), ProbeResult{true, ""});
}

std::vector<ProbeResult> failing(int n, std::vector<int> bad) {
  auto r = all_ok(n);
  for (int b : bad) r[static_cast<size_t>(b)] = {false, "ssh: connection refused"};
  return r;
}

}  // namespace

TEST_CASE("membership: not elastic runs every host every round, whatever the probes say") {
  Membership m(hosts(3), 0, 0, 2);
  CHECK_FALSE(m.elastic());
  auto r = m.plan_round(failing(3, {1}));
  CHECK(r.hosts == std::vector<int>{0, 1, 2});
  CHECK(r.changes.empty());
  CHECK(r.problem.empty());
  CHECK(m.rejoin_candidates().empty());
}

TEST_CASE("membership: a node that fails the probe is left out and rejoins once it passes again") {
  Membership m(hosts(3), 2, 3, 2);
  auto r0 = m.plan_round(all_ok(3));
  CHECK(r0.hosts == std::vector<int>{0, 1, 2});
  REQUIRE(r0.changes.size() == 3);
  CHECK(r0.changes[0].cause == "initial membership");
  CHECK(m.rejoin_candidates().empty());  // full: nothing to probe

  auto r1 = m.plan_round(failing(3, {2}));
  CHECK(r1.problem.empty());
  CHECK(r1.hosts == std::vector<int>{0, 1});
  REQUIRE(r1.changes.size() == 1);
  CHECK_FALSE(r1.changes[0].joined);
  CHECK(r1.changes[0].name == "node2");
  CHECK(r1.changes[0].cause.find("failed the probe: ssh: connection refused") != std::string::npos);
  CHECK(m.rejoin_candidates() == std::vector<int>{2});

  auto r2 = m.plan_round(failing(3, {2}));  // still down: no change
  CHECK(r2.hosts == std::vector<int>{0, 1});
  CHECK(r2.changes.empty());

  auto r3 = m.plan_round(all_ok(3));
  CHECK(r3.hosts == std::vector<int>{0, 1, 2});
  REQUIRE(r3.changes.size() == 1);
  CHECK(r3.changes[0].joined);
  CHECK(r3.changes[0].cause.find("passed the probe again") != std::string::npos);
  CHECK(m.rejoin_candidates().empty());
}

TEST_CASE("membership: max_node_failures rounds in a row leave a node out; it sits out one round") {
  Membership m(hosts(3), 2, 3, 2);
  m.plan_round(all_ok(3));
  m.round_failed(1, "rank 3 exited with code 1");
  auto r1 = m.plan_round(all_ok(3));
  CHECK(r1.hosts == std::vector<int>{0, 1, 2});  // one failure is not enough
  CHECK(r1.changes.empty());
  m.round_failed(1, "rank 3 exited with code 1");
  auto r2 = m.plan_round(all_ok(3));  // passes the probe but failed twice: out for this round
  CHECK(r2.hosts == std::vector<int>{0, 2});
  REQUIRE(r2.changes.size() == 1);
  CHECK(r2.changes[0].cause.find("failed 2 round(s) in a row") != std::string::npos);
  CHECK(r2.changes[0].cause.find("rank 3 exited with code 1") != std::string::npos);
  CHECK(m.rejoin_candidates().empty());  // sitting out: not probed during this round
  auto r3 = m.plan_round(all_ok(3));
  CHECK(r3.hosts == std::vector<int>{0, 1, 2});
}

TEST_CASE("membership: a healthy round resets the failure streaks") {
  Membership m(hosts(2), 1, 2, 2);
  m.plan_round(all_ok(2));
  m.round_failed(0, "x");
  m.round_healthy();
  m.round_failed(0, "x");
  CHECK(m.plan_round(all_ok(2)).hosts == std::vector<int>{0, 1});
}

TEST_CASE("membership: hosts beyond max_nodes are standbys that replace a node left out") {
  Membership m(hosts(4), 2, 3, 1);
  auto r0 = m.plan_round(all_ok(4));
  CHECK(r0.hosts == std::vector<int>{0, 1, 2});
  auto r1 = m.plan_round(failing(4, {0}));
  CHECK(r1.hosts == std::vector<int>{1, 2, 3});
  REQUIRE(r1.changes.size() == 2);
  CHECK_FALSE(r1.changes[0].joined);
  CHECK(r1.changes[1].joined);
  CHECK(r1.changes[1].name == "node3");
  // node0 back: no room (3 = max), it stays a standby
  auto r2 = m.plan_round(all_ok(4));
  CHECK(r2.hosts == std::vector<int>{1, 2, 3});
  CHECK(r2.changes.empty());
}

TEST_CASE("membership: fewer than min_nodes is a problem naming every host left out and why") {
  Membership m(hosts(3), 2, 3, 2);
  auto r0 = m.plan_round(failing(3, {0, 2}));
  CHECK(r0.hosts == std::vector<int>{1});
  REQUIRE_FALSE(r0.problem.empty());
  CHECK(r0.problem.find("fewer than elastic.min_nodes = 2") != std::string::npos);
  CHECK(r0.problem.find("node0: failed the probe") != std::string::npos);
  CHECK(r0.problem.find("node2: failed the probe") != std::string::npos);
  auto r1 = m.plan_round(all_ok(3));
  CHECK(r1.problem.empty());
  CHECK(r1.hosts == std::vector<int>{0, 1, 2});
}

TEST_CASE("membership: failures blamed on a host that is not a member, or on no host, change nothing") {
  Membership m(hosts(3), 2, 2, 1);
  m.plan_round(all_ok(3));
  m.round_failed(2, "standby");  // not a member
  m.round_failed(-1, "no one node");
  CHECK(m.plan_round(all_ok(3)).hosts == std::vector<int>{0, 1});
}
