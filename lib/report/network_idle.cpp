// network_idle: each node judged on its new samples against every rank's collective share.
#include "report/network_idle.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace dtrain::report {

NetworkIdleWatch::NetworkIdleWatch(NetworkIdleLimits limits) : limits_(limits) {}

namespace {

// The node's newest sample time over its ranks.
int64_t newest_ms(const NodeResources& n) {
  int64_t t = n.time_ms;
  for (const RankResources& r : n.ranks) t = std::max(t, r.time_ms);
  return t;
}

}  // namespace

std::vector<NetworkIdleAlert> NetworkIdleWatch::update(const std::vector<NodeResources>& nodes) {
  std::vector<NetworkIdleAlert> out;
  if (limits_.min_mbps <= 0 || !limits_.spans_hosts || nodes.size() < 2) return out;
  for (const NodeResources& n : nodes) {
    NodeState& st = state_[n.node];
    const int64_t t = newest_ms(n);
    if (t <= st.judged_ms) continue;  // nothing new of this node
    st.judged_ms = t;
    if (!n.net_rx_mbps || !n.net_tx_mbps) continue;
    const double mbps = *n.net_rx_mbps + *n.net_tx_mbps;
    // Every rank's share in collectives, this node's included; a missing or stale one
    // leaves the judgement undecided.
    std::optional<double> least;
    bool known = true;
    for (const NodeResources& m : nodes)
      for (const RankResources& r : m.ranks) {
        if (!r.in_collective_frac || t - r.time_ms > limits_.max_skew_ms) known = false;
        else least = least ? std::min(*least, *r.in_collective_frac) : *r.in_collective_frac;
      }
    if (!known || !least) continue;
    const bool idle = mbps < limits_.min_mbps && *least >= limits_.collective_frac;
    if (!idle) {
      st.run = 0;
      st.active = false;
      continue;
    }
    if (++st.run < limits_.samples || st.active) continue;
    st.active = true;
    NetworkIdleAlert a;
    a.node = n.node;
    a.rank = n.ranks.empty() ? -1 : n.ranks.front().rank;
    a.host = n.host;
    a.time_ms = t;
    a.why = fmt::format(
        "node{} moved {:.3f} MB/s over its network (under monitor.min_network = {:.3f} MB/s) for {} samples in a row "
        "while every rank spent at least {:.0f} % of its interval in a collective: a link to or from this node may be "
        "stalled or throttled",
        n.node, mbps, limits_.min_mbps, st.run, 100 * *least);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace dtrain::report
