// Slurm allocation parsing, the hostfile it implies and the srun-based node spawner.
#include "launch/slurm.h"

#include "core/check.h"
#include "core/env.h"
#include "launch/hostlist.h"
#include "launch/local_spawner.h"

#include <algorithm>
#include <charconv>

namespace dtrain::launch {

namespace {

bool parse_positive(std::string_view s, int* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size() && *v > 0;
}

std::string get(const std::map<std::string, std::string>& env, const char* key) { return env_get_in(env, key); }

}  // namespace

// ---------------------------------------------------------------------------

std::vector<int> slurm_counts_expand(std::string_view text, const std::string& var) {
  std::vector<int> out;
  auto bad = [&](std::string_view item, const char* why) {
    DT_THROW(ConfigError,
             "{}='{}': item '{}' {}; Slurm writes per-node counts as N or N(xR), comma separated, "
             "e.g. 2(x3),1",
             var, text, item, why);
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    if (item.empty()) bad(item, "is empty");
    int count = 0, repeat = 1;
    size_t paren = item.find('(');
    if (!parse_positive(item.substr(0, paren), &count)) bad(item, "does not start with a positive count");
    if (paren != std::string_view::npos) {
      std::string_view rep = item.substr(paren);
      if (rep.size() < 4 || rep.substr(0, 2) != "(x" || rep.back() != ')' ||
          !parse_positive(rep.substr(2, rep.size() - 3), &repeat))
        bad(item, "has a malformed repeat (expected (xR) with R >= 1)");
      if (repeat > 1 << 20) bad(item, "repeats more than 1048576 times");
    }
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    pos = comma + 1;
  }
  return out;
}

int slurm_gpus_parse(std::string_view text, const std::string& var) {
  int total = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    std::string_view num = item.substr(item.rfind(':') == std::string_view::npos ? 0 : item.rfind(':') + 1);
    int n = 0;
    if (!parse_positive(num, &n) && num != "0")
      DT_THROW(ConfigError, "{}='{}': '{}' is not a GPU count (expected N or TYPE:N, comma separated)", var, text,
               item);
    total += n;
    pos = comma + 1;
  }
  return total;
}

SlurmAllocation slurm_allocation_from_env(const std::map<std::string, std::string>& env) {
  SlurmAllocation a;
  a.job_id = get(env, "SLURM_JOB_ID");
  std::string list_var = "SLURM_JOB_NODELIST";
  std::string list = get(env, "SLURM_JOB_NODELIST");
  if (list.empty()) {
    list_var = "SLURM_NODELIST";
    list = get(env, "SLURM_NODELIST");
  }
  DT_ENFORCE(!list.empty(), ConfigError,
             "--launcher slurm: not inside a Slurm allocation (SLURM_JOB_NODELIST is not set); run dtrain under "
             "sbatch or salloc (see scripts/slurm/dtrain.sbatch)");
  a.nodes = hostlist_expand(list);
  DT_ENFORCE(!a.nodes.empty(), ConfigError, "{}='{}' names no node", list_var, list);
  const size_t n = a.nodes.size();

  if (std::string t = get(env, "SLURM_TASKS_PER_NODE"); !t.empty()) {
    a.tasks_per_node = slurm_counts_expand(t, "SLURM_TASKS_PER_NODE");
    DT_ENFORCE_EQ(a.tasks_per_node.size(), n, ConfigError,
                  "SLURM_TASKS_PER_NODE='{}' does not match the {} node(s) of {}='{}'", t, n, list_var, list);
  } else if (std::string t2 = get(env, "SLURM_NTASKS_PER_NODE"); !t2.empty()) {
    int k = 0;
    DT_ENFORCE(parse_positive(t2, &k), ConfigError, "SLURM_NTASKS_PER_NODE='{}' is not a positive number", t2);
    a.tasks_per_node.assign(n, k);
  }
  if (std::string c = get(env, "SLURM_JOB_CPUS_PER_NODE"); !c.empty()) {
    a.cpus_per_node = slurm_counts_expand(c, "SLURM_JOB_CPUS_PER_NODE");
    DT_ENFORCE_EQ(a.cpus_per_node.size(), n, ConfigError,
                  "SLURM_JOB_CPUS_PER_NODE='{}' does not match the {} node(s) of {}='{}'", c, n, list_var, list);
  }
  if (std::string g = get(env, "SLURM_GPUS_ON_NODE"); !g.empty())
    a.gpus_per_node = slurm_gpus_parse(g, "SLURM_GPUS_ON_NODE");
  else if (std::string g2 = get(env, "SLURM_GPUS_PER_NODE"); !g2.empty())
    a.gpus_per_node = slurm_gpus_parse(g2, "SLURM_GPUS_PER_NODE");
  else if (std::string ids = get(env, "SLURM_JOB_GPUS"); !ids.empty())
    a.gpus_per_node = static_cast<int>(std::count(ids.begin(), ids.end(), ',')) + 1;
  return a;
}

config::Hostfile slurm_hostfile(const SlurmAllocation& alloc) {
  config::Hostfile hf;
  hf.path = "SLURM_JOB_NODELIST=" + hostlist_compress(alloc.nodes);
  for (size_t i = 0; i < alloc.nodes.size(); ++i) {
    config::HostEntry e;
    e.host = alloc.nodes[i];
    e.slots = alloc.gpus_per_node > 0           ? alloc.gpus_per_node
              : i < alloc.tasks_per_node.size() ? alloc.tasks_per_node[i]
                                                : 1;
    DT_ENFORCE(e.slots <= config::HOSTFILE_MAX_SLOTS, ConfigError,
               "node {} of the Slurm allocation has {} slots (max {})", e.host, e.slots, config::HOSTFILE_MAX_SLOTS);
    for (int s = 0; s < e.slots; ++s) e.slot_ids.push_back(s);
    e.line = static_cast<int>(i) + 1;
    hf.hosts.push_back(std::move(e));
  }
  return hf;
}

std::vector<std::string> slurm_srun_argv(const std::string& host, int node_rank, const NodeCommand& cmd,
                                         const SrunOptions& opts) {
  std::vector<std::string> argv{
      opts.srun,      "--nodes=1",    "--ntasks=1", "--nodelist=" + host,
      "--export=ALL", "--unbuffered", "--overlap",  fmt::format("--job-name=dtrain-node{}", node_rank)};
  if (opts.cpus > 0) argv.push_back(fmt::format("--cpus-per-task={}", opts.cpus));
  if (opts.gpus > 0) argv.push_back(fmt::format("--gres=gpu:{}", opts.gpus));
  argv.push_back("--mem=0");  // the step may use all of the job's memory on its node
  argv.insert(argv.end(), opts.extra.begin(), opts.extra.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", cmd.shell_line()});
  return argv;
}

NodeSpawner node_spawner_slurm(const SlurmAllocation& alloc, const std::string& srun) {
  return [alloc, srun](const NodePlan& node, const NodeCommand& cmd, const std::string& stdin_data,
                       LineCallback cb) -> std::unique_ptr<Process> {
    SrunOptions o;
    o.srun = srun;
    for (size_t i = 0; i < alloc.nodes.size(); ++i)
      if (alloc.nodes[i] == node.host.host && i < alloc.cpus_per_node.size()) o.cpus = alloc.cpus_per_node[i];
    // The agent needs the GPUs its ranks use: the step asks for the selected slots.
    if (alloc.gpus_per_node > 0) o.gpus = static_cast<int>(node.ranks.size());
    auto argv = slurm_srun_argv(node.host.host, node.node_rank, cmd, o);
    // srun's own environment is the launcher's; the agent's is set in the shell line.
    return spawn_local(argv, {}, "", stdin_data, std::move(cb), true);
  };
}

}  // namespace dtrain::launch
