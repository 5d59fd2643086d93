// The launcher's watch over rank processes: each rank heartbeats from a thread of its own
// process (a stopped or frozen one goes silent, which an agent watching the pid cannot
// see) and reports its training steps; RankWatch checks both on the server's clock and
// names the rank that stopped.
#pragma once

#include "launch/placement.h"
#include "rendezvous/store.h"

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

/// A config's seconds (fault_tolerance.*, connect timeouts) as a duration.
inline std::chrono::milliseconds seconds_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// ---- the keys a rank publishes under its round's prefix

/// "rank<R>": the Heartbeat name, so "hb/rank<R>" beats and "progress/rank<R>" holds
/// rank_progress_value(): the last completed training step ("0" or the resumed step on
/// entering the loop), and whether the rank waits in a collective now.
std::string rank_beat_name(int rank);
/// "7", or "7 waiting" while the rank is inside a collective.
std::string rank_progress_value(int64_t step, bool in_collective);
/// "rankinfo/rank<R>": "<pid> <hostname>" of the rank process.
std::string rank_info_key(int rank);
/// The heartbeat's last value when the rank returned: it is silent from then on by design.
inline constexpr const char* kRankBeatExited = "exited";
/// The progress value once the step loop is over (no more steps to expect).
inline constexpr const char* kRankStepsDone = "done";

// ---- the check

struct RankWatchLimits {
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds heartbeat_timeout{15000};
  std::chrono::milliseconds step_timeout{0};          // 0 = off
  std::chrono::milliseconds first_beat_grace{25000};  // from the first beat of its agent
};

/// A rank that stopped proving progress, and how long it has been silent.
struct RankHang {
  enum class Kind { NO_FIRST_BEAT, MISSED_BEATS, NO_STEP };
  Kind kind = Kind::MISSED_BEATS;
  int rank = 0, local_rank = 0, node = 0;
  std::string host;                 // the node's hostfile destination
  int pid = -1;                     // as the rank reported it (-1: not known)
  std::string hostname;             // the rank's own gethostname ("" = not known)
  double silent_s = 0.0;            // since its last beat / step (NO_FIRST_BEAT: since its agent beat)
  int64_t last_step = -1;           // NO_STEP: the last step it completed
  bool waiting = false;             // NO_STEP: it waits in a collective (for a peer)
  std::vector<int> others;          // NO_STEP: other ranks past the step timeout too...
  std::vector<int> others_waiting;  // ...and those of them waiting in a collective

  /// "missed_heartbeats", "no_heartbeat" or "no_step" (events.jsonl).
  const char* kind_name() const;
  /// One line naming node, host, rank, local rank, pid, the silence and the limit.
  std::string describe(const RankWatchLimits& limits) const;
};

/// The server's entries under a round prefix that RankWatch reads.
struct RankWatchSnapshot {
  std::map<std::string, rendezvous::StoreServer::Stamped> beats;     // "hb/": node<k>, rank<R>
  std::map<std::string, rendezvous::StoreServer::Stamped> progress;  // "progress/": rank<R>
  std::map<std::string, rendezvous::StoreServer::Stamped> info;      // "rankinfo/": rank<R>
};
RankWatchSnapshot rank_watch_snapshot(const rendezvous::StoreServer& server, const std::string& prefix);

/// One round's watch. A rank is judged only while its node's agent beats (within two
/// intervals): a silent node is the node check's to report, not a hung rank.
class RankWatch {
 public:
  RankWatch(const Plan& plan, RankWatchLimits limits);

  /// The rank to fail the round for at `now` (server clock), if any; node_done[k] = node
  /// k's agent ended successfully. Missed heartbeats come before step timeouts (a stopped
  /// rank also stalls the steps of every peer waiting for it); among ranks without a
  /// step, one busy outside collectives comes first (its peers wait for it), then the
  /// lowest step, then the longest silence.
  std::optional<RankHang> check(const RankWatchSnapshot& s, std::chrono::steady_clock::time_point now,
                                const std::vector<bool>& node_done);

  const RankWatchLimits& limits() const { return limits_; }

 private:
  struct Progress {
    std::string step;  // the value without " waiting": a change of it is progress
    bool waiting = false;
    std::chrono::steady_clock::time_point since;
  };
  void fill_identity(const RankWatchSnapshot& s, RankHang& h) const;
  // The nodes whose agent beats recently: only their ranks can be judged.
  std::vector<char> judged_nodes(const RankWatchSnapshot& s, std::chrono::steady_clock::time_point now,
                                 const std::vector<bool>& node_done);
  // The longest heartbeat silence past its limit among the judged nodes' ranks.
  std::optional<RankHang> beat_hang(const RankWatchSnapshot& s, std::chrono::steady_clock::time_point now,
                                    const std::vector<char>& judged) const;
  // Tracks every rank's progress value; the rank to blame for steps past step_timeout.
  std::optional<RankHang> step_hang(const RankWatchSnapshot& s, std::chrono::steady_clock::time_point now,
                                    const std::vector<bool>& node_done, const std::vector<char>& judged);

  const Plan& plan_;
  RankWatchLimits limits_;
  std::vector<std::optional<std::chrono::steady_clock::time_point>> agent_seen_;  // per node
  std::map<int, Progress> progress_;                                              // per rank
};

}  // namespace dtrain::launch
