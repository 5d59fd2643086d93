// The cross-rank resource alert "network_idle": a node whose network throughput stays
// near zero while every rank of the job waits in a collective. Only the launcher sees
// every rank's samples (it tails their files), so it decides this one, once per episode.
#pragma once

#include "report/resource_status.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::report {

/// The alert's name in events.jsonl ("alert") beside the ranks' low_memory, gpu_memory
/// and gpu_throttle.
inline constexpr const char* kNetworkIdleAlert = "network_idle";

struct NetworkIdleLimits {
  /// A node moving fewer MB/s than this (received + sent over its interfaces other than
  /// loopback) is idle (monitor.min_network; 0 = the alert is off).
  double min_mbps = 0.05;
  /// Ranks count as waiting in a collective when they spent at least this share of their
  /// last sample interval inside one.
  double collective_frac = 0.5;
  /// Consecutive new samples of the node that must show the condition.
  int samples = 2;
  /// A peer's sample older than this against the node's is no evidence (a rank that
  /// stopped sampling).
  int64_t max_skew_ms = 30000;
  /// The job's nodes are on different hosts. Nodes of one host talk over loopback (not
  /// counted: it is the host talking to itself) or shared memory, so their network
  /// figures say nothing about the collective: the alert is off.
  bool spans_hosts = true;
};

struct NetworkIdleAlert {
  int node = 0, rank = 0;  // rank: the node's lowest
  std::string host;
  int64_t time_ms = 0;  // the sample that completed the episode's start
  std::string why;
};

/// One job's episodes. update() takes each node's latest samples (ResourceCollector::
/// nodes()) as often as the caller looks; a node's condition is judged once per new
/// sample of it: idle (under min_mbps) while every rank of the job, its own included,
/// spent at least collective_frac of its interval in a collective. A node's own ranks
/// must be waiting too: a node late with its compute (a straggler, reported as one) sends
/// nothing while its peers wait, and that is not the network. `samples` judgements in a
/// row raise one alert; the next judgement that the condition does not hold ends the
/// episode. A judgement that lacks a figure (a one-rank job has no in_collective_frac; a
/// first sample has no rates) neither starts nor ends one.
class NetworkIdleWatch {
 public:
  explicit NetworkIdleWatch(NetworkIdleLimits limits);
  std::vector<NetworkIdleAlert> update(const std::vector<NodeResources>& nodes);

 private:
  struct NodeState {
    int64_t judged_ms = -1;  // time of the newest sample judged
    int run = 0;             // judgements in a row that held
    bool active = false;     // alert raised, episode not over
  };
  NetworkIdleLimits limits_;
  std::map<int, NodeState> state_;
};

}  // namespace dtrain::report
