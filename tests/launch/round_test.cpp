// A round's watch step without processes: round_watch fed the observations the
// supervisor makes (agents' exits with when they were seen, heartbeats, the ranks'
// watch, a signal) decides how the round ends; and the culprit rule it shares with the
// agents' local rank groups and `dtrain run`'s rank 0.
#include "launch/culprit.h"
#include "launch/round.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <csignal>

using namespace dtrain;
using namespace dtrain::launch;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

ExitStatus exited(int code) {
  ExitStatus st;
  st.exited = true;
  st.code = code;
  return st;
}

ExitStatus killed(int sig) {
  ExitStatus st;
  st.signal = sig;
  return st;
}

RoundWatchLimits limits() {
  RoundWatchLimits l;
  l.first_beat_grace = 10s;
  l.heartbeat_timeout = 4s;
  l.culprit_window = 1s;
  return l;
}

// Three running nodes that beat 1 s ago, 20 s into the round.
RoundObservation running(Clock::time_point t0) {
  RoundObservation o;
  o.started = t0;
  o.now = t0 + 20s;
  o.nodes.resize(3);
  for (auto& n : o.nodes) n.last_beat = o.now - 1s;
  return o;
}

}  // namespace

TEST_CASE("round_watch: nothing to act on while every node runs and beats") {
  const auto t0 = Clock::now();
  const RoundVerdict v = round_watch(running(t0), limits());
  CHECK(v.kind == RoundVerdict::Kind::WATCH);
  CHECK_FALSE(v.node.has_value());
}

TEST_CASE("round_watch: every agent succeeded, the round succeeded") {
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  for (auto& n : o.nodes) n.exit = exited(0);
  CHECK(round_watch(o, limits()).kind == RoundVerdict::Kind::SUCCEEDED);
  // Two of three done, the third silent for longer than the timeout: it is blamed.
  o.nodes[2].exit.reset();
  o.nodes[2].last_beat = o.now - 5s;
  const RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::MISSED_BEATS);
  CHECK(v.node == 2);
  CHECK(v.silent_s == doctest::Approx(5.0));
}

TEST_CASE("round_watch: a signal ends the round first, with no node to blame") {
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  o.interrupted = SIGHUP;
  o.nodes[1].exit = exited(3);
  o.nodes[1].exit_seen_at = o.now;
  const RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::INTERRUPTED);
  CHECK(v.signal == SIGHUP);
  CHECK_FALSE(v.node.has_value());
}

TEST_CASE("round_watch: a node's own failure is blamed before its peers' communication errors") {
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  const int comm = static_cast<int>(Exit::COMM);
  // Node 0 fails with a communication error first: the watch waits for the cause.
  o.nodes[0].exit = exited(comm);
  o.nodes[0].exit_seen_at = o.now;
  RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::WATCH);
  // ... even when the others look silent meanwhile: the failure is what matters.
  o.nodes[2].last_beat = o.now - 30s;
  CHECK(round_watch(o, limits()).kind == RoundVerdict::Kind::WATCH);
  // Node 2's rank was killed, 300 ms later: it is the culprit, with its code.
  o.now += 300ms;
  o.nodes[2].exit = killed(SIGKILL);
  o.nodes[2].exit_seen_at = o.now;
  v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::AGENT_EXIT);
  CHECK(v.node == 2);
  CHECK(v.exit_code == 128 + SIGKILL);
}

TEST_CASE("round_watch: only communication errors: the first seen, once the window closed") {
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  const int comm = static_cast<int>(Exit::COMM);
  o.nodes[1].exit = exited(comm);
  o.nodes[1].exit_seen_at = o.now;
  o.now += 200ms;
  o.nodes[0].exit = exited(comm);
  o.nodes[0].exit_seen_at = o.now;
  CHECK(round_watch(o, limits()).kind == RoundVerdict::Kind::WATCH);
  o.now = o.nodes[1].exit_seen_at + 1s;
  const RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::AGENT_EXIT);
  CHECK(v.node == 1);
  CHECK(v.exit_code == comm);
}

TEST_CASE("round_watch: an agent's unsuccessful end with code 0 or a lost connection is a launch failure") {
  ExitStatus lost = exited(255);
  lost.connection_lost = true;
  CHECK(agent_exit_code(lost) == static_cast<int>(Exit::LAUNCH));
  CHECK(agent_exit_code(killed(SIGTERM)) == 143);
  CHECK(agent_exit_code(exited(7)) == 7);
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  o.nodes[0].exit = lost;
  o.nodes[0].exit_seen_at = o.now;
  const RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::AGENT_EXIT);
  CHECK(v.exit_code == static_cast<int>(Exit::LAUNCH));
}

TEST_CASE("round_watch: an agent without a first beat is given first_beat_grace from the start") {
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  o.nodes[1].last_beat.reset();
  o.now = t0 + 9s;
  for (size_t k : {0u, 2u}) o.nodes[k].last_beat = o.now;
  CHECK(round_watch(o, limits()).kind == RoundVerdict::Kind::WATCH);
  o.now = t0 + 11s;
  for (size_t k : {0u, 2u}) o.nodes[k].last_beat = o.now;
  const RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::NO_FIRST_BEAT);
  CHECK(v.node == 1);
}

TEST_CASE("round_watch: a hung rank is acted on after the nodes' own heartbeats") {
  const auto t0 = Clock::now();
  RoundObservation o = running(t0);
  RankHang h;
  h.kind = RankHang::Kind::NO_STEP;
  h.rank = 3;
  h.node = 1;
  o.rank_hang = h;
  RoundVerdict v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::RANK_HUNG);
  CHECK(v.node == 1);
  REQUIRE(v.hang.has_value());
  CHECK(v.hang->rank == 3);
  // A silent node is the node check's to report, before any of its ranks.
  o.nodes[0].last_beat = o.now - 5s;
  v = round_watch(o, limits());
  CHECK(v.kind == RoundVerdict::Kind::MISSED_BEATS);
  CHECK(v.node == 0);
}

TEST_CASE("culprit_pick: own error first, else the first communication error after the window") {
  const auto t0 = Clock::now();
  const int comm = static_cast<int>(Exit::COMM);
  CHECK_FALSE(culprit_pick({}, t0).has_value());
  // Seen later but its own error: blamed at once.
  std::vector<FailureSeen> seen = {{0, comm, t0}, {1, 7, t0 + 100ms}, {2, 9, t0 + 200ms}};
  CHECK(culprit_pick(seen, t0 + 200ms) == 1u);
  // Ties in time go to the lowest who.
  seen = {{4, 3, t0}, {2, 6, t0}};
  CHECK(culprit_pick(seen, t0) == 1u);
  seen = {{0, comm, t0}, {1, comm, t0 + 10ms}};
  CHECK_FALSE(culprit_pick(seen, t0 + 999ms).has_value());
  CHECK(culprit_pick(seen, t0 + 1000ms) == 0u);
  CHECK(culprit_pick(seen, t0 + 50ms, 50ms) == 0u);
}
