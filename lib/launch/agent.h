// The node agent (`dtrain agent`, internal): started on each node by the launcher, it
// spawns the node's rank processes with the torchrun environment contract, heartbeats to
// the rendezvous store, and stops every local rank (SIGTERM, grace, SIGKILL of each
// process group) when one fails, when the launcher says stop, or when the launcher or its
// SSH connection disappears (stdin EOF, store unreachable).
#pragma once

#include "launch/node_command.h"

#include <chrono>
#include <istream>

namespace dtrain::launch {

struct AgentTiming {
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds stop_grace{5000};  // SIGTERM -> SIGKILL per rank group
  std::chrono::milliseconds store_connect_timeout{30000};
};

/// Runs the agent until its ranks end. `token_in` yields the rendezvous token as its
/// first line and then stays open while the launcher lives (EOF = launcher gone).
/// Returns the exit code: 0 when every rank succeeded, the failing rank's code (128+N
/// for a signal N), Exit::STOPPED (143) when told to stop, Exit::COMM when the launcher vanished.
int agent_run(const AgentArgs& args, int token_fd, const AgentTiming& timing);

/// `dtrain agent ARGS...` (its one entry): ignores SIGPIPE, becomes the subreaper of its
/// ranks, parses ARGS (agent_args_parse) and runs the agent with the token on stdin and
/// the timing from the environment. Returns agent_run's exit code.
int agent_main(const std::vector<std::string>& argv);

/// AgentTiming from the environment the launcher sets (DTRAIN_HEARTBEAT_INTERVAL, seconds).
AgentTiming agent_timing_from_env();

/// The environment of local rank `local_rank` under `args`: RANK, LOCAL_RANK,
/// WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, NNODES, MASTER_ADDR, MASTER_PORT,
/// CUDA_VISIBLE_DEVICES, DTRAIN_JOB_ID, DTRAIN_ROUND, DTRAIN_RUN_DIR, DTRAIN_MODE,
/// DTRAIN_CONFIG, TORCHELASTIC_RESTART_COUNT, and OMP_NUM_THREADS / OPENBLAS_NUM_THREADS
/// (cores / local ranks) unless already set.
std::map<std::string, std::string> agent_rank_env(const AgentArgs& args, int local_rank);

/// Store keys (under the round's prefix) the agent and launcher share.
std::string agent_failure_key(int node_rank);    // "fail/node<k>": why a rank failed
inline constexpr const char* kStopKey = "stop";  // set by the launcher: stop this round

}  // namespace dtrain::launch
