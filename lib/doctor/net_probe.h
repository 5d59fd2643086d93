// The network half of `dtrain doctor`, run by every node's doctor-node: a collective
// connectivity check over the real Gloo communicator (barrier, allreduce with a known
// sum) and a pairwise bandwidth table, one link at a time, each direction for a bounded
// time, through a 2-rank communicator per pair (a broadcast from either end).
#pragma once

#include "doctor/analysis.h"
#include "rendezvous/store.h"

#include <chrono>
#include <string>
#include <vector>

namespace dtrain::doctor {

struct NetProbeOptions {
  std::string interface;                     ///< Gloo interface; "" = by address
  std::string address;                       ///< Gloo bind address ("" with "" interface = the host name)
  double link_seconds = 0.5;                 ///< traffic per direction per link (after one warm-up message)
  std::chrono::milliseconds timeout{30000};  ///< bound on every mesh connect and collective
  size_t message_bytes = 1 << 20;            ///< size of one timed broadcast
};

struct NetProbeResult {
  bool allreduce_ok = false;
  /// Links this rank measured as the sending end, in rank indices: ab filled when this
  /// rank is a, ba when it is b (merge the world's results with link_merge).
  std::vector<LinkSample> links;
};

/// Every rank of `world` calls it with the same store prefix. Throws CommError when a
/// peer cannot be reached or a collective fails (the message names the peer rank).
NetProbeResult net_probe_run(rendezvous::StoreClient& client, const std::string& prefix, int rank, int world,
                             const NetProbeOptions& opts);

/// Merges partial samples (the same link from both ends) into one row per link, by (a, b).
std::vector<LinkSample> link_merge(const std::vector<LinkSample>& parts);

}  // namespace dtrain::doctor
