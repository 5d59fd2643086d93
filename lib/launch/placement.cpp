// Rank placement from a (selected) hostfile, and its table for logs and --dry-run.
// The local rank indexes the node's device list, never the raw slot id, so a node
// running slots 1,3 gets CUDA_VISIBLE_DEVICES=1,3 and local ranks 0,1.
#include "launch/placement.h"

#include "core/check.h"
#include "core/net_address.h"

#include <algorithm>

namespace dtrain::launch {

Plan plan_placement(const config::Hostfile& hf, const std::string& master_addr, int master_port) {
  DT_ENFORCE(!hf.hosts.empty(), ConfigError, "hostfile {} selects no host to place ranks on",
             hf.path.empty() ? "<none>" : hf.path);
  DT_ENFORCE(!master_addr.empty(), ConfigError,
             "no master address to plan with; set cluster.master_addr or --master-addr");
  if (master_port < 1 || master_port > 65535) DT_THROW(ConfigError, "master port {} is outside 1..65535", master_port);

  Plan plan;
  plan.master_addr = master_addr;
  plan.master_port = master_port;
  int next_rank = 0;
  for (size_t n = 0; n < hf.hosts.size(); ++n) {
    const config::HostEntry& h = hf.hosts[n];
    DT_ENFORCE(!h.slot_ids.empty(), ConfigError,
               "host {} has no selected slot; drop it from the hostfile or the selection", h.host);
    NodePlan node;
    node.node_rank = static_cast<int>(n);
    node.host = h;
    node.first_rank = next_rank;
    int local_world = static_cast<int>(h.slot_ids.size());
    for (int local = 0; local < local_world; ++local) {
      int device = h.slot_ids[static_cast<size_t>(local)];
      node.ranks.push_back({next_rank++, local, local_world, node.node_rank, device});
      node.cuda_visible_devices += (local ? "," : "") + std::to_string(device);
    }
    plan.nodes.push_back(std::move(node));
  }
  plan.world_size = next_rank;
  return plan;
}

std::string plan_format_table(const Plan& plan) {
  std::vector<std::string> hosts, ranks;
  size_t host_w = 4, ranks_w = 5;
  for (const NodePlan& n : plan.nodes) {
    std::string h = n.host.destination();
    if (n.host.port) h = (n.host.user.empty() ? "" : n.host.user + "@") + host_port_text(n.host.host, n.host.port);
    int last = n.first_rank + static_cast<int>(n.ranks.size()) - 1;
    std::string r = n.ranks.size() == 1 ? std::to_string(n.first_rank) : fmt::format("{}-{}", n.first_rank, last);
    host_w = std::max(host_w, h.size());
    ranks_w = std::max(ranks_w, r.size());
    hosts.push_back(std::move(h));
    ranks.push_back(std::move(r));
  }
  std::string out =
      fmt::format("{:<5} {:<{}} {:<{}} {:<5} {}\n", "node", "host", host_w, "ranks", ranks_w, "local", "devices");
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const NodePlan& n = plan.nodes[i];
    out += fmt::format("{:<5} {:<{}} {:<{}} {:<5} {}\n", n.node_rank, hosts[i], host_w, ranks[i], ranks_w,
                       n.ranks.size(), n.cuda_visible_devices);
  }
  out += fmt::format("world size {}, {} node{}, master {}\n", plan.world_size, plan.nodes.size(),
                     plan.nodes.size() == 1 ? "" : "s", host_port_text(plan.master_addr, plan.master_port));
  return out;
}

}  // namespace dtrain::launch
