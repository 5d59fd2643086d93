// `dtrain run`: one process of a job that torchrun, a Kubernetes operator, srun or mpirun
// started (the sequence around lib/rank/external.h and external_join.h), and its
// --nproc-per-node form, which stands for its node and spawns the local ranks.
#pragma once

#include "rank/process_exit.h"

#include <string>
#include <vector>

namespace dtrain::rank {

struct ExternalOptions {
  std::string config;             // --config FILE ("" = embedded default)
  std::vector<std::string> sets;  // --set key.path=value
  std::string output_dir;         // --output-dir DIR
  int nproc_per_node = 0;         // --nproc-per-node N: this process spawns N local ranks
};

/// Rank 0 hosts the rendezvous store at MASTER_ADDR:MASTER_PORT; every process joins it
/// (waiting for late pods), heartbeats, and trains as a launched rank does. A failing
/// rank reports why; rank 0 turns a failure or a silent rank into the stop key, and every
/// process that sees it (or loses the store) calls exit_now(Exit::COMM). Returns the exit
/// code; typed exceptions propagate.
int external_run(const ExternalOptions& o, const ProcessExit& exit_now);

}  // namespace dtrain::rank
