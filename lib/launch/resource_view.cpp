// The launcher's resource view: tail, collect, judge network_idle.
#include "launch/resource_view.h"

#include "launch/local_spawner.h"

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
      last_(std::chrono::steady_clock::now()), tail_(run_dir), idle_(idle_limits(cfg, plan)) {}

ResourceView::Update ResourceView::poll(std::chrono::steady_clock::time_point now) {
  Update u;
  if (!enabled_ || now - last_ < every_) return u;
  last_ = now;
  if (!tail_.poll(collector_)) return u;
  const auto nodes = collector_.nodes();
  for (const auto& node : nodes) u.lines.push_back(report::resource_compact_line(node));
  for (const report::NetworkIdleAlert& a : idle_.update(nodes))
    u.alerts.push_back({.kind = report::EventKind::RESOURCE_ALERT,
                        .round = round_,
                        .time_ms = a.time_ms,
                        .node = a.node,
                        .host = a.host,
                        .why = a.why,
                        .detail = {{"alert", report::kNetworkIdleAlert}, {"rank", a.rank}}});
  return u;
}

}  // namespace dtrain::launch
