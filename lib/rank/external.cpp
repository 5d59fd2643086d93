// `dtrain run`: placement from another launcher's environment, the token from the
// platform, and rank 0's verdict over the heartbeats.
#include "rank/external.h"

#include "core/check.h"
#include "core/env.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/net_address.h"
#include "launch/culprit.h"
#include "launch/hostlist.h"
#include "launch/job.h"
#include "rank/rank_context.h"
#include "launch/rank_watch.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>
#include <sys/stat.h>

namespace dtrain::rank {

namespace {

using Env = std::map<std::string, std::string>;

std::string get(const Env& env, const std::string& k) { return env_get_in(env, k); }

bool has(const Env& env, const std::string& k) { return !get(env, k).empty(); }

int env_int(const Env& env, const std::string& launcher, const std::string& name, long lo, long hi) {
  const std::string s = get(env, name);
  DT_ENFORCE(!s.empty(), UsageError, "dtrain run under {}: {} is not set", launcher, name);
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  DT_ENFORCE(end && *end == '\0' && v >= lo && v <= hi, UsageError,
             "dtrain run under {}: {}='{}' must be an integer in [{}, {}]", launcher, name, s, lo, hi);
  return static_cast<int>(v);
}

int env_int_or(const Env& env, const std::string& launcher, const std::string& name, long lo, long hi, int fallback) {
  return has(env, name) ? env_int(env, launcher, name, lo, hi) : fallback;
}

constexpr long kMaxRanks = 1L << 20;

// A decimal count in [1, kMaxRanks] at the start of `text` (advanced past it), or nullopt
// when there is none; UsageError naming the variable when the digits are out of range
// (they would wrap an int: "99999999999(x2)" read as 1215752191 local ranks).
std::optional<long> slurm_count(std::string_view& text, const std::string& name, const std::string& value) {
  size_t n = 0;
  while (n < text.size() && std::isdigit(static_cast<unsigned char>(text[n]))) ++n;
  if (n == 0) return std::nullopt;
  const std::string digits(text.substr(0, n));
  text.remove_prefix(n);
  DT_ENFORCE(n <= 7 && std::stol(digits) >= 1 && std::stol(digits) <= kMaxRanks, UsageError,
             "dtrain run under srun: {}='{}' holds the count {}, outside [1, {}]: this is not the environment srun "
             "sets; unset it or start the job with srun",
             name, value, digits, kMaxRanks);
  return std::stol(digits);
}

// Slurm's SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE: "2(x3),1" = 2,2,2,1. The
// count on node `node`, or 0 when the text does not say.
int slurm_tasks_on_node(const std::string& name, const std::string& text, int node) {
  long index = 0;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    std::string_view rest = part;
    const std::optional<long> count = slurm_count(rest, name, text);
    if (!count) return 0;
    long repeat = 1;
    if (rest.rfind("(x", 0) == 0) {
      rest.remove_prefix(2);
      const std::optional<long> r = slurm_count(rest, name, text);
      if (!r || rest != ")") return 0;
      repeat = *r;
    } else if (!rest.empty()) {
      return 0;
    }
    if (node < index + repeat) return static_cast<int>(*count);
    index += repeat;
  }
  return 0;
}

std::string evidence(const Env& env, const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    if (has(env, n)) out += (out.empty() ? "" : " ") + n + "=" + get(env, n);
  return out;
}

// An MPI launcher's placement from its variables: {rank, size, local rank, local size}
// (the local ones optional); node = rank / local size, as mpirun places ranks by slot.
ExternalPlacement mpi_placement(const Env& env, const std::string& launcher, const std::vector<std::string>& names) {
  ExternalPlacement p;
  p.launcher = launcher;
  p.world_size = env_int(env, launcher, names[1], 1, kMaxRanks);
  p.rank = env_int(env, launcher, names[0], 0, p.world_size - 1);
  p.local_world_size = env_int_or(env, launcher, names[3], 1, p.world_size, 1);
  p.local_rank = env_int_or(env, launcher, names[2], 0, p.local_world_size - 1, 0);
  p.nnodes = p.world_size % p.local_world_size == 0 ? p.world_size / p.local_world_size : 1;
  p.node_rank = p.rank / p.local_world_size;
  p.evidence = evidence(env, names);
  return p;
}

// Another launcher's rank and size beside the chosen one's (p): the same process's view
// (equal), or the outer launcher of a nested one (mpirun starting one torchrun per node:
// its rank is the node index, its size the node count). Anything else is two jobs'
// variables mixed (an exported RANK under mpirun): trusting either would start ranks that
// never meet, so UsageError naming both. Slurm's are not compared: an allocation's batch
// step exports SLURM_PROCID=0 to everything started inside it.
void check_other_launcher(const ExternalPlacement& p, const Env& env, const std::string& other,
                          const std::string& rank_var, const std::string& size_var) {
  auto number = [&](const std::string& name) -> std::optional<long> {
    const std::string s = get(env, name);
    char* end = nullptr;
    const long v = s.empty() ? 0 : std::strtol(s.c_str(), &end, 10);
    if (s.empty() || !end || *end != '\0') return std::nullopt;
    return v;
  };
  const std::optional<long> rank = number(rank_var), size = number(size_var);
  if (!rank && !size) return;
  const bool same = (!rank || *rank == p.rank) && (!size || *size == p.world_size);
  const bool outer = (!rank || *rank == p.node_rank) && (!size || *size == p.nnodes);
  if (same || outer) return;
  DT_THROW(UsageError,
           "dtrain run: the environment holds two launchers' placements that disagree: {} (as {}) and {}={} {}={} "
           "(as {}, neither the same rank nor this node's index and node count): unset the variables of the "
           "launcher that did not start this process",
           p.evidence, p.launcher, rank_var, get(env, rank_var).empty() ? "(unset)" : get(env, rank_var), size_var,
           get(env, size_var).empty() ? "(unset)" : get(env, size_var), other);
}

}  // namespace

ExternalPlacement external_placement(const Env& env) {
  ExternalPlacement p;
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) {
    // A Kubernetes Indexed Job gives each pod its index, not a RANK: the manifest sets
    // WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and the index is the rank.
    const bool indexed = !has(env, "RANK") && has(env, "JOB_COMPLETION_INDEX");
    p.launcher = indexed ? "a Kubernetes Indexed Job" : "torchrun";
    p.world_size = env_int(env, p.launcher, "WORLD_SIZE", 1, kMaxRanks);
    p.rank = env_int(env, p.launcher, indexed ? "JOB_COMPLETION_INDEX" : "RANK", 0, p.world_size - 1);
    p.local_world_size = env_int_or(env, p.launcher, "LOCAL_WORLD_SIZE", 1, p.world_size, 1);
    p.local_rank = env_int_or(env, p.launcher, "LOCAL_RANK", 0, p.local_world_size - 1, 0);
    // The node count: torchrun's GROUP_WORLD_SIZE, else what the local size implies. A
    // node holds at least one rank, so GROUP_RANK stays below the node count (below
    // WORLD_SIZE when uneven nodes leave the count unknown).
    const bool even = p.world_size % p.local_world_size == 0;
    p.nnodes =
        env_int_or(env, p.launcher, "GROUP_WORLD_SIZE", 1, p.world_size, even ? p.world_size / p.local_world_size : 1);
    const bool nodes_known = even || has(env, "GROUP_WORLD_SIZE");
    p.node_rank = env_int_or(env, p.launcher, "GROUP_RANK", 0, (nodes_known ? p.nnodes : p.world_size) - 1,
                             p.rank / p.local_world_size);
    p.run_id = get(env, "TORCHELASTIC_RUN_ID");
    p.evidence = evidence(
        env, {indexed ? "JOB_COMPLETION_INDEX" : "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"});
  } else if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) {
    p = mpi_placement(
        env, "Open MPI",
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"});
    p.run_id = get(env, "OMPI_MCA_ess_base_jobid");
  } else if (has(env, "SLURM_PROCID")) {
    p.launcher = "srun";
    p.world_size = env_int(env, p.launcher, "SLURM_NTASKS", 1, kMaxRanks);
    p.rank = env_int(env, p.launcher, "SLURM_PROCID", 0, p.world_size - 1);
    p.nnodes = env_int_or(env, p.launcher, "SLURM_NNODES", 1, p.world_size, 1);
    p.node_rank = env_int_or(env, p.launcher, "SLURM_NODEID", 0, p.nnodes - 1, 0);
    p.local_rank = env_int_or(env, p.launcher, "SLURM_LOCALID", 0, p.world_size - 1, 0);
    int local = 0;
    for (const char* k : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
      if (!local && has(env, k)) local = slurm_tasks_on_node(k, get(env, k), p.node_rank);
    p.local_world_size = std::max(local, p.local_rank + 1);
    std::string nodelist = get(env, "SLURM_STEP_NODELIST");
    if (nodelist.empty()) nodelist = get(env, "SLURM_JOB_NODELIST");
    if (!nodelist.empty()) {
      std::vector<std::string> hosts = launch::hostlist_expand(nodelist);
      if (!hosts.empty()) p.master_addr = hosts.front();
    }
    p.run_id = get(env, "SLURM_JOB_ID");
    if (!p.run_id.empty() && has(env, "SLURM_STEP_ID")) p.run_id += "." + get(env, "SLURM_STEP_ID");
    p.evidence = evidence(
        env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NODELIST"});
  } else if (has(env, "PMI_RANK") || has(env, "PMI_SIZE")) {
    p = mpi_placement(env, "PMI", {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"});
  } else {
    DT_THROW(UsageError,
             "dtrain run: no launcher's placement in the environment: it reads RANK/WORLD_SIZE (torchrun, "
             "Kubeflow PyTorchJob), OMPI_COMM_WORLD_RANK/_SIZE (mpirun), SLURM_PROCID/SLURM_NTASKS (srun) or "
             "PMI_RANK/PMI_SIZE; to start ranks on hosts yourself use dtrain launch");
  }
  if (p.launcher == "torchrun")
    check_other_launcher(p, env, "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  if (p.launcher == "torchrun" || p.launcher == "Open MPI") check_other_launcher(p, env, "PMI", "PMI_RANK", "PMI_SIZE");
  if (has(env, "MASTER_ADDR")) p.master_addr = get(env, "MASTER_ADDR");
  if (has(env, "MASTER_PORT")) p.master_port = env_int(env, p.launcher, "MASTER_PORT", 1, 65535);
  return p;
}

ExternalPlacement external_node(const ExternalPlacement& p, const Env& env) {
  ExternalPlacement node = p;
  if (!has(env, "PET_NNODES") && !has(env, "PET_NODE_RANK")) return node;
  // Kubeflow's operator (and torchrun's PET_ convention) says the node count and the
  // node's index directly; WORLD_SIZE may already count processes (nprocPerNode).
  const std::string who = "the PET_ variables (Kubeflow)";
  node.world_size = env_int(env, who, "PET_NNODES", 1, kMaxRanks);
  node.rank = env_int(env, who, "PET_NODE_RANK", 0, node.world_size - 1);
  return node;
}

std::map<std::string, std::string> external_local_rank_env(const Env& base, const ExternalPlacement& node, int nproc,
                                                           int i, const std::string& master_addr, int master_port) {
  Env env;
  for (const auto& [k, v] : base) {
    const bool other = k.rfind("OMPI_COMM_WORLD_", 0) == 0 || k == "SLURM_PROCID" || k == "SLURM_LOCALID" ||
                       k == "PMI_RANK" || k == "PMI_SIZE" || k == "MPI_LOCALRANKID" || k == "MPI_LOCALNRANKS";
    if (!other) env[k] = v;
  }
  env["RANK"] = std::to_string(node.rank * nproc + i);
  env["WORLD_SIZE"] = std::to_string(node.world_size * nproc);
  env["LOCAL_RANK"] = std::to_string(i);
  env["LOCAL_WORLD_SIZE"] = std::to_string(nproc);
  env["GROUP_RANK"] = std::to_string(node.rank);
  env["MASTER_ADDR"] = master_addr;
  env["MASTER_PORT"] = std::to_string(master_port);
  env["TORCHELASTIC_RUN_ID"] = external_job_id(node.run_id);
  return env;
}

std::string external_job_id(const std::string& run_id) {
  std::string out;
  for (char c : run_id)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') out.push_back(c);
  while (!out.empty() && out[0] == '-') out.erase(0, 1);
  if (out.size() > 64) out.resize(64);
  return out.empty() ? "dtrain-run" : out;
}

void external_token_mode_check(const std::string& path, const std::string& named) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 044) == 0) return;
  log_warn(
      "cluster.rendezvous.token_file {} is readable by {} (mode {:04o}): anyone who reads the job token can "
      "join the job's store and stop or steer it; make it readable by its owner only (chmod 600 {}, or "
      "defaultMode: 0400 on the Kubernetes Secret volume)",
      named, (st.st_mode & 004) ? "every user" : "its group", st.st_mode & 07777, path);
}

std::string external_token(const std::string& token_file, const std::string& token_env, const Env& env,
                           const std::string& source) {
  DT_ENFORCE(!(token_file.empty() && token_env.empty()), ConfigError,
             "{}: dtrain run needs the job token from the platform: set cluster.rendezvous.token_file (a mounted "
             "Secret) or cluster.rendezvous.token_env (the variable that holds it); it is never taken from the "
             "command line",
             source);
  DT_ENFORCE(token_file.empty() || token_env.empty(), ConfigError,
             "{}: set one of cluster.rendezvous.token_file and cluster.rendezvous.token_env, not both", source);
  std::string token;
  if (!token_file.empty()) {
    const std::string path = launch::path_expand_home(token_file, get(env, "HOME"));
    // Type and size first: a directory, /dev/zero or a FIFO is a config error at once.
    std::string problem = input_file_problem(path, 4096);
    if (!problem.empty())
      DT_THROW(ConfigError,
               "{}: cluster.rendezvous.token_file {} {}: mount the job's token Secret there (a regular file of at "
               "most 4 KiB that every process of the job reads)",
               source, token_file, problem);
    external_token_mode_check(path, token_file);
    std::string text = input_file_read(path, source + ": cluster.rendezvous.token_file", 4096);
    token = std::move(text);
  } else {
    auto it = env.find(token_env);  // a name the config chose: no table lists it
    token = it == env.end() ? "" : it->second;
    DT_ENFORCE(!token.empty(), ConfigError,
               "{}: cluster.rendezvous.token_env names {}, which is not set in this process's environment: set it "
               "from the job's Secret",
               source, token_env);
  }
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  token.erase(token.begin(), std::find_if(token.begin(), token.end(), not_space));
  token.erase(std::find_if(token.rbegin(), token.rend(), not_space).base(), token.end());
  DT_ENFORCE(token.size() >= 16, ConfigError,
             "{}: the job token from {} has {} characters; use at least 16 random ones (e.g. `openssl rand -hex 32`)",
             source, token_file.empty() ? "$" + token_env : token_file, token.size());
  return token;
}

std::string external_watch_verdict(const std::map<int, std::pair<std::string, std::chrono::milliseconds>>& beats,
                                   const std::map<int, std::string>& hosts, int world_size,
                                   std::chrono::milliseconds heartbeat_timeout, bool join_deadline_passed,
                                   std::chrono::milliseconds join_timeout) {
  auto where = [&](int r) {
    auto it = hosts.find(r);
    return it == hosts.end() ? std::string() : " (" + it->second + ")";
  };
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    auto it = beats.find(r);
    if (it == beats.end()) {
      missing.push_back(r);
      continue;
    }
    const auto& [value, age] = it->second;
    if (value == launch::kRankBeatExited) continue;
    if (age > heartbeat_timeout)
      return fmt::format("rank {}{} missed heartbeats for {:.1f} s (fault_tolerance.heartbeat_timeout {:.0f} s)", r,
                         where(r), std::chrono::duration<double>(age).count(),
                         std::chrono::duration<double>(heartbeat_timeout).count());
  }
  if (!missing.empty() && join_deadline_passed) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
    if (missing.size() > 8) list += fmt::format(" and {} more", missing.size() - 8);
    return fmt::format("rank(s) {} did not join within cluster.rendezvous.join_timeout ({:.0f} s)", list,
                       std::chrono::duration<double>(join_timeout).count());
  }
  return "";
}

namespace {
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
}  // namespace

std::unique_ptr<rendezvous::StoreServer> external_store_host(const std::string& master_addr, int port,
                                                             const std::string& token) {
  std::string listen;
  try {
    listen = rendezvous::store_listen_address(master_addr, true);
    return std::make_unique<rendezvous::StoreServer>(listen, static_cast<uint16_t>(port), token);
  } catch (const CommError& e) {
    const std::string what = e.what();
    if (what.find("in use") != std::string::npos)
      DT_THROW(CommError,
               "rank 0 cannot host the store: port {} is in use on {} (another job, or an earlier rank 0 still "
               "running): set MASTER_PORT / cluster.rendezvous.port to a free port",
               port, host_name());
    log_info("MASTER_ADDR {} is not an address of this host ({}): the store listens on every interface", master_addr,
             what);
  }
  return std::make_unique<rendezvous::StoreServer>("0.0.0.0", static_cast<uint16_t>(port), token);
}

bool external_store_answers(const std::string& host, int port, const std::string& token) {
  try {
    rendezvous::StoreClient probe(host, static_cast<uint16_t>(port), token, 2s);
    return true;
  } catch (const CommError&) {
    return false;
  }
}

void external_store_wait(const std::string& host, int port, const std::string& token,
                         std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      rendezvous::StoreClient probe(host, static_cast<uint16_t>(port), token, std::max(left, 1000ms));
      return;
    } catch (const CommError& e) {
      const std::string what = e.what();
      const bool retry = what.find("cannot resolve") != std::string::npos && Clock::now() + 1s < deadline;
      if (!retry)
        DT_THROW(CommError,
                 "cannot join the job's store at {}:{} (rank 0's process) within cluster.rendezvous.join_timeout: {}",
                 host, port, what);
      std::this_thread::sleep_for(1s);
    }
  }
}

std::string external_failure_reason(const std::map<std::string, std::string>& reports, int comm_code,
                                    std::chrono::milliseconds since_first) {
  // Every report as seen when the first one was: the culprit rule (culprit.h) decides.
  const Clock::time_point now = Clock::now();
  std::vector<launch::FailureSeen> seen;
  std::vector<std::string> whys;
  const std::string comm_prefix = fmt::format("{} ", comm_code);
  for (const auto& [k, v] : reports) {
    // Any report but "<comm_code> ..." is a rank's own error.
    const bool comm = v.rfind(comm_prefix, 0) == 0;
    seen.push_back(
        {static_cast<int>(seen.size()), static_cast<int>(comm ? Exit::COMM : Exit::INTERNAL), now - since_first});
    whys.push_back(v);
  }
  const std::optional<size_t> c = launch::culprit_pick(seen, now, launch::kCulpritWindow + 1ms);
  if (!c) return "";
  const std::string& why = whys[*c];
  const size_t sp = why.find(' ');
  return sp == std::string::npos ? why : why.substr(sp + 1);
}

ExternalStopWatch::ExternalStopWatch(const RankContext& ctx, std::chrono::milliseconds lost_timeout,
                                     const rendezvous::StoreServer* server,
                                     std::function<void(const std::string&)> on_stop)
    : thread_(&ExternalStopWatch::run, this, ctx.master_addr, ctx.master_port, ctx.token,
              ctx.round_store->prefix() + kExternalStopKey, lost_timeout, server, std::move(on_stop)) {}

ExternalStopWatch::~ExternalStopWatch() {
  done_ = true;
  thread_.join();
}

void ExternalStopWatch::run(std::string host, int port, std::string token, std::string stop_key,
                            std::chrono::milliseconds lost_timeout, const rendezvous::StoreServer* server,
                            std::function<void(const std::string&)> on_stop) {
  std::unique_ptr<rendezvous::StoreClient> client;
  bool lost = false;  // the store is unreachable since lost_since
  Clock::time_point lost_since = Clock::now();
  while (!done_) {
    std::this_thread::sleep_for(200ms);
    if (done_) break;
    try {
      if (!client) client = std::make_unique<rendezvous::StoreClient>(host, static_cast<uint16_t>(port), token, 2s);
      lost = false;
      if (!client->check({stop_key})) continue;
      const std::string why = client->get(stop_key, 2s);
      if (done_) break;
      if (server)  // rank 0: let the others read it before its store goes (its own 3 connections remain)
        for (int i = 0; i < 30 && server->connection_count() > 4; ++i) std::this_thread::sleep_for(100ms);
      on_stop("the job stops: " + why);
      return;
    } catch (const Error& e) {
      client.reset();
      if (!lost) lost_since = Clock::now();
      lost = true;
      if (!done_ && Clock::now() - lost_since > lost_timeout) {
        on_stop(fmt::format("lost the job's store at {}:{} (rank 0's process) for {:.0f} s: {}; the job stops", host,
                            port, std::chrono::duration<double>(Clock::now() - lost_since).count(), e.what()));
        return;
      }
    }
  }
}

ExternalRankZeroWatch::ExternalRankZeroWatch(const rendezvous::StoreServer& server, const RankContext& ctx,
                                             int world_size, std::chrono::milliseconds heartbeat_timeout,
                                             std::chrono::milliseconds join_timeout)
    : thread_(&ExternalRankZeroWatch::run, this, std::cref(server), ctx.master_addr, ctx.master_port, ctx.token,
              ctx.round_store->prefix(), world_size, heartbeat_timeout, join_timeout) {}

ExternalRankZeroWatch::~ExternalRankZeroWatch() {
  done_ = true;
  thread_.join();
}

void ExternalRankZeroWatch::run(const rendezvous::StoreServer& server, std::string host, int port, std::string token,
                                std::string prefix, int world_size, std::chrono::milliseconds heartbeat_timeout,
                                std::chrono::milliseconds join_timeout) {
  const auto started = Clock::now();
  std::unique_ptr<rendezvous::StoreClient> client;
  bool warned = false;
  std::optional<Clock::time_point> first_fail;
  while (!done_) {
    std::this_thread::sleep_for(200ms);
    const auto now = Clock::now();
    std::map<std::string, std::string> reports;
    for (const auto& [k, v] : server.entries(prefix + "fail/")) reports[k] = v.value;
    if (!reports.empty() && !first_fail) first_fail = now;
    std::string why = reports.empty() ? ""
                                      : external_failure_reason(
                                            reports, static_cast<int>(Exit::COMM),
                                            std::chrono::duration_cast<std::chrono::milliseconds>(now - *first_fail));
    if (why.empty() && reports.empty()) {
      std::map<int, std::pair<std::string, std::chrono::milliseconds>> beats;
      std::map<int, std::string> hosts;
      for (const auto& [k, v] : server.entries(prefix + "hb/"))
        if (k.rfind("rank", 0) == 0)
          beats[std::atoi(k.c_str() + 4)] = {v.value,
                                             std::chrono::duration_cast<std::chrono::milliseconds>(now - v.set_at)};
      for (const auto& [k, v] : server.entries(prefix + "rankinfo/"))
        if (k.rfind("rank", 0) == 0) hosts[std::atoi(k.c_str() + 4)] = "pid " + v.value;
      why = external_watch_verdict(beats, hosts, world_size, heartbeat_timeout, now - started > join_timeout,
                                   join_timeout);
    }
    if (why.empty()) continue;
    try {
      if (!client) client = std::make_unique<rendezvous::StoreClient>(host, static_cast<uint16_t>(port), token, 2s);
      client->set(prefix + kExternalStopKey, why);
      return;
    } catch (const Error& e) {
      client.reset();  // retried on the next pass while the watch runs
      if (!std::exchange(warned, true)) log_warn("dtrain run: cannot set the job's stop key ({}): {}", why, e.what());
    }
  }
}

}  // namespace dtrain::rank
