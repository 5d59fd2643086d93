// The launcher's supervisor: runs the rendezvous store, starts one agent per node
// (locally or over SSH), streams their output to the terminal and per-rank log files,
// watches exit codes, the agents' and ranks' heartbeats and the ranks' training steps
// (rank_watch.h), and on the first failure anywhere stops every node and, while
// fault_tolerance.max_retries lasts, starts a new round.
#pragma once

#include "launch/host_probe.h"
#include "launch/job.h"
#include "launch/node_spawner.h"

#include <atomic>
#include <functional>
#include <memory>

namespace dtrain::launch {

/// What a preflight found: why (host and check named) the round must not start, and the
/// first node concerned; why "" = every node is fit.
struct PreflightVerdict {
  int node = -1;
  std::string why;
  bool permanent = false;  // retrying cannot help (host key, identity file, credentials)
};

struct SupervisorOptions {
  NodeSpawner spawner;  // required
  /// Set by the launcher's signal handler to the signal number (SIGINT, SIGTERM, SIGHUP):
  /// stop every node, record the interruption, return Exit::INTERRUPTED. 0 = keep going.
  std::atomic<int>* interrupted = nullptr;
  bool echo = true;      // print node output on the terminal
  bool tee_all = false;  // also every rank's stdout, not only rank 0's
  /// Called once per job, on the supervising thread, as soon as rank 0 reports that
  /// training started (its "resumed from step" / "train:" line, printed once every rank
  /// loaded the config and the checkpoint, or a progress record), or when a round succeeds.
  std::function<void()> on_started;
  /// Elastic jobs (elastic.min_nodes > 0): the probe a host must pass to run in a round
  /// and to rejoin. Empty = host_probe_version (SSH reachable, same dtrain version); the
  /// CLI sets lib/doctor's preflight probe when doctor.preflight is on.
  std::function<std::unique_ptr<HostProbe>(const Job&)> probe_factory;
  /// Run before every round when set (the CLI sets lib/doctor's quick preflight when
  /// doctor.preflight is on): a verdict with a reason fails the round before any node
  /// starts, as a launch failure that the retry loop counts like any other.
  std::function<PreflightVerdict(const Job&)> preflight;
  /// probe_factory's probe runs the preflight's checks (the CLI's doctor-backed probe):
  /// an elastic job then does not run `preflight` before a round. Every host was just
  /// probed with those checks, a member failing them is left out of the round (while
  /// elastic.min_nodes remain) instead of failing it, round after round, until
  /// max_retries. Non-elastic jobs run `preflight` as always.
  bool probe_is_preflight = false;
};

/// Runs the job to completion (all rounds). Returns the process exit code: 0, the
/// failing rank's code, Exit::LAUNCH for a lost node, Exit::HUNG for a rank that stopped
/// heartbeating or stepping, Exit::INTERRUPTED when interrupted by a signal.
int supervise(Job& job, const SupervisorOptions& opts);

}  // namespace dtrain::launch
