// The --dry-run report: placement table, then each node's sh line and environment.
// The env values are escaped so a value holding a newline cannot fake another line.
#include "launch/dry_run.h"

#include "core/c_escape.h"
#include "core/net_address.h"

#include <fmt/format.h>

namespace dtrain::launch {

std::string dry_run_report(const Plan& plan, const LaunchSpec& spec,
                           const std::map<std::string, std::string>& launcher_env, bool commands) {
  std::string out = fmt::format("dry run: job {} round {} mode {} ({} ranks on {} node{})\n", spec.job_id, spec.round,
                                spec.mode, plan.world_size, plan.nodes.size(), plan.nodes.size() == 1 ? "" : "s");
  out += plan_format_table(plan);
  if (!commands) return out;
  for (const NodePlan& node : plan.nodes) {
    NodeCommand cmd = node_command_build(plan, node.node_rank, spec, launcher_env);
    std::string where = node.host.destination();
    if (node.host.port)
      where = (node.host.user.empty() ? "" : node.host.user + "@") + host_port_text(node.host.host, node.host.port);
    out += fmt::format("\nnode {} ({}):\n", node.node_rank, where);
    out += "  command: " + cmd.shell_line() + "\n";
    out += "  env:\n";
    for (const auto& [k, v] : cmd.env) out += "    " + k + "=" + c_escape(v) + "\n";
    for (const auto& [k, v] : cmd.secret_env)
      out += fmt::format("    {}=<{} bytes of cluster.env.set, sent on the agent's stdin, not shown>\n", k, v.size());
  }
  return out;
}

}  // namespace dtrain::launch
