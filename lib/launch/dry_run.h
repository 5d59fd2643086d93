// --dry-run: what `dtrain launch` would do, without doing it: the placement table and,
// per node, the exact sh line and the agent's environment (control bytes escaped).
#pragma once

#include "launch/node_command.h"
#include "launch/placement.h"

#include <map>
#include <string>

namespace dtrain::launch {

/// The report:
///     <plan_format_table>
///     node N (user@host:port):
///       command: <NodeCommand::shell_line(), exact>
///       env:
///         K=V            (one per line; \n \t \r \\ and \xHH escapes in V)
/// `user@` and `:port` appear only when the hostfile gives them. The rendezvous token
/// is not part of the command or env and so is never shown. Without `commands`, the
/// first line and the table only (hosts that stand for others have no command).
std::string dry_run_report(const Plan& plan, const LaunchSpec& spec,
                           const std::map<std::string, std::string>& launcher_env, bool commands = true);

}  // namespace dtrain::launch
