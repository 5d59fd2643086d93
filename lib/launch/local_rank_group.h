// The ranks one process starts on its own machine (a node agent's, `dtrain run
// --nproc-per-node`'s): spawned together, their output forwarded with a prefix, watched
// together, and stopped together on the first failure (blamed by the culprit rule,
// culprit.h). Also how those ranks split the machine's cores.
#pragma once

#include "launch/local_spawner.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

/// One local rank to start.
struct LocalRankSpec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string stdin_data;
  std::string prefix;  // put before each line it prints ("[node0 rank1] ")
  EnvMode env_mode = EnvMode::INHERIT;
};

/// What the group's watch concludes.
struct LocalRankGroupStatus {
  enum class State {
    RUNNING,   // every rank runs or succeeded
    FAILING,   // ranks failed with communication errors: looking a little longer for the cause
    FAILED,    // `local_rank` is to blame
    SUCCEEDED  // every rank succeeded
  };
  State state = State::RUNNING;
  int local_rank = -1;  // FAILED
  ExitStatus exit;      // FAILED: how it ended
  int exit_code = 0;    // FAILED: its code, or 128 + its signal
  std::string said;     // FAILED: its last "dtrain: error: ..." line ("" = none)
};

class LocalRankGroup {
 public:
  /// Spawns every rank in its own process group (LaunchError when one cannot be started;
  /// the ones already started are stopped). Lines go to this process's stdout / stderr
  /// with the rank's prefix, one whole line at a time.
  explicit LocalRankGroup(std::vector<LocalRankSpec> ranks, std::chrono::milliseconds stop_grace);
  ~LocalRankGroup();
  LocalRankGroup(const LocalRankGroup&) = delete;
  LocalRankGroup& operator=(const LocalRankGroup&) = delete;

  /// Polls every rank once (never blocks).
  LocalRankGroupStatus poll();
  /// Stops the ranks still running, in parallel (SIGTERM, SIGKILL after stop_grace).
  void stop();
  size_t size() const { return procs_.size(); }
  LocalProcess& rank(size_t i) { return *procs_[i]; }

 private:
  std::chrono::milliseconds grace_;
  std::mutex out_mu_;
  std::vector<std::string> said_;  // by local rank, guarded by out_mu_
  std::vector<std::unique_ptr<LocalProcess>> procs_;
  std::vector<std::optional<ExitStatus>> ended_;
  std::vector<std::chrono::steady_clock::time_point> ended_at_;
};

/// OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for one of `local_ranks` ranks on this
/// machine: its share of the cores (at least 1), as torchrun does for OMP, for each of
/// the two that this process's environment does not set (the user's choice wins). BLAS
/// threads beyond the cores make every GEMM slower.
std::map<std::string, std::string> rank_thread_env(int local_ranks);

}  // namespace dtrain::launch
