// RankWatch: which rank the launcher fails a round for, from snapshots of the store's
// heartbeat, progress and rank-info entries at chosen server times (no processes): missed
// beats, a rank that never beat, a rank without a step while it still beats, and the
// cases that must not count (exited ranks, finished step loops, silent nodes, done nodes).
#include "launch/rank_watch.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::launch;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Two nodes, n0 (ranks 0, 1) and n1 (ranks 2, 3).
Plan two_nodes() {
  Plan p;
  for (int k = 0; k < 2; ++k) {
    NodePlan n;
    n.node_rank = k;
    n.host.host = "n" + std::to_string(k);
    n.first_rank = 2 * k;
    for (int lr = 0; lr < 2; ++lr) n.ranks.push_back({2 * k + lr, lr, 2, k, lr});
    p.nodes.push_back(n);
  }
  p.world_size = 4;
  return p;
}

RankWatchLimits limits() {
  RankWatchLimits l;
  l.heartbeat_interval = 1s;
  l.heartbeat_timeout = 4s;
  l.step_timeout = 0s;
  l.first_beat_grace = 10s;
  return l;
}

struct Fixture {
  Plan plan = two_nodes();
  RankWatchSnapshot s;
  Clock::time_point t0 = Clock::now();
  std::vector<bool> done = {false, false};

  void beat(const std::string& name, Clock::duration at, const std::string& value = "1700000000000") {
    s.beats[name] = {value, t0 + at};
  }
  void step(int rank, const std::string& value, Clock::duration at) {
    s.progress["rank" + std::to_string(rank)] = {value, t0 + at};
  }
  // Every agent and rank beating at `at`, and every rank's pid known.
  void all_beat(Clock::duration at) {
    for (int k = 0; k < 2; ++k) beat("node" + std::to_string(k), at);
    for (int r = 0; r < 4; ++r) {
      beat("rank" + std::to_string(r), at);
      s.info["rank" + std::to_string(r)] = {std::to_string(1000 + r) + " host" + std::to_string(r / 2), t0};
    }
  }
};

}  // namespace

TEST_CASE("a rank whose own heartbeat stops while its agent beats is named with node, host, local rank and pid") {
  Fixture f;
  RankWatch w(f.plan, limits());
  f.all_beat(0s);
  CHECK(!w.check(f.s, f.t0 + 1s, f.done));

  // Rank 3 stops at 0 s; everyone else keeps beating.
  for (int r : {0, 1, 2}) f.beat("rank" + std::to_string(r), 4s);
  for (int k : {0, 1}) f.beat("node" + std::to_string(k), 4500ms);
  CHECK(!w.check(f.s, f.t0 + 4s, f.done));  // exactly at the limit: not yet
  auto h = w.check(f.s, f.t0 + 5s, f.done);
  REQUIRE(h);
  CHECK(h->kind == RankHang::Kind::MISSED_BEATS);
  CHECK(std::string(h->kind_name()) == "missed_heartbeats");
  CHECK(h->rank == 3);
  CHECK(h->local_rank == 1);
  CHECK(h->node == 1);
  CHECK(h->host == "n1");
  CHECK(h->pid == 1003);
  CHECK(h->hostname == "host1");
  CHECK(h->silent_s == doctest::Approx(5.0));
  const std::string why = h->describe(limits());
  INFO(why);
  CHECK(why.find("node 1 (n1): rank 3 (local rank 1, pid 1003 on host1) sent no heartbeat for 5.0 s") == 0);
  CHECK(why.find("fault_tolerance.heartbeat_timeout 4 s") != std::string::npos);
}

TEST_CASE("the most silent of several ranks is named; an exited rank and a finished node are not watched") {
  Fixture f;
  RankWatch w(f.plan, limits());
  f.all_beat(0s);
  f.beat("node0", 9s);
  f.beat("node1", 9s);
  f.beat("rank0", 9s);
  f.beat("rank1", 3s);                   // silent 7 s at t=10
  f.beat("rank2", 1s, kRankBeatExited);  // returned cleanly: silent by design
  f.beat("rank3", 2s);                   // silent 8 s at t=10
  auto h = w.check(f.s, f.t0 + 10s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 3);
  CHECK(h->silent_s == doctest::Approx(8.0));

  f.done = {false, true};  // node 1's agent succeeded: its ranks are over
  h = w.check(f.s, f.t0 + 10s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 1);
  CHECK(h->pid == 1001);
}

TEST_CASE("silent ranks of a silent node are the node check's to report") {
  Fixture f;
  RankWatch w(f.plan, limits());
  f.all_beat(0s);
  // Node 1's link is cut at 0 s: its agent and ranks go quiet together. Node 0 goes on.
  for (const char* n : {"node0", "rank0", "rank1"}) f.beat(n, 20s);
  CHECK(!w.check(f.s, f.t0 + 20s, f.done));
  // Its agent beating again (link back) while rank 2 stays silent: now it is rank 2's fault.
  f.beat("node1", 20s);
  f.beat("rank3", 20s);
  auto h = w.check(f.s, f.t0 + 20s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 2);
}

TEST_CASE("a rank that never beats is named once its agent has beaten for the first-beat grace") {
  Fixture f;
  RankWatch w(f.plan, limits());
  f.beat("node0", 0s);
  f.beat("rank0", 0s);
  CHECK(!w.check(f.s, f.t0 + 1s, f.done));  // first sight of node 0's agent: t0
  f.beat("node0", 10s);
  f.beat("rank0", 10s);
  CHECK(!w.check(f.s, f.t0 + 10s, f.done));  // within the grace; node 1 not up: not judged
  f.beat("node0", 11s);
  f.beat("rank0", 11s);
  auto h = w.check(f.s, f.t0 + 11s, f.done);
  REQUIRE(h);
  CHECK(h->kind == RankHang::Kind::NO_FIRST_BEAT);
  CHECK(h->rank == 1);
  CHECK(h->pid == -1);  // it never said who it is
  const std::string why = h->describe(limits());
  CHECK(why.find("node 0 (n0): rank 1 (local rank 1) sent no heartbeat within 11.0 s") == 0);
}

TEST_CASE("step timeout: armed by the first step report, reset by each new step, off after done or when 0") {
  Fixture f;
  RankWatchLimits l = limits();
  l.step_timeout = 5s;
  RankWatch w(f.plan, l);
  RankWatch off(f.plan, limits());
  auto beat_all = [&](Clock::duration at) {
    for (const char* n : {"node0", "node1", "rank0", "rank1", "rank2", "rank3"}) f.beat(n, at);
  };
  f.all_beat(0s);
  // Loading takes 30 s: no step reported yet, nothing is expected.
  beat_all(30s);
  CHECK(!w.check(f.s, f.t0 + 30s, f.done));
  for (int r = 0; r < 4; ++r) f.step(r, "0", 30s);
  beat_all(34s);
  CHECK(!w.check(f.s, f.t0 + 34s, f.done));
  // Ranks 0, 1, 3 step on; rank 2 completes step 1 and then nothing, while it still beats.
  for (int r : {0, 1, 3}) f.step(r, "7", 38s);
  f.step(2, "1", 31s);
  beat_all(38s);
  CHECK(!w.check(f.s, f.t0 + 36s, f.done));
  auto h = w.check(f.s, f.t0 + 38s, f.done);
  REQUIRE(h);
  CHECK(h->kind == RankHang::Kind::NO_STEP);
  CHECK(std::string(h->kind_name()) == "no_step");
  CHECK(h->rank == 2);
  CHECK(h->last_step == 1);
  CHECK(h->silent_s == doctest::Approx(7.0));
  CHECK(h->others.empty());
  const std::string why = h->describe(l);
  INFO(why);
  CHECK(why.find("node 1 (n1): rank 2 (local rank 0, pid 1002 on host1) made no step for 7.0 s "
                 "(fault_tolerance.step_timeout 5 s; last step 1) while its heartbeat goes on: stuck in its own "
                 "work, outside any collective") == 0);
  CHECK(!off.check(f.s, f.t0 + 38s, f.done));  // step_timeout 0: never

  // Its peers then wait in a collective: all stall at step 7; rank 2 (lowest step) is named.
  beat_all(60s);
  h = w.check(f.s, f.t0 + 60s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 2);
  CHECK(h->others == std::vector<int>{0, 1, 3});
  CHECK(h->describe(l).find("; also without a step: ranks 0, 1, 3") != std::string::npos);
  CHECK(h->others_waiting.empty());

  // A step loop that is over ("done") and a rank that exited are not expected to step.
  f.step(2, kRankStepsDone, 60s);
  f.step(0, kRankStepsDone, 60s);
  f.step(1, kRankStepsDone, 60s);
  beat_all(70s);
  f.beat("rank3", 59s, kRankBeatExited);
  CHECK(!w.check(f.s, f.t0 + 70s, f.done));
}

TEST_CASE("missed heartbeats win over step timeouts: the stopped rank, not the peers it stalls") {
  Fixture f;
  RankWatchLimits l = limits();
  l.step_timeout = 5s;
  RankWatch w(f.plan, l);
  f.all_beat(0s);
  for (int r = 0; r < 4; ++r) f.step(r, "3", 1s);
  // Rank 1 is stopped at 1 s; the others beat on but cannot step without it.
  for (const char* n : {"node0", "node1", "rank0", "rank2", "rank3"}) f.beat(n, 20s);
  auto h = w.check(f.s, f.t0 + 20s, f.done);
  REQUIRE(h);
  CHECK(h->kind == RankHang::Kind::MISSED_BEATS);
  CHECK(h->rank == 1);
}

TEST_CASE("step timeout: the rank busy outside collectives is named, the peers waiting for it are listed") {
  Fixture f;
  RankWatchLimits l = limits();
  l.step_timeout = 5s;
  RankWatch w(f.plan, l);
  f.all_beat(0s);
  CHECK(rank_progress_value(7, false) == "7");
  CHECK(rank_progress_value(7, true) == "7 waiting");
  // All completed step 7 at 1 s. Ranks 0, 1 and 3 then wait in a collective (the flag
  // flips while the step does not change: not progress); rank 2 never gets there.
  for (int r = 0; r < 4; ++r) f.step(r, rank_progress_value(7, false), 1s);
  CHECK(!w.check(f.s, f.t0 + 1s, f.done));
  for (int r : {0, 1, 3}) f.step(r, rank_progress_value(7, true), 1500ms);
  for (const char* n : {"node0", "node1", "rank0", "rank1", "rank2", "rank3"}) f.beat(n, 7s);
  auto h = w.check(f.s, f.t0 + 7s, f.done);
  REQUIRE(h);
  CHECK(h->kind == RankHang::Kind::NO_STEP);
  CHECK(h->rank == 2);
  CHECK(!h->waiting);
  CHECK(h->last_step == 7);
  CHECK(h->silent_s == doctest::Approx(6.0));  // since the step, not since the flag changed
  CHECK(h->others == std::vector<int>{0, 1, 3});
  CHECK(h->others_waiting == std::vector<int>{0, 1, 3});
  const std::string why = h->describe(l);
  INFO(why);
  CHECK(why.find("rank 2 (local rank 0, pid 1002 on host1) made no step for 6.0 s (fault_tolerance.step_timeout 5 s; "
                 "last step 7) while its heartbeat goes on: stuck in its own work, outside any collective; ranks 0, 1, "
                 "3 wait in a collective") != std::string::npos);

  // Everyone waiting (a collective that never returns anywhere): lowest step, then longest silence.
  RankWatch all(f.plan, l);
  for (int r = 0; r < 4; ++r) f.step(r, rank_progress_value(r == 1 ? 6 : 7, true), 1s);
  h = all.check(f.s, f.t0 + 7s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 1);
  CHECK(h->waiting);
  CHECK(h->describe(l).find("waiting in a collective that does not return; ranks 0, 2, 3 wait in a collective") !=
        std::string::npos);
}

TEST_CASE("step timeout: a rank whose step report arrived late is still named as the one the others wait for") {
  Fixture f;
  RankWatchLimits l = limits();
  l.step_timeout = 5s;
  RankWatch w(f.plan, l);
  f.all_beat(0s);
  // Ranks 0, 1, 3 reported step 7 at 1 s and wait in a collective; rank 2's report of step
  // 7 reached the store only at 3 s (a loaded host) and it never joins the collective.
  for (int r : {0, 1, 3}) f.step(r, rank_progress_value(7, true), 1s);
  f.step(2, rank_progress_value(7, false), 3s);
  for (const char* n : {"node0", "node1", "rank0", "rank1", "rank2", "rank3"}) f.beat(n, 7s);
  auto h = w.check(f.s, f.t0 + 7s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 2);  // 4 s without a step, under the limit, but the others wait for it
  CHECK(!h->waiting);
  CHECK(h->others_waiting == std::vector<int>{0, 1, 3});
  // A rank ahead of the stuck step (it got further) is not blamed.
  RankWatch ahead(f.plan, l);
  for (int r : {0, 1, 3}) f.step(r, rank_progress_value(7, true), 1s);
  f.step(2, rank_progress_value(8, false), 3s);
  h = ahead.check(f.s, f.t0 + 7s, f.done);
  REQUIRE(h);
  CHECK(h->rank != 2);
  CHECK(h->waiting);
}

TEST_CASE("step timeout: a peer whose 'waiting' report arrived late is still listed as waiting") {
  Fixture f;
  RankWatchLimits l = limits();
  l.step_timeout = 5s;
  RankWatch w(f.plan, l);
  f.all_beat(0s);
  // Rank 2 reported step 7 at 1 s and stays outside any collective; ranks 1 and 3 wait
  // in the next collective from 1 s, rank 0's report of it reached the store only at 3 s.
  f.step(2, rank_progress_value(7, false), 1s);
  for (int r : {1, 3}) f.step(r, rank_progress_value(7, true), 1s);
  f.step(0, rank_progress_value(7, true), 3s);
  for (const char* n : {"node0", "node1", "rank0", "rank1", "rank2", "rank3"}) f.beat(n, 7s);
  auto h = w.check(f.s, f.t0 + 7s, f.done);
  REQUIRE(h);
  CHECK(h->rank == 2);
  CHECK(!h->waiting);
  CHECK(h->others_waiting == std::vector<int>{0, 1, 3});
}
