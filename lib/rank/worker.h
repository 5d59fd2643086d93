// `dtrain worker`: one rank process started by the node agent. Reads its identity from
// the environment and the token from stdin, joins the round's store, heartbeats, and runs
// the job's mode: the collective sweep (bench) or training (train_rank).
#pragma once

#include "bench/bench.h"
#include "rank/process_exit.h"

#include <functional>
#include <string>

namespace dtrain::rank {

/// The bench mode's options as the launcher forwarded them (parsed by apps/).
struct WorkerBench {
  bench::BenchOptions opts;
  std::string backend;      // "" = nccl where GPUs are visible, else gloo
  std::string json;         // --json FILE (written by rank 0)
  bool json_force = false;  // --force: an existing --json FILE that is not a bench report may be replaced
};

struct WorkerOptions {
  /// Called in bench mode only, once the rank has joined (UsageError on bad arguments).
  std::function<WorkerBench()> bench;
  /// Ends the process when the agent goes away (its stdin reaches EOF).
  ProcessExit exit_now;
};

/// The worker's whole life; returns its exit code (typed exceptions propagate).
int worker_run(const WorkerOptions& o);

}  // namespace dtrain::rank
