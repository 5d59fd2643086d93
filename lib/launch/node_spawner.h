// The node spawner: how the launcher starts one node's agent (locally, over SSH, or as
// a Slurm job step), and cluster.ssh read as libssh2 options. The supervisor, the Slurm
// launcher, the host probes and lib/doctor all start nodes through it.
#pragma once

#include "config/train_config.h"
#include "launch/node_command.h"
#include "launch/placement.h"
#include "launch/spawner.h"
#include "launch/ssh_session.h"

#include <functional>
#include <memory>
#include <string>

namespace dtrain::launch {

/// Starts node `node`'s agent command; stdin_data carries the token. The default
/// (node_spawner_default) spawns local hosts directly and remote ones over SSH.
using NodeSpawner = std::function<std::unique_ptr<Process>(const NodePlan& node, const NodeCommand& cmd,
                                                           const std::string& stdin_data, LineCallback cb)>;

NodeSpawner node_spawner_default(const config::TrainConfig& cfg);

/// The spawner `--launcher` names: "slurm" starts the agents with srun inside this
/// Slurm allocation (read from the environment), anything else is node_spawner_default.
NodeSpawner node_spawner_for(const config::TrainConfig& cfg, const std::string& launcher);

/// cluster.ssh as libssh2 options ("~/" expanded). The hostfile's user@ and port=
/// override user and port per host.
SshOptions ssh_options_from_config(const config::SshConfig& ssh);

}  // namespace dtrain::launch
