// The per-node agent command: `dtrain agent ...` argv, its environment and the exact
// POSIX sh line the spawners run (cd + exec env), plus the AgentArgs contract that the
// agent parses back (round-trip). The rendezvous token is never part of any of it.
#pragma once

#include "launch/placement.h"

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::launch {

// ----------------------------------------------------------------------------
// What to launch

struct LaunchSpec {
  std::string job_id;                          // [A-Za-z0-9._-]+
  int round = 0;                               // restart round, >= 0
  std::string workdir;                         // remote cwd; "" = the login directory
  std::string dtrain_path = "dtrain";          // the dtrain binary as the nodes see it
  std::string run_dir;                         // shared run directory (absolute path as the nodes see it)
  std::vector<std::string> forward_prefixes;   // launcher env vars whose names start with one
  std::map<std::string, std::string> env_set;  // set on every node (overrides forwarded)
  /// cluster.env.set (tokens, passwords): set for the ranks on every node, but sent on the
  /// agent's stdin, never in a command line (/proc/PID/cmdline is world-readable).
  std::map<std::string, std::string> secret_env;
  std::string config_path;             // the resolved config saved in the run dir; "" = none
  std::string mode = "train";          // "train" or "bench"
  std::string device = "cpu";          // training.device: "cpu", "cuda" or "auto" (train mode)
  std::vector<std::string> rank_args;  // extra args for the rank processes
};

// ----------------------------------------------------------------------------
// The agent's command line (contract between launcher and `dtrain agent`)

/// Everything the agent needs besides the token (which arrives on its stdin).
/// As argv (after `dtrain agent`):
///     --job-id J --round R --node-rank N --nnodes K --world-size W --first-rank F
///     --local-world-size L --devices 0,1 --master-addr A --master-port P --run-dir D
///     --mode M [--device cpu|cuda|auto] [--config C] [-- rank args...]
/// Every option but --device (default cpu) and --config is required, each exactly once, in any order; `--key=value`
/// is accepted too. The agent sets CUDA_VISIBLE_DEVICES=<devices> for its ranks, so
/// local rank i uses CUDA device i, and gives rank i global rank first_rank + i.
struct AgentArgs {
  std::string job_id;
  int round = 0;
  int node_rank = 0;
  int nnodes = 0;
  int world_size = 0;
  int first_rank = 0;
  int local_world_size = 0;
  std::vector<int> devices;  // physical device ids, local rank order; size local_world_size
  std::string master_addr;
  int master_port = 0;
  std::string run_dir;
  std::string mode = "train";          // "train" or "bench"
  std::string device = "cpu";          // training.device; the agent resolves auto before it starts ranks
  std::string config_path;             // "" = not passed
  std::vector<std::string> rank_args;  // after "--"

  bool operator==(const AgentArgs&) const = default;
};

/// The words after `dtrain agent` (not including them). Does not validate.
std::vector<std::string> agent_args_to_argv(const AgentArgs& args);

/// Parses the words after `dtrain agent` and checks them (ranges, node_rank < nnodes,
/// first_rank + local_world_size <= world_size, devices distinct and matching
/// local_world_size, port range, known mode). UsageError naming the option otherwise.
AgentArgs agent_args_parse(const std::vector<std::string>& argv);

// ----------------------------------------------------------------------------
// The command run on each node

struct NodeCommand {
  std::vector<std::string> argv;                  // {dtrain_path, "agent", ...}
  std::map<std::string, std::string> env;         // set for the agent (sorted by name)
  std::map<std::string, std::string> secret_env;  // for the ranks, on the agent's stdin only
  std::string workdir;

  /// The exact POSIX sh line:
  ///     cd '<workdir>' && exec env -- 'K=V' ... '<argv0>' '<argv1>' ...
  /// ("cd ... &&" omitted when workdir is empty). Every word is single-quoted ('\''
  /// for a quote), so spaces, quotes, $, backslashes and newlines arrive byte-exact.
  /// It needs a POSIX login shell (sh, bash, dash, zsh, ksh); a spawner that may meet
  /// csh/fish should pass it as `/bin/sh -c <shell_quote(line)>`.
  /// Values here are visible in the node's process list: never put secrets in env.
  std::string shell_line() const;
};

/// What the launcher writes on the agent's stdin: the rendezvous token line, then one
/// "NAME=<value in hex>" line per secret_env entry (hex: any byte, newlines included, stays
/// on its line), then an empty line. The agent reads it with agent_stdin_read_env.
std::string agent_stdin_payload(const std::string& token, const std::map<std::string, std::string>& secret_env);

/// One "NAME=<hex>" line of that block as (NAME, value); UsageError for a malformed line.
std::pair<std::string, std::string> agent_env_line_parse(std::string_view line);

/// Single-quotes `word` for POSIX sh ('' for the empty string).
std::string shell_quote(std::string_view word);

/// The agent command for node `node_rank` of `plan`.
/// env = launcher_env entries whose names start with a forward prefix (valid names
/// only), then spec.env_set (overrides), then MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
/// NODE_RANK, NNODES, DTRAIN_JOB_ID from the plan (these always win). spec.secret_env goes
/// to secret_env (and out of env) unless env_set or the plan sets that name.
/// ConfigError for a bad spec (empty job id/run dir, unknown mode, env_set name that is
/// not [A-Za-z_][A-Za-z0-9_]*, '=' in dtrain_path); InternalError for a bad node_rank.
NodeCommand node_command_build(const Plan& plan, int node_rank, const LaunchSpec& spec,
                               const std::map<std::string, std::string>& launcher_env);

/// The current process environment as a map (for launcher_env).
std::map<std::string, std::string> environ_map();

}  // namespace dtrain::launch
