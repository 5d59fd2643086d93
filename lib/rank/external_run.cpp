// `dtrain run` (external_run.h): one process of a job that torchrun, a Kubernetes
// operator, srun or mpirun started. Rank 0 hosts the rendezvous store at
// MASTER_ADDR:MASTER_PORT; every process joins it (waiting for late pods), heartbeats,
// and trains as a launched rank does. A failing rank reports why; rank 0 turns a failure
// or a silent rank into the stop key, and every process exits non-zero on it (or on
// losing the store), so the platform's restart policy starts a new set that resumes from
// the latest complete checkpoint.
#include "rank/external_run.h"

#include "config/train_config.h"
#include "core/check.h"
#include "core/log.h"
#include "core/net_address.h"
#include "device/device.h"
#include "launch/job.h"
#include "launch/local_rank_group.h"
#include "launch/node_command.h"
#include "launch/run_dir.h"
#include "launch/run_files.h"
#include "launch/rank_device.h"
#include "launch/rank_watch.h"
#include "rank/external.h"
#include "rank/external_join.h"
#include "rank/rank_context.h"
#include "rank/train_rank.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/store.h"
#include "report/status.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

namespace dtrain::rank {

namespace {

using namespace std::chrono_literals;

void die(const ProcessExit& exit_now, const std::string& why) {
  std::fprintf(stderr, "dtrain: error: %s\n", why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  exit_now(static_cast<int>(Exit::COMM));
}

std::string fail_key(int rank) { return fmt::format("fail/rank{}", rank); }
// Every rank's verdict for training.device (its own GPU), agreed through the store.
// `timeout` covers the ranks still joining (rank 0's watch stops the job, naming those
// that never do, join_timeout after it started).
device::Kind device_agree(RankContext& ctx, const std::string& choice, const std::string& host,
                          std::chrono::milliseconds timeout) {
  launch::NodeDeviceVerdict mine =
      launch::node_device_verdict(choice, choice == "cpu" ? 0 : device::cuda_count(), {ctx.local_rank}, host);
  ctx.round_store->set(fmt::format("device/rank{}", ctx.rank), launch::device_verdict_value(mine, host));
  std::vector<std::pair<std::string, launch::NodeDeviceVerdict>> all;
  for (int r = 0; r < ctx.world_size; ++r)
    all.push_back(launch::device_verdict_parse(ctx.round_store->get(fmt::format("device/rank{}", r), timeout),
                                               fmt::format("rank {}", r)));
  launch::NodeDeviceVerdict job = launch::rank_device_agree(all);
  DT_ENFORCE(job.problem.empty(), ConfigError, "{}", job.problem);
  return device::kind_parse(job.device, "the device the ranks agreed on");
}

config::TrainConfig load_config(const ExternalOptions& o) {
  config::LoadedConfig loaded = config::config_load_or_default(o.config, o.sets);
  for (const auto& w : loaded.warnings) log_warn("{}", w);
  config::TrainConfig cfg = std::move(loaded.cfg);
  if (!o.output_dir.empty()) cfg.training.output_dir = o.output_dir;
  config::config_check_job(cfg);
  // Every process refuses a system path (rank 0 also refuses a directory of someone
  // else's when it creates the run directory).
  launch::run_dir_check_safe(std::filesystem::absolute(cfg.training.output_dir).string(),
                             o.output_dir.empty() ? "training.output_dir" : "--output-dir");
  return cfg;
}

// The signal that asked a --nproc-per-node process to stop (0 = none). Its local ranks
// run in process groups of their own (a terminal's Ctrl-C or a scheduler's SIGTERM to
// this process does not reach them), so it stops them itself before it goes: otherwise
// they would sit in the join or train on until their own timeouts.
std::atomic<int> g_node_signal{0};
extern "C" void on_node_signal(int sig) { g_node_signal = sig; }

// --nproc-per-node: this process stands for its node and spawns the local ranks, each a
// `dtrain run` under torchrun's variables; the first one to fail stops the others, and
// SIGINT, SIGTERM or SIGHUP stops them all (exit 128 + the signal, as the default action
// would report it).
int run_node(const ExternalOptions& o, const ExternalPlacement& node, const std::string& master_addr, int master_port) {
  const std::map<std::string, std::string> base = launch::environ_map();
  std::vector<std::string> argv = {launch::self_exe_path(), "run"};
  if (!o.config.empty()) argv.insert(argv.end(), {"--config", o.config});
  for (const auto& s : o.sets) argv.insert(argv.end(), {"--set", s});
  if (!o.output_dir.empty()) argv.insert(argv.end(), {"--output-dir", o.output_dir});
  log_info("dtrain run: node {} of {} from {} ({}): starting {} local rank(s)", node.rank, node.world_size,
           node.launcher, node.evidence, o.nproc_per_node);
  std::vector<launch::LocalRankSpec> specs;
  for (int i = 0; i < o.nproc_per_node; ++i) {
    launch::LocalRankSpec r;
    r.argv = argv;
    r.env = external_local_rank_env(base, node, o.nproc_per_node, i, master_addr, master_port);
    r.prefix = fmt::format("[rank{}] ", r.env.at("RANK"));
    r.env_mode = launch::EnvMode::REPLACE;
    specs.push_back(std::move(r));
  }
  struct sigaction sa {};
  sa.sa_handler = on_node_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  launch::LocalRankGroup ranks(std::move(specs), 5000ms);
  for (;;) {
    if (const int sig = g_node_signal.load()) {
      log_error("dtrain run: node {} got {}: stopping its {} local rank(s)", node.rank, ::strsignal(sig), ranks.size());
      ranks.stop();
      return 128 + sig;
    }
    const launch::LocalRankGroupStatus g = ranks.poll();
    if (g.state == launch::LocalRankGroupStatus::State::SUCCEEDED) return 0;
    if (g.state == launch::LocalRankGroupStatus::State::FAILED) {
      log_error("local rank {} {}: stopping the others", ranks.rank(static_cast<size_t>(g.local_rank)).where(),
                g.exit.describe());
      ranks.stop();
      return g.exit_code;
    }
    std::this_thread::sleep_for(50ms);
  }
}

// Where rank 0's store is: the platform's MASTER_ADDR / MASTER_PORT, else the config's
// fixed cluster.rendezvous address and port.
struct StoreTarget {
  std::string addr;
  int port = 0;
};

StoreTarget store_target(const config::TrainConfig& cfg, const ExternalPlacement& p) {
  std::string master_addr = p.master_addr;
  if (master_addr.empty() && cfg.cluster.rendezvous.address != "auto") master_addr = cfg.cluster.rendezvous.address;
  DT_ENFORCE(!master_addr.empty(), UsageError,
             "dtrain run under {}: no store address: set MASTER_ADDR (the host of rank 0) or "
             "cluster.rendezvous.address in {}",
             p.launcher, cfg.source);
  const int master_port = p.master_port ? p.master_port : static_cast<int>(cfg.cluster.rendezvous.port);
  DT_ENFORCE(master_port > 0, UsageError,
             "dtrain run under {}: no store port: set MASTER_PORT or a fixed cluster.rendezvous.port in {} (0 = "
             "ephemeral cannot be known to the other processes)",
             p.launcher, cfg.source);
  // Processes on other nodes dial their own loopback: said now, not after join_timeout.
  if (address_is_loopback(master_addr) && p.nnodes > 1)
    log_warn(
        "dtrain run: the store address {} is a loopback address, but {} places this job's ranks on {} nodes: "
        "processes on the other nodes dial their own loopback and cannot reach rank 0's store unless every "
        "node is this machine; set MASTER_ADDR (or cluster.rendezvous.address) to rank 0's host",
        master_addr, p.launcher, p.nnodes);
  return {master_addr, master_port};
}

RankContext external_context(const ExternalPlacement& p, const StoreTarget& store, const std::string& token,
                             const config::TrainConfig& cfg) {
  RankContext ctx;
  ctx.rank = p.rank;
  ctx.world_size = p.world_size;
  ctx.local_rank = p.local_rank;
  ctx.local_world_size = p.local_world_size;
  ctx.node_rank = std::min(p.node_rank, p.nnodes - 1);
  ctx.nnodes = p.nnodes;
  ctx.master_addr = store.addr;
  ctx.master_port = store.port;
  ctx.job_id = external_job_id(p.run_id);
  ctx.round = 0;
  ctx.run_dir = std::filesystem::absolute(cfg.training.output_dir).string();
  ctx.mode = "train";
  ctx.token = token;
  return ctx;
}

// Rank 0 hosts the store; every process waits for it, connects and claims its rank.
// Returns rank 0's server (null for the others).
std::unique_ptr<rendezvous::StoreServer> store_join(RankContext& ctx, const std::string& host,
                                                    std::chrono::milliseconds join_timeout) {
  std::unique_ptr<rendezvous::StoreServer> server;
  std::string cannot_host;  // rank 0: why it cannot host the store, when this job's store holds the port
  if (ctx.rank == 0) {
    try {
      server = external_store_host(ctx.master_addr, ctx.master_port, ctx.token);
    } catch (const CommError& e) {
      // The port may be held by this job's own store: a second rank 0 on this host. It
      // joins that store instead, where the claim below refuses it naming both processes
      // (and stops the set, as for a second rank 0 on another node). Anything else on the
      // port does not take this job's token: that error stands.
      if (!external_store_answers(ctx.master_addr, ctx.master_port, ctx.token)) throw;
      cannot_host = e.what();
    }
  }
  // Wait for rank 0's store (late pods, DNS not yet there), then connect as a rank does.
  external_store_wait(ctx.master_addr, ctx.master_port, ctx.token, join_timeout);
  rank_context_connect(ctx, 30s);
  // Claim this rank before touching the run directory: a second process with this rank
  // (a second rank 0 on another node reaches the first one's store) is refused here, and
  // records nothing in the first one's run.
  const std::string who = fmt::format("{} (pid {})", host, ::getpid());
  external_join_claim(*ctx.round_store, ctx.rank, who, kExternalStopKey, join_timeout);
  // Claimed first, yet the port is this job's store's: the other rank 0 is refused by its
  // own claim, and this one cannot host the store.
  if (ctx.rank == 0 && !server) DT_THROW(CommError, "{}", cannot_host);
  log_info("dtrain run: rank {} joined the job's store at {} as {}", ctx.rank, ctx.store->endpoint(), who);
  return server;
}

// Rank 0's hold on the run directory for this process's life, and its record of the round.
struct RunRecord {
  std::optional<launch::RunDirLock> lock;
  std::unique_ptr<launch::RunFiles> files;
  int round = 0;
  std::atomic<bool> recorded{false};  // one failure event per round, whoever sees it first

  void failure(const std::string& why, int code) {
    if (files && !recorded.exchange(true))
      files->event({.kind = report::EventKind::FAILURE, .round = round, .why = why, .exit_code = code});
  }
};

void rank_zero_run_dir(RunRecord& rec, const RankContext& ctx, const config::TrainConfig& cfg,
                       const ExternalPlacement& p) {
  // The run directory (shared by every process) records the config this set runs,
  // as under dtrain launch; the checkpoints carry their own copy.
  const mode_t mode = launch::run_dir_mode_parse(cfg.training.run_dir_mode);
  // The launcher's lock, for this process's life: a `dtrain launch` or another set's
  // rank 0 on the same directory is refused here, before anything is written into it
  // (an existing directory is adopted, its mode or marker touched, only under the lock).
  std::string stale;
  rec.lock.emplace(launch::run_dir_create_locked(ctx.run_dir, mode, &stale));
  if (!stale.empty()) log_warn("{}", stale);
  // A save that a crash or a full disk interrupted in an earlier set left
  // checkpoints/tmp-step<k>/ (no launcher removes it between sets, as between rounds):
  // it goes before any rank trains, as it may hold the space the next save needs. No
  // rank of this set saves before it joined rank 0's device agreement.
  launch::run_dir_remove_partial_checkpoints(ctx.run_dir);
  launch::run_dir_write_file((std::filesystem::path(ctx.run_dir) / "config.yaml").string(), config::config_to_yaml(cfg),
                             mode);
  // The run's record for `dtrain status`: this round, who started it, and how it ends.
  rec.files = std::make_unique<launch::RunFiles>(ctx.run_dir);
  for (const report::Event& ev : report::status_external_round_start(ctx.run_dir, p.world_size, p.launcher)) {
    rec.files->event(ev);
    rec.round = ev.round;
  }
}

// Rank 0 keeps the store up until every rank has said it exited (bounded: 30 s).
void rank_zero_wait_exits(const rendezvous::StoreServer& server, const RankContext& ctx, int world_size) {
  for (int i = 0; i < 300; ++i) {
    int exited = 0;
    for (const auto& [k, v] : server.entries(ctx.round_store->prefix() + "hb/"))
      if (k.rfind("rank", 0) == 0 && v.value == launch::kRankBeatExited) ++exited;
    if (exited >= world_size) break;
    std::this_thread::sleep_for(100ms);
  }
}

// What dtrain launch passes its ranks through the agent: the configured environment
// (cluster.env.set, never over what the platform set) and the network interface; and the
// launcher's umask.
void process_env_prepare(const config::TrainConfig& cfg) {
  for (const auto& [k, v] : cfg.cluster.env.set) ::setenv(k.c_str(), v.c_str(), 0);
  if (!cfg.cluster.network_interface.empty())
    ::setenv("DTRAIN_NETWORK_INTERFACE", cfg.cluster.network_interface.c_str(), 0);

  // Everything this process creates in the run directory (events, metrics, TensorBoard,
  // final/) is as private as training.run_dir_mode, as under dtrain launch, whose ranks
  // inherit the launcher's umask: an adopted directory (a shared 1777 one) keeps its own
  // mode, so the files must not rely on it.
  ::umask(~launch::run_dir_mode_parse(cfg.training.run_dir_mode) & 0777);
}

// A rank's failure, told before it propagates: its fail key; rank 0, whose store goes
// with it, records it and sets the stop key, then gives the others a moment to read it.
void rank_failure_announce(const RankContext& ctx, const ExternalPlacement& p, const std::string& host, const Error& e,
                           rendezvous::StoreServer* server, RunRecord& rec) {
  try {
    ctx.round_store->set(fail_key(p.rank), fmt::format("{} rank {} on {} failed: {}", static_cast<int>(e.exit_code()),
                                                       p.rank, host, e.what()));
  } catch (const Error&) {
  }
  if (server) {  // rank 0's store goes with it: tell the others first
    const std::string why = fmt::format("rank 0 on {} failed: {}", host, e.what());
    rec.failure(why, static_cast<int>(e.exit_code()));
    try {
      ctx.round_store->set(kExternalStopKey, why);
    } catch (const Error&) {
    }
    for (int i = 0; i < 30 && server->connection_count() > 4; ++i) std::this_thread::sleep_for(100ms);
  }
}

}  // namespace

int external_run(const ExternalOptions& o, const ProcessExit& exit_now) {
  ::signal(SIGPIPE, SIG_IGN);
  config::TrainConfig cfg = load_config(o);
  const std::map<std::string, std::string> env = launch::environ_map();
  const ExternalPlacement p = external_placement(env);
  const StoreTarget store = store_target(cfg, p);
  const std::string token =
      external_token(cfg.cluster.rendezvous.token_file, cfg.cluster.rendezvous.token_env, env, cfg.source);
  if (o.nproc_per_node > 0) return run_node(o, external_node(p, env), store.addr, store.port);

  const std::string host = host_name();
  set_error_context(fmt::format("host={} rank={}", host, p.rank));
  const auto hb_interval = launch::seconds_ms(cfg.fault_tolerance.heartbeat_interval);
  const auto hb_timeout = launch::seconds_ms(cfg.fault_tolerance.heartbeat_timeout);
  const auto join_timeout = launch::seconds_ms(cfg.cluster.rendezvous.join_timeout);
  log_info("dtrain run: rank {} of {} (local rank {} of {}, node {}) placed by {} ({}); store {}:{}", p.rank,
           p.world_size, p.local_rank, p.local_world_size, p.node_rank, p.launcher, p.evidence, store.addr, store.port);
  RankContext ctx = external_context(p, store, token, cfg);

  process_env_prepare(cfg);

  RunRecord rec;  // rank 0 only
  std::unique_ptr<rendezvous::StoreServer> server = store_join(ctx, host, join_timeout);
  const std::string config_text = external_config_text(cfg);
  if (p.rank == 0) {
    external_config_publish(*ctx.round_store, config_text);
    rank_zero_run_dir(rec, ctx, cfg, p);
  }
  // Ranks split the node's cores, as under dtrain launch.
  for (const auto& [k, v] : launch::rank_thread_env(p.local_world_size)) ::setenv(k.c_str(), v.c_str(), 0);

  auto hb = rank_heartbeat_start(ctx, hb_interval);
  std::unique_ptr<ExternalRankZeroWatch> zero_watch;
  if (server)
    zero_watch = std::make_unique<ExternalRankZeroWatch>(*server, ctx, p.world_size, hb_timeout, join_timeout);
  ExternalStopWatch stop_watch(ctx, hb_timeout, server.get(), [&](const std::string& why) {
    rec.failure(why, static_cast<int>(Exit::COMM));
    die(exit_now, why);
  });
  int rc = 0;
  try {
    // Bounded by twice join_timeout: a rank may have started up to join_timeout before
    // rank 0, whose watch names the ranks that never join join_timeout after it started.
    if (p.rank != 0) external_config_check(*ctx.round_store, config_text, p.rank, 2 * join_timeout);
    const device::Kind device = device_agree(ctx, cfg.training.device, host, 2 * join_timeout);
    if (p.rank == 0)
      log_info("dtrain run: {} rank(s) train on {}, collectives: {}", p.world_size, device::kind_name(device),
               launch::rank_backend_name(device::kind_name(device), p.world_size));
    rc = train_rank(ctx, *hb, cfg, device);
  } catch (const Error& e) {
    rank_failure_announce(ctx, p, host, e, server.get(), rec);
    throw;
  }
  stop_watch.disarm();
  hb->finish(launch::kRankBeatExited);
  if (rec.files) rec.files->event({.kind = report::EventKind::FINISHED, .round = rec.round});
  if (server) {
    zero_watch.reset();
    rank_zero_wait_exits(*server, ctx, p.world_size);
  }
  return rc;
}

}  // namespace dtrain::rank
