// One round of a launched job, typed: how it ended (RoundResult: one RoundEnd and, when
// it did not succeed, one NodeFailure), and its watch step, a pure function of what the
// supervisor observed (agents' exits, heartbeats, the ranks' watch, a signal), like torch
// elastic's _monitor_workers, so every way a round ends can be tested without processes.
// The supervisor (supervisor.cpp) starts the agents, observes, asks round_watch, stops.
#pragma once

#include "launch/culprit.h"
#include "launch/rank_watch.h"
#include "launch/spawner.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

/// How a round ended.
enum class RoundEnd {
  SUCCEEDED,    // every node's agent succeeded: the job is done
  FAILED,       // a node failed, or no node could start (the NodeFailure says which and how)
  INTERRUPTED,  // the launcher got SIGINT/SIGTERM/SIGHUP
  RESIZED       // an elastic job stopped itself at a checkpoint to take a host back
};

/// Why a round did not succeed.
struct NodeFailure {
  enum class Kind {
    SPAWN,       // a node's agent could not be started
    AGENT_EXIT,  // a node's agent ended unsuccessfully
    HEARTBEAT,   // a node's agent sent no heartbeat in time, or stopped sending them
    RANK_HUNG,   // a rank stopped heartbeating or stepping
    INTERRUPT,   // a signal stopped the launcher (no node to blame)
    NOT_STARTED  // no node ran: too few hosts for elastic.min_nodes, or the preflight refused
  };
  Kind kind = Kind::AGENT_EXIT;
  std::optional<int> node = std::nullopt;  // the node blamed; none when no node is (INTERRUPT, too few hosts)
  std::string why = {};
  int exit_code = 0;
  bool permanent = false;                       // retrying cannot help (host key / authentication refused, usage error)
  std::optional<RankHang> hang = std::nullopt;  // RANK_HUNG: which rank, how long silent
};

struct RoundResult {
  RoundEnd end = RoundEnd::SUCCEEDED;
  std::optional<NodeFailure> failure = std::nullopt;  // FAILED and INTERRUPTED
  int64_t resized_at_step = -1;                       // RESIZED: the checkpoint step the ranks stopped at
  std::string resized_for = {};                       // RESIZED: the host that passed the probe again ("" = not known)
};

// ----------------------------------------------------------------------------
// The watch step

using RoundClock = std::chrono::steady_clock;

/// One node as the supervisor last saw it.
struct NodeObservation {
  std::optional<ExitStatus> exit;                   // its agent ended (nullopt: runs)
  RoundClock::time_point exit_seen_at{};            // when that was first seen
  std::optional<RoundClock::time_point> last_beat;  // its agent's last heartbeat (server clock)
};

struct RoundObservation {
  RoundClock::time_point now{}, started{};
  int interrupted = 0;                 // the signal the launcher got, 0 = none
  std::vector<NodeObservation> nodes;  // by node rank
  std::optional<RankHang> rank_hang;   // RankWatch's verdict on the ranks' beats and steps
};

struct RoundWatchLimits {
  std::chrono::milliseconds first_beat_grace{25000};  // from the round's start to an agent's first beat
  std::chrono::milliseconds heartbeat_timeout{15000};
  std::chrono::milliseconds culprit_window = kCulpritWindow;
};

/// What the round's watch concludes.
struct RoundVerdict {
  enum class Kind { WATCH, SUCCEEDED, INTERRUPTED, AGENT_EXIT, NO_FIRST_BEAT, MISSED_BEATS, RANK_HUNG };
  Kind kind = Kind::WATCH;
  std::optional<int> node;       // AGENT_EXIT, NO_FIRST_BEAT, MISSED_BEATS, RANK_HUNG
  ExitStatus exit{};             // AGENT_EXIT
  int exit_code = 0;             // AGENT_EXIT: agent_exit_code(exit)
  double silent_s = 0.0;         // MISSED_BEATS: since its last beat
  int signal = 0;                // INTERRUPTED
  std::optional<RankHang> hang;  // RANK_HUNG
};

/// The exit code an agent's end stands for: its own code, 128 + a signal, Exit::LAUNCH
/// for a lost SSH connection or an unsuccessful end with code 0.
int agent_exit_code(const ExitStatus& st);

/// The round's verdict at obs.now, in this order: a signal; a failed agent (the culprit
/// rule across the nodes' exit codes: WATCH while it waits for a failure that is not a
/// consequence of another); every agent succeeded; an agent without a first heartbeat
/// within first_beat_grace of the start, or silent for heartbeat_timeout (lowest node
/// first); a hung rank. WATCH: nothing to act on.
RoundVerdict round_watch(const RoundObservation& obs, const RoundWatchLimits& limits);

}  // namespace dtrain::launch
