// Elastic node membership (torchrun's --nnodes MIN:MAX): which hosts of the hostfile run
// the next round. A host is left out when it fails the probe before a round or fails
// max_node_failures rounds in a row, as long as min_nodes remain; a host left out rejoins
// at a round boundary once it passes the probe again. Pure bookkeeping: the supervisor
// probes, runs rounds and records the changes this returns.
#pragma once

#include "config/hostfile.h"
#include "launch/host_probe.h"

#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

/// Round-scoped store keys: the launcher sets kElasticGrowKey to ask the ranks to stop at
/// their next checkpoint (a host is back); rank 0 sets kElasticStoppedKey to the step it
/// stopped at.
inline constexpr const char* kElasticGrowKey = "elastic/grow";
inline constexpr const char* kElasticStoppedKey = "elastic/stopped";

struct MembershipChange {
  int host = 0;         ///< index into the hostfile's hosts
  std::string name;     ///< the host's destination ("root@10.0.0.3")
  bool joined = false;  ///< true: joins the next round; false: left out of it
  std::string cause;
};

/// The next round's members, or why there cannot be one.
struct RoundMembers {
  std::vector<int> hosts;                 ///< hostfile indices, in hostfile order
  std::vector<MembershipChange> changes;  ///< against the previous round (first round: against the hostfile)
  std::string problem;                    ///< not "": fewer than min_nodes hosts can run (names them and why)
};

class Membership {
 public:
  /// min_nodes 0 = not elastic (every host, every round, no probing); max_nodes 0 = every host.
  Membership(const config::Hostfile& hosts, int min_nodes, int max_nodes, int max_failures);

  bool elastic() const { return min_ > 0; }
  int min_nodes() const { return min_; }
  int max_nodes() const { return max_; }
  const config::Hostfile& hostfile() const { return hf_; }
  /// A hostfile of the given host indices (for placement).
  config::Hostfile hostfile_of(const std::vector<int>& hosts) const;

  /// Decides the next round from a probe of every host (probes.size() == hosts). A
  /// current member that fails the probe is left out; a host left out that passes joins
  /// while there is room below max_nodes, except one left out for failing rounds at the
  /// boundary right after (it sits out at least one round, so a host that passes probes
  /// but fails rounds does not go in and out at every boundary).
  RoundMembers plan_round(const std::vector<ProbeResult>& probes);

  /// The round ran on `members()` and failed, blamed on hostfile host `host` (-1: no one
  /// host). Its consecutive-failure count grows; at max_node_failures it is left out of
  /// the next round (plan_round reports the change).
  void round_failed(int host, const std::string& why);
  /// The round ran healthy steps (succeeded, or was stopped to regrow): members' failure
  /// counts start over.
  void round_healthy();

  /// Current members (after the last plan_round).
  const std::vector<int>& members() const { return members_; }
  /// Hosts left out that may rejoin (to probe while a round runs): there is room below
  /// max_nodes and they are not sitting out a round.
  std::vector<int> rejoin_candidates() const;

 private:
  struct Host {
    bool in = false;
    int failures = 0;
    bool sit_out = false;     // left out for failures at this boundary: not back before the next
    std::string failure_why;  // the last failure blamed on it
    std::string out_cause;
  };
  config::Hostfile hf_;
  int min_, max_, max_failures_;
  std::vector<Host> state_;
  std::vector<int> members_;
  bool planned_ = false;
};

}  // namespace dtrain::launch
