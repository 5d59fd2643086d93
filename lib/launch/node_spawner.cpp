// The node spawners: cluster.ssh as libssh2 options and the default/Slurm ways of starting
// a node's agent (declared in node_spawner.h, which the supervisor, the Slurm launcher,
// the host probes and lib/doctor share).
#include "launch/node_spawner.h"

#include "core/env.h"
#include "launch/job.h"
#include "launch/local_spawner.h"
#include "launch/rank_watch.h"
#include "launch/slurm.h"
#include "launch/ssh_spawner.h"

#include <algorithm>
#include <utility>

namespace dtrain::launch {

namespace {

std::string expand_home(const std::string& p) {
  const char* home = env_get("HOME");
  return path_expand_home(p, home ? home : "");
}

}  // namespace

SshOptions ssh_options_from_config(const config::SshConfig& c) {
  SshOptions o;
  o.user = c.user;
  o.port = static_cast<int>(c.port);
  o.identity_file = expand_home(c.identity_file);
  o.known_hosts = expand_home(c.known_hosts);
  o.policy = c.host_key_policy == "off"          ? SshOptions::HostKeyPolicy::OFF
             : c.host_key_policy == "accept-new" ? SshOptions::HostKeyPolicy::ACCEPT_NEW
                                                 : SshOptions::HostKeyPolicy::STRICT;
  o.connect_timeout = seconds_ms(c.connect_timeout);
  if (c.keepalive_interval > 0) o.keepalive_interval_s = std::max(1, static_cast<int>(c.keepalive_interval));
  return o;
}

NodeSpawner node_spawner_default(const config::TrainConfig& cfg) {
  SshOptions base = ssh_options_from_config(cfg.cluster.ssh);
  return [base](const NodePlan& node, const NodeCommand& cmd, const std::string& stdin_data,
                LineCallback cb) -> std::unique_ptr<Process> {
    // This machine: no SSH, the agent is our child in its own process group.
    if (host_is_local(node.host.host))
      return spawn_local(cmd.argv, cmd.env, cmd.workdir, stdin_data, std::move(cb), true);
    SshOptions o = base;
    if (!node.host.user.empty()) o.user = node.host.user;
    if (node.host.port > 0) o.port = node.host.port;
    return spawn_ssh(node.host.host, o, cmd.shell_line(), stdin_data, std::move(cb));
  };
}

NodeSpawner node_spawner_for(const config::TrainConfig& cfg, const std::string& launcher) {
  return launcher == "slurm" ? node_spawner_slurm(slurm_allocation_from_env(environ_map())) : node_spawner_default(cfg);
}

}  // namespace dtrain::launch
