// Membership bookkeeping for elastic jobs: probe results and blamed failures in, the next
// round's hosts and the changes (with causes) out.
#include "launch/membership.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::launch {

Membership::Membership(const config::Hostfile& hosts, int min_nodes, int max_nodes, int max_failures)
    : hf_(hosts), min_(std::max(0, min_nodes)), max_(max_nodes), max_failures_(std::max(1, max_failures)),
      state_(hosts.hosts.size()) {
  const int n = static_cast<int>(hosts.hosts.size());
  if (max_ <= 0 || max_ > n) max_ = n;
  if (min_ > max_) min_ = max_;
}

config::Hostfile Membership::hostfile_of(const std::vector<int>& hosts) const {
  config::Hostfile out;
  out.path = hf_.path;
  for (int i : hosts) out.hosts.push_back(hf_.hosts[static_cast<size_t>(i)]);
  return out;
}

RoundMembers Membership::plan_round(const std::vector<ProbeResult>& probes) {
  RoundMembers r;
  const int n = static_cast<int>(state_.size());
  auto name = [&](int i) { return hf_.hosts[static_cast<size_t>(i)].destination(); };
  if (!elastic()) {
    for (int i = 0; i < n; ++i) r.hosts.push_back(i);
    members_ = r.hosts;
    planned_ = true;
    return r;
  }
  // A host that sat out the round that just ended may come back now.
  for (Host& h : state_) h.sit_out = false;
  // Members that failed rounds too often, then members that fail the probe, go out.
  for (int i = 0; i < n; ++i) {
    Host& h = state_[static_cast<size_t>(i)];
    if (!h.in) continue;
    if (h.failures >= max_failures_) {
      h.in = false;
      h.sit_out = true;
      h.out_cause = fmt::format("failed {} round(s) in a row (elastic.max_node_failures = {}); last: {}", h.failures,
                                max_failures_, h.failure_why);
      h.failures = 0;
      r.changes.push_back({i, name(i), false, h.out_cause});
    } else if (i < static_cast<int>(probes.size()) && !probes[static_cast<size_t>(i)].ok) {
      h.in = false;
      h.out_cause = "failed the probe: " + probes[static_cast<size_t>(i)].why;
      h.failures = 0;
      r.changes.push_back({i, name(i), false, h.out_cause});
    }
  }
  // Hosts out (or never in) that pass the probe join while there is room.
  int count = 0;
  for (const Host& h : state_) count += h.in ? 1 : 0;
  for (int i = 0; i < n && count < max_; ++i) {
    Host& h = state_[static_cast<size_t>(i)];
    if (h.in || h.sit_out) continue;
    if (i >= static_cast<int>(probes.size()) || !probes[static_cast<size_t>(i)].ok) continue;
    h.in = true;
    h.failures = 0;
    ++count;
    const std::string cause = !planned_             ? std::string("initial membership")
                              : h.out_cause.empty() ? std::string("a standby host passed the probe")
                                                    : "passed the probe again (was left out: " + h.out_cause + ")";
    h.out_cause.clear();
    r.changes.push_back({i, name(i), true, cause});
  }
  // Hosts that never got in on the first round: say why (probe failures; standbys are silent).
  if (!planned_)
    for (int i = 0; i < n; ++i) {
      Host& h = state_[static_cast<size_t>(i)];
      if (h.in || i >= static_cast<int>(probes.size()) || probes[static_cast<size_t>(i)].ok) continue;
      h.out_cause = "failed the probe: " + probes[static_cast<size_t>(i)].why;
      r.changes.push_back({i, name(i), false, h.out_cause});
    }
  planned_ = true;
  members_.clear();
  for (int i = 0; i < n; ++i)
    if (state_[static_cast<size_t>(i)].in) members_.push_back(i);
  r.hosts = members_;
  if (static_cast<int>(members_.size()) < min_) {
    std::string out;
    for (int i = 0; i < n; ++i) {
      const Host& h = state_[static_cast<size_t>(i)];
      if (h.in) continue;
      out += fmt::format("; {}: {}", name(i), h.out_cause.empty() ? "not probed yet" : h.out_cause);
    }
    r.problem = fmt::format("only {} of the {} host(s) can run a round, fewer than elastic.min_nodes = {}{}",
                            members_.size(), n, min_, out);
  }
  return r;
}

void Membership::round_failed(int host, const std::string& why) {
  if (host < 0 || host >= static_cast<int>(state_.size())) return;
  Host& h = state_[static_cast<size_t>(host)];
  if (!h.in) return;
  ++h.failures;
  h.failure_why = why;
}

void Membership::round_healthy() {
  for (int i : members_) state_[static_cast<size_t>(i)].failures = 0;
}

std::vector<int> Membership::rejoin_candidates() const {
  std::vector<int> out;
  if (!elastic() || static_cast<int>(members_.size()) >= max_) return out;
  for (int i = 0; i < static_cast<int>(state_.size()); ++i) {
    const Host& h = state_[static_cast<size_t>(i)];
    if (!h.in && !h.sit_out) out.push_back(i);
  }
  return out;
}

}  // namespace dtrain::launch
