// Builds the `dtrain agent` command for one node (argv, forwarded env, sh line) and
// parses the agent's argv back into AgentArgs. Quoting is single quotes only: the one
// POSIX sh form in which no byte but the quote itself is special.
#include "launch/node_command.h"

#include "config/hostfile.h"
#include "core/check.h"

#include <algorithm>
#include <set>

extern char** environ;

namespace dtrain::launch {

namespace {

bool env_name_valid(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool job_id_valid(std::string_view id) {
  if (id.empty() || id.size() > 128 || id[0] == '-') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

std::string devices_join(const std::vector<int>& devices) {
  std::string out;
  for (size_t i = 0; i < devices.size(); ++i) out += (i ? "," : "") + std::to_string(devices[i]);
  return out;
}

// ----------------------------------------------------------------------------
// agent argv parsing

// Decimal digits only, value in [lo, hi].
int parse_int(std::string_view opt, std::string_view s, long lo, long hi) {
  bool digits =
      !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  long v = digits ? std::stol(std::string(s)) : -1;
  if (!digits || v < lo || v > hi)
    DT_THROW(UsageError, "dtrain agent: {} expects an integer in {}..{}, got \"{}\"", opt, lo, hi, s);
  return static_cast<int>(v);
}

std::vector<int> parse_devices(std::string_view s) {
  std::vector<int> out;
  std::set<int> seen;
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    std::string_view part = s.substr(start, comma == std::string_view::npos ? s.npos : comma - start);
    int d = parse_int("--devices", part, 0, config::HOSTFILE_MAX_SLOTS - 1);
    if (!seen.insert(d).second) DT_THROW(UsageError, "dtrain agent: --devices \"{}\" lists device {} twice", s, d);
    out.push_back(d);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

// ----------------------------------------------------------------------------
// AgentArgs

std::vector<std::string> agent_args_to_argv(const AgentArgs& a) {
  std::vector<std::string> v = {
      "--job-id",
      a.job_id,
      "--round",
      std::to_string(a.round),
      "--node-rank",
      std::to_string(a.node_rank),
      "--nnodes",
      std::to_string(a.nnodes),
      "--world-size",
      std::to_string(a.world_size),
      "--first-rank",
      std::to_string(a.first_rank),
      "--local-world-size",
      std::to_string(a.local_world_size),
      "--devices",
      devices_join(a.devices),
      "--master-addr",
      a.master_addr,
      "--master-port",
      std::to_string(a.master_port),
      "--run-dir",
      a.run_dir,
      "--mode",
      a.mode,
  };
  if (a.device != "cpu") {
    v.push_back("--device");
    v.push_back(a.device);
  }
  if (!a.config_path.empty()) {
    v.push_back("--config");
    v.push_back(a.config_path);
  }
  if (!a.rank_args.empty()) {
    v.push_back("--");
    v.insert(v.end(), a.rank_args.begin(), a.rank_args.end());
  }
  return v;
}

AgentArgs agent_args_parse(const std::vector<std::string>& argv) {
  constexpr long MAX_RANKS = 1L << 24;
  const std::vector<std::string_view> required = {"--job-id",      "--round",       "--node-rank",        "--nnodes",
                                                  "--world-size",  "--first-rank",  "--local-world-size", "--devices",
                                                  "--master-addr", "--master-port", "--run-dir",          "--mode"};
  AgentArgs a;
  std::set<std::string> given;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word == "--") {
      a.rank_args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
      break;
    }
    if (word.rfind("--", 0) != 0)
      DT_THROW(UsageError, "dtrain agent: unexpected argument \"{}\" (rank arguments go after --)", word);
    std::string opt = word, value;
    size_t eq = word.find('=');
    if (eq != std::string::npos) {
      opt = word.substr(0, eq);
      value = word.substr(eq + 1);
    } else {
      if (i + 1 >= argv.size()) DT_THROW(UsageError, "dtrain agent: {} needs a value", opt);
      value = argv[++i];
    }
    bool known =
        opt == "--config" || opt == "--device" || std::find(required.begin(), required.end(), opt) != required.end();
    if (!known) DT_THROW(UsageError, "dtrain agent: unknown option \"{}\"", opt);
    if (!given.insert(opt).second) DT_THROW(UsageError, "dtrain agent: {} given twice", opt);

    if (opt == "--job-id") a.job_id = value;
    else if (opt == "--round") a.round = parse_int(opt, value, 0, MAX_RANKS);
    else if (opt == "--node-rank") a.node_rank = parse_int(opt, value, 0, MAX_RANKS);
    else if (opt == "--nnodes") a.nnodes = parse_int(opt, value, 1, MAX_RANKS);
    else if (opt == "--world-size") a.world_size = parse_int(opt, value, 1, MAX_RANKS);
    else if (opt == "--first-rank") a.first_rank = parse_int(opt, value, 0, MAX_RANKS);
    else if (opt == "--local-world-size") a.local_world_size = parse_int(opt, value, 1, MAX_RANKS);
    else if (opt == "--devices") a.devices = parse_devices(value);
    else if (opt == "--master-addr") a.master_addr = value;
    else if (opt == "--master-port") a.master_port = parse_int(opt, value, 1, 65535);
    else if (opt == "--run-dir") a.run_dir = value;
    else if (opt == "--mode") a.mode = value;
    else if (opt == "--config") a.config_path = value;
    else if (opt == "--device") a.device = value;
  }
  for (std::string_view opt : required)
    if (!given.count(std::string(opt))) DT_THROW(UsageError, "dtrain agent: {} is required", opt);

  if (!job_id_valid(a.job_id))
    DT_THROW(UsageError, "dtrain agent: --job-id \"{}\" must be 1-128 of [A-Za-z0-9._-]", a.job_id);
  if (a.mode != "train" && a.mode != "bench")
    DT_THROW(UsageError, "dtrain agent: --mode must be train or bench, got \"{}\"", a.mode);
  if (a.device != "cpu" && a.device != "cuda" && a.device != "auto")
    DT_THROW(UsageError, "dtrain agent: --device must be cpu, cuda or auto, got \"{}\"", a.device);
  if (a.master_addr.empty()) DT_THROW(UsageError, "dtrain agent: --master-addr is empty");
  if (a.run_dir.empty()) DT_THROW(UsageError, "dtrain agent: --run-dir is empty");
  if (given.count("--config") && a.config_path.empty()) DT_THROW(UsageError, "dtrain agent: --config is empty");
  DT_ENFORCE_LT(a.node_rank, a.nnodes, UsageError, "dtrain agent: --node-rank out of range");
  DT_ENFORCE_LE(a.nnodes, a.world_size, UsageError, "dtrain agent: more nodes than ranks");
  DT_ENFORCE_LE(a.first_rank + a.local_world_size, a.world_size, UsageError,
                "dtrain agent: this node's ranks exceed --world-size");
  DT_ENFORCE_EQ(static_cast<int>(a.devices.size()), a.local_world_size, UsageError,
                "dtrain agent: --devices must list one device per local rank");
  return a;
}

// ----------------------------------------------------------------------------
// NodeCommand

std::string agent_stdin_payload(const std::string& token, const std::map<std::string, std::string>& secret_env) {
  static const char* kHex = "0123456789abcdef";
  std::string out = token + "\n";
  for (const auto& [k, v] : secret_env) {
    out += k + "=";
    for (unsigned char c : v) {
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
    out += "\n";
  }
  out += "\n";
  return out;
}

std::pair<std::string, std::string> agent_env_line_parse(std::string_view line) {
  const size_t eq = line.find('=');
  const std::string name(line.substr(0, eq == std::string_view::npos ? 0 : eq));
  if (eq == std::string_view::npos || !env_name_valid(name))
    DT_THROW(UsageError, "dtrain agent: malformed environment line on stdin (expected NAME=<hex>)");
  std::string_view hex = line.substr(eq + 1);
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) DT_THROW(UsageError, "dtrain agent: the value of {} on stdin is not hex (odd length)", name);
  std::string value;
  value.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) DT_THROW(UsageError, "dtrain agent: the value of {} on stdin is not hex", name);
    value.push_back(static_cast<char>(hi * 16 + lo));
  }
  return {name, value};
}

std::string shell_quote(std::string_view word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  out += '\'';
  return out;
}

std::string NodeCommand::shell_line() const {
  DT_ENFORCE(!argv.empty(), InternalError, "node command without argv");
  // env(1) would take a program path containing '=' for one more assignment.
  if (argv[0].find('=') != std::string::npos)
    DT_THROW(ConfigError, "program path \"{}\" contains '='; install dtrain at a path without it", argv[0]);
  std::string line;
  if (!workdir.empty()) {
    // A leading '-' would read as a cd option.
    line += "cd " + shell_quote(workdir[0] == '-' ? "./" + workdir : workdir) + " && ";
  }
  line += "exec env --";
  for (const auto& [k, v] : env) {
    if (!env_name_valid(k)) DT_THROW(ConfigError, "environment variable name \"{}\" is not [A-Za-z_][A-Za-z0-9_]*", k);
    line += " " + shell_quote(k + "=" + v);
  }
  for (const std::string& w : argv) line += " " + shell_quote(w);
  return line;
}

NodeCommand node_command_build(const Plan& plan, int node_rank, const LaunchSpec& spec,
                               const std::map<std::string, std::string>& launcher_env) {
  DT_ENFORCE(node_rank >= 0 && node_rank < static_cast<int>(plan.nodes.size()), InternalError,
             "node rank {} outside the plan's {} nodes", node_rank, plan.nodes.size());
  if (!job_id_valid(spec.job_id)) DT_THROW(ConfigError, "job id \"{}\" must be 1-128 of [A-Za-z0-9._-]", spec.job_id);
  DT_ENFORCE_GE(spec.round, 0, ConfigError, "restart round must not be negative");
  DT_ENFORCE(!spec.run_dir.empty(), ConfigError, "no run directory for the nodes");
  DT_ENFORCE(!spec.dtrain_path.empty(), ConfigError, "no dtrain path for the nodes");
  if (spec.dtrain_path.find('=') != std::string::npos)
    DT_THROW(ConfigError, "dtrain path \"{}\" contains '='; install dtrain at a path without it", spec.dtrain_path);
  if (spec.mode != "train" && spec.mode != "bench")
    DT_THROW(ConfigError, "launch mode must be train or bench, got \"{}\"", spec.mode);
  const NodePlan& node = plan.nodes[static_cast<size_t>(node_rank)];

  NodeCommand cmd;
  cmd.workdir = spec.workdir;
  for (const auto& [k, v] : launcher_env) {
    bool match = std::any_of(spec.forward_prefixes.begin(), spec.forward_prefixes.end(),
                             [&](const std::string& p) { return k.rfind(p, 0) == 0; });
    if (match && env_name_valid(k)) cmd.env[k] = v;
  }
  for (const auto& [k, v] : spec.env_set) {
    if (!env_name_valid(k))
      DT_THROW(ConfigError, "env name \"{}\" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", k);
    cmd.env[k] = v;
  }
  for (const auto& [k, v] : spec.secret_env) {
    if (!env_name_valid(k))
      DT_THROW(ConfigError, "cluster.env.set: \"{}\" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", k);
    if (spec.env_set.count(k)) continue;  // dtrain's own settings win, as they always did
    cmd.env.erase(k);                     // a forwarded variable of that name is overridden
    cmd.secret_env[k] = v;
  }
  cmd.env["MASTER_ADDR"] = plan.master_addr;
  cmd.env["MASTER_PORT"] = std::to_string(plan.master_port);
  cmd.env["WORLD_SIZE"] = std::to_string(plan.world_size);
  cmd.env["NODE_RANK"] = std::to_string(node.node_rank);
  cmd.env["NNODES"] = std::to_string(plan.nodes.size());
  cmd.env["DTRAIN_JOB_ID"] = spec.job_id;
  for (const char* k : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "NNODES", "DTRAIN_JOB_ID"})
    cmd.secret_env.erase(k);

  AgentArgs a;
  a.job_id = spec.job_id;
  a.round = spec.round;
  a.node_rank = node.node_rank;
  a.nnodes = static_cast<int>(plan.nodes.size());
  a.world_size = plan.world_size;
  a.first_rank = node.first_rank;
  a.local_world_size = static_cast<int>(node.ranks.size());
  for (const RankInfo& r : node.ranks) a.devices.push_back(r.device);
  a.master_addr = plan.master_addr;
  a.master_port = plan.master_port;
  a.run_dir = spec.run_dir;
  a.mode = spec.mode;
  a.device = spec.device;
  a.config_path = spec.config_path;
  a.rank_args = spec.rank_args;

  cmd.argv = {spec.dtrain_path, "agent"};
  std::vector<std::string> rest = agent_args_to_argv(a);
  cmd.argv.insert(cmd.argv.end(), rest.begin(), rest.end());
  return cmd;
}

std::map<std::string, std::string> environ_map() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return out;
}

}  // namespace dtrain::launch
