// The launcher's resource view: tail, collect, judge network_idle.
#include "launch/resource_view.h"

#include "launch/local_spawner.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace dtrain::launch {

bool plan_spans_hosts(const Plan& plan) {
  std::set<std::string> hosts;
  for (const NodePlan& n : plan.nodes) hosts.insert(host_is_local(n.host.host) ? std::string() : n.host.host);
  return hosts.size() > 1;
}

namespace {

report::NetworkIdleLimits idle_limits(const config::MonitorConfig& cfg, const Plan& plan) {
  report::NetworkIdleLimits l;
  l.min_mbps = cfg.min_network;
  l.spans_hosts = plan_spans_hosts(plan);
  // A peer's sample counts while it is at most three intervals older than the node's.
  l.max_skew_ms = static_cast<int64_t>(std::max(1.0, 3 * cfg.interval) * 1000);
  return l;
}

}  // namespace

ResourceView::ResourceView(const std::string& run_dir, const config::MonitorConfig& cfg, const Plan& plan, int round)
    : enabled_(cfg.enabled), round_(round), every_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(std::max(1.0, cfg.interval)))),
      last_(std::chrono::steady_clock::now()), tail_(run_dir), idle_(idle_limits(cfg, plan)) {
  for (const NodePlan& n : plan.nodes) hosts_.push_back(n.host.destination());
}

bool ResourceView::read(Update& u) {
  std::vector<nlohmann::json> alerts;
  if (!tail_.poll(collector_, &alerts)) return false;
  for (const auto& a : alerts)
    if (auto ev = report::resource_alert_event(a)) u.copied.push_back(std::move(*ev));
  return true;
}

ResourceView::Update ResourceView::poll(std::chrono::steady_clock::time_point now) {
  Update u;
  if (!enabled_ || now - last_ < every_) return u;
  last_ = now;
  if (!read(u)) return u;
  const auto nodes = collector_.nodes();
  for (const auto& node : nodes) u.lines.push_back(report::resource_compact_line(node));
  for (const report::NetworkIdleAlert& a : idle_.update(nodes))
    // The host as the hostfile names it (the samples' gethostname can be one name for
    // several nodes: containers, network namespaces).
    u.raised.push_back(
        {.kind = report::EventKind::RESOURCE_ALERT,
         .round = round_,
         .time_ms = a.time_ms,
         .node = a.node,
         .host = a.node >= 0 && a.node < static_cast<int>(hosts_.size()) ? hosts_[static_cast<size_t>(a.node)] : a.host,
         .why = a.why,
         .detail = {{"alert", report::kNetworkIdleAlert}, {"rank", a.rank}}});
  return u;
}

std::vector<report::Event> ResourceView::drain() {
  Update u;
  // The tail reads at most 4 MiB per file and look: a bounded catch-up.
  for (int i = 0; enabled_ && i < 16 && read(u); ++i) {
  }
  return std::move(u.copied);
}

}  // namespace dtrain::launch
