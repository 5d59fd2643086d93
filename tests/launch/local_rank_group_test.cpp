// LocalRankGroup: the ranks an agent (or `dtrain run --nproc-per-node`) starts on its
// machine succeed together, or the one to blame is named (its own error before its peers'
// communication errors, with its last error line) and the others are stopped; and the
// per-rank thread split.
#include "temp_dir.h"
#include "launch/local_rank_group.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::launch;
using namespace std::chrono_literals;

namespace {

LocalRankSpec sh(const std::string& script, int i) {
  LocalRankSpec r;
  r.argv = {"/bin/sh", "-c", script};
  r.prefix = "[test rank" + std::to_string(i) + "] ";
  return r;
}

// Polls until the group is no longer RUNNING or FAILING (30 s by the clock at most),
// keeping every state seen.
LocalRankGroupStatus settle(LocalRankGroup& g, std::vector<LocalRankGroupStatus::State>* seen = nullptr) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    LocalRankGroupStatus st = g.poll();
    if (seen && (seen->empty() || seen->back() != st.state)) seen->push_back(st.state);
    if (st.state == LocalRankGroupStatus::State::SUCCEEDED || st.state == LocalRankGroupStatus::State::FAILED ||
        std::chrono::steady_clock::now() > until)
      return st;
    std::this_thread::sleep_for(10ms);
  }
}

using dtrain::test::TempDir;

}  // namespace

TEST_CASE("LocalRankGroup: every rank succeeds") {
  std::vector<LocalRankSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(sh("echo hello from " + std::to_string(i), i));
  LocalRankGroup g(std::move(specs), 2000ms);
  CHECK(g.size() == 3);
  CHECK(settle(g).state == LocalRankGroupStatus::State::SUCCEEDED);
}

TEST_CASE("LocalRankGroup: a rank's own error is blamed before a peer's communication error; the rest stop") {
  TempDir d;
  const std::string flag = (d.path / "rank1_failing").string();
  const std::string comm = std::to_string(static_cast<int>(Exit::COMM));
  std::vector<LocalRankSpec> specs;
  // Rank 0 fails as a peer does once rank 1 is gone; rank 2 would run for a minute.
  specs.push_back(
      sh("i=0; while [ ! -e " + flag + " ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; exit " + comm, 0));
  specs.push_back(sh(
      "echo 'dtrain: error: cannot write checkpoint file x: No space left on device' >&2; touch " + flag + "; exit 3",
      1));
  specs.push_back(sh("sleep 60", 2));
  LocalRankGroup g(std::move(specs), 2000ms);
  const LocalRankGroupStatus st = settle(g);
  REQUIRE(st.state == LocalRankGroupStatus::State::FAILED);
  CHECK(st.local_rank == 1);
  CHECK(st.exit_code == 3);
  CHECK(st.said == "dtrain: error: cannot write checkpoint file x: No space left on device");
  g.stop();
  CHECK_FALSE(g.rank(2).running());
}

TEST_CASE("LocalRankGroup: only communication errors: FAILING first, then the first one is blamed") {
  const std::string comm = std::to_string(static_cast<int>(Exit::COMM));
  std::vector<LocalRankSpec> specs;
  specs.push_back(sh("exit " + comm, 0));
  specs.push_back(sh("sleep 60", 1));
  LocalRankGroup g(std::move(specs), 2000ms);
  std::vector<LocalRankGroupStatus::State> seen;
  const LocalRankGroupStatus st = settle(g, &seen);
  REQUIRE(st.state == LocalRankGroupStatus::State::FAILED);
  CHECK(st.local_rank == 0);
  CHECK(st.exit_code == static_cast<int>(Exit::COMM));
  // The poll that first saw it looked on for the cause instead of blaming it at once.
  REQUIRE(seen.size() >= 2);
  CHECK(seen[seen.size() - 2] == LocalRankGroupStatus::State::FAILING);
}

TEST_CASE("LocalRankGroup: a rank that cannot be started is a LaunchError") {
  std::vector<LocalRankSpec> specs;
  specs.push_back(sh("sleep 60", 0));
  LocalRankSpec bad;
  bad.argv = {"/nonexistent/dtrain-no-such-binary"};
  specs.push_back(bad);
  CHECK_THROWS_AS(LocalRankGroup(std::move(specs), 2000ms), LaunchError);
}

TEST_CASE("rank_thread_env: each rank's share of the cores, unless the user set it") {
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  ::unsetenv("OMP_NUM_THREADS");
  ::setenv("OPENBLAS_NUM_THREADS", "3", 1);
  const auto env = rank_thread_env(2);
  CHECK(env.at("OMP_NUM_THREADS") == std::to_string(std::max(1L, cores / 2)));
  CHECK(env.count("OPENBLAS_NUM_THREADS") == 0);
  CHECK(rank_thread_env(static_cast<int>(cores) * 4).at("OMP_NUM_THREADS") == "1");
  ::unsetenv("OPENBLAS_NUM_THREADS");
}
