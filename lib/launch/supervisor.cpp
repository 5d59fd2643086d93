// Supervisor: rounds of agents under one rendezvous store; first failure stops all.
#include "launch/supervisor.h"

#include "core/check.h"
#include "core/log.h"
#include "core/net_address.h"
#include "launch/agent.h"
#include "launch/host_probe.h"
#include "launch/membership.h"
#include "launch/output_router.h"
#include "config/train_config.h"
#include "launch/local_spawner.h"
#include "launch/rank_device.h"
#include "launch/slurm.h"
#include "launch/ssh_spawner.h"
#include "launch/run_dir.h"
#include "launch/run_files.h"
#include "launch/rank_watch.h"
#include "launch/resource_view.h"
#include "launch/round.h"
#include "rendezvous/store.h"
#include "report/event.h"
#include "report/status.h"
#include "report/resource_status.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <unistd.h>

namespace fs = std::filesystem;

namespace dtrain::launch {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The least time a node's agent gets, beyond the SSH connect, to send its first heartbeat.
constexpr std::chrono::milliseconds kFirstBeatFloor = 30s;

// " (its agent said: ...)" when the agent printed a warning or error, else "".
std::string agent_said_suffix(const std::string& said) {
  return said.empty() ? std::string() : fmt::format(" (its agent said: {})", said);
}

// Why node k's agent ended unsuccessfully: the agent's own account of the failing rank
// (store key fail/node<k>, given a moment to land), prefixed with the node and host.
NodeFailure agent_failure(const Job& job, rendezvous::StoreClient& store, const std::string& prefix, int k,
                          const ExitStatus& st, const std::string& agent_said) {
  std::string detail;
  try {
    if (store.wait({prefix + agent_failure_key(k)}, 500ms)) detail = store.get(prefix + agent_failure_key(k), 100ms);
  } catch (const Error&) {
  }
  std::string host = job.plan.nodes[k].host.destination();
  if (detail.empty()) detail = fmt::format("the agent {}{}", st.describe(), agent_said_suffix(agent_said));
  return {.kind = NodeFailure::Kind::AGENT_EXIT,
          .node = k,
          .why = fmt::format("node {} ({}): {}", k, host, detail),
          .exit_code = agent_exit_code(st)};
}

// "interrupted by SIGHUP (...)": what stopped the launcher, for the terminal and events.jsonl.
std::string interrupt_why(int sig) {
  switch (sig) {
    case SIGINT: return "interrupted by SIGINT (Ctrl-C)";
    case SIGTERM: return "interrupted by SIGTERM";
    case SIGHUP: return "interrupted by SIGHUP (the terminal or login session that started the launcher closed)";
    default: return fmt::format("interrupted by signal {}", sig);
  }
}

// nodes.json for `dtrain status`; a failure to write it is reported once, not fatal.
void write_nodes(const Job& job, RunFiles& files, int round, std::vector<report::NodeHealth> health) {
  for (auto& h : health)
    if (h.node >= 0 && h.node < static_cast<int>(job.plan.nodes.size())) {
      h.first_rank = job.plan.nodes[static_cast<size_t>(h.node)].first_rank;
      h.num_ranks = static_cast<int>(job.plan.nodes[static_cast<size_t>(h.node)].ranks.size());
    }
  const auto& ft = job.cfg.fault_tolerance;
  files.attempt((fs::path(job.run_dir) / "nodes.json").string(), [&] {
    report::status_write_nodes(job.run_dir, round, health, ft.straggler_factor, static_cast<int>(ft.straggler_window));
  });
}

// The end of supervise: what could not be recorded, said where the user sees it.
int finish(RunFiles& files, int rc) {
  files.flush_events();
  if (const size_t n = files.events_pending(); n > 0)
    log_error(
        "{} event(s) (the job's end among them) could not be written to events.jsonl, so `dtrain status` "
        "cannot tell how the job ended: {}",
        n, files.failing());
  else if (std::string f = files.failing(); !f.empty())
    log_warn("some run directory files could not be fully written: {}", f);
  return rc;
}

// While a round of an elastic job runs, the hosts left out are probed every
// elastic.probe_interval; once one passes, the ranks are asked (store key) to stop at
// their next checkpoint so the next round can take it back.
class RejoinProber {
 public:
  RejoinProber(HostProbe* probe, const Membership& m, double interval_s, rendezvous::StoreClient& store,
               std::string grow_key)
      : store_(store), key_(std::move(grow_key)) {
    if (!probe || !m.elastic()) return;
    std::vector<config::HostEntry> hosts;
    for (int i : m.rejoin_candidates()) hosts.push_back(m.hostfile().hosts[static_cast<size_t>(i)]);
    if (hosts.empty()) return;
    thread_ = std::thread([this, probe, hosts, interval = seconds_ms(interval_s)] {
      while (true) {
        {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_for(lock, interval, [&] { return stop_; })) return;
        }
        auto res = host_probe_all(*probe, hosts);
        for (size_t i = 0; i < res.size(); ++i)
          if (res[i].ok) {
            try {
              store_.set(key_, "1");
            } catch (const Error&) {
              continue;  // the store is going away with the round: the next round probes anyway
            }
            std::lock_guard<std::mutex> lock(mu_);
            asked_ = hosts[i].destination();
            return;
          }
      }
    });
  }
  ~RejoinProber() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // The host whose passing probe asked the ranks to stop ("" = none yet).
  std::string asked() {
    std::lock_guard<std::mutex> lock(mu_);
    return asked_;
  }

 private:
  rendezvous::StoreClient& store_;
  std::string key_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string asked_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// One round: start the agents, watch (observe, then round_watch decides), stop.

// The round's agents, started in parallel; `failure` names the first node that could not
// be started (the round then stops at once).
struct RoundAgents {
  std::vector<std::unique_ptr<Process>> agents;
  std::optional<NodeFailure> failure;
};

RoundAgents round_start_agents(const Job& job, const std::string& token, const SupervisorOptions& opts,
                               OutputRouter& out) {
  const auto env = environ_map();
  const int n = static_cast<int>(job.plan.nodes.size());
  RoundAgents r;
  r.agents.resize(static_cast<size_t>(n));
  std::vector<std::string> spawn_errors(n);
  std::vector<char> spawn_permanent(n, 0);
  {
    // Sessions open in parallel: a slow or dead host does not delay the others.
    std::vector<std::thread> starters;
    for (int k = 0; k < n; ++k) {
      starters.emplace_back([&, k] {
        try {
          NodeCommand cmd = node_command_build(job.plan, k, job.spec, env);
          r.agents[k] = opts.spawner(job.plan.nodes[k], cmd, agent_stdin_payload(token, cmd.secret_env),
                                     [&out, k](Stream s, std::string_view line) { out.line(k, s, line); });
        } catch (const SshRefusedError& e) {
          spawn_errors[k] = e.what();
          spawn_permanent[k] = 1;
        } catch (const Error& e) {
          spawn_errors[k] = e.what();
        }
      });
    }
    for (auto& t : starters) t.join();
  }
  for (int k = 0; k < n && !r.failure; ++k)
    if (!spawn_errors[k].empty())
      r.failure = NodeFailure{.kind = NodeFailure::Kind::SPAWN,
                              .node = k,
                              .why = fmt::format("could not start node {} ({}): {}", k,
                                                 job.plan.nodes[k].host.destination(), spawn_errors[k]),
                              .exit_code = static_cast<int>(Exit::LAUNCH),
                              .permanent = spawn_permanent[k] != 0};
  return r;
}

// The watch's verdict as the round's failure, with the words the user reads.
NodeFailure round_failure(const Job& job, const RoundVerdict& v, rendezvous::StoreClient& store,
                          const std::string& prefix, OutputRouter& out, const RankWatchLimits& limits,
                          std::chrono::milliseconds first_beat_grace) {
  const int k = v.node.value_or(0);
  const std::string host = v.node ? job.plan.nodes[static_cast<size_t>(k)].host.destination() : "";
  switch (v.kind) {
    case RoundVerdict::Kind::INTERRUPTED:
      return {.kind = NodeFailure::Kind::INTERRUPT,
              .why = interrupt_why(v.signal),
              .exit_code = static_cast<int>(Exit::INTERRUPTED)};
    case RoundVerdict::Kind::AGENT_EXIT: return agent_failure(job, store, prefix, k, v.exit, out.agent_said(k));
    case RoundVerdict::Kind::NO_FIRST_BEAT:
      return {.kind = NodeFailure::Kind::HEARTBEAT,
              .node = k,
              .why = fmt::format("node {} ({}) sent no heartbeat within {:.0f} s of its start{}", k, host,
                                 std::chrono::duration<double>(first_beat_grace).count(),
                                 agent_said_suffix(out.agent_said(k))),
              .exit_code = static_cast<int>(Exit::LAUNCH)};
    case RoundVerdict::Kind::MISSED_BEATS:
      return {.kind = NodeFailure::Kind::HEARTBEAT,
              .node = k,
              .why = fmt::format("node {} ({}) missed heartbeats for {:.1f} s (heartbeat_timeout {} s)", k, host,
                                 v.silent_s, job.cfg.fault_tolerance.heartbeat_timeout),
              .exit_code = static_cast<int>(Exit::LAUNCH)};
    case RoundVerdict::Kind::RANK_HUNG:
      return {.kind = NodeFailure::Kind::RANK_HUNG,
              .node = k,
              .why = v.hang->describe(limits),
              .exit_code = static_cast<int>(Exit::HUNG),
              .hang = v.hang};
    case RoundVerdict::Kind::WATCH:
    case RoundVerdict::Kind::SUCCEEDED: break;
  }
  DT_THROW(InternalError, "round_failure: the verdict is not a failure");
}

// Stops every node: the stop key reaches agents that still talk to the store; closing
// the sessions (stdin EOF / SIGTERM) reaches the rest. Then nodes.json says how each ended.
void round_stop(const Job& job, std::vector<std::unique_ptr<Process>>& agents, const std::vector<bool>& done,
                const std::optional<NodeFailure>& fail, rendezvous::StoreClient& store, const std::string& prefix,
                RunFiles& files) {
  try {
    store.set(prefix + kStopKey, "1");
  } catch (const Error&) {
  }
  const int n = static_cast<int>(agents.size());
  const std::optional<int> blamed = fail ? fail->node : std::nullopt;
  std::vector<std::thread> stoppers;
  for (int k = 0; k < n; ++k)
    if (agents[k] && agents[k]->running())
      stoppers.emplace_back([&, k] {
        // A node that stopped answering cannot stop anything: drop its session now (its
        // agent stops its ranks when its stdin closes or the store vanishes).
        if (blamed == k && fail->kind == NodeFailure::Kind::HEARTBEAT) {
          agents[k]->terminate(1000ms);
          return;
        }
        // Agents stop their ranks within their own grace; give them that plus margin.
        if (!agents[k]->wait_for(3000ms)) agents[k]->terminate(8000ms);
      });
  for (auto& t : stoppers) t.join();
  std::vector<report::NodeHealth> health;
  for (int k = 0; k < n; ++k)
    health.push_back({k, job.plan.nodes[k].host.destination(), -1.0,
                      blamed == k ? "failed"
                      : done[k]   ? "done"
                                  : "stopped"});
  write_nodes(job, files, job.spec.round, health);
}

// The watch's limits from fault_tolerance and the SSH connect timeout.
RoundWatchLimits round_watch_limits(const Job& job) {
  RoundWatchLimits watch_limits;
  watch_limits.heartbeat_timeout = seconds_ms(job.cfg.fault_tolerance.heartbeat_timeout);
  // Grace before the first heartbeat: SSH connect plus agent start.
  // Grace before the first heartbeat: SSH connect plus process start, which is not a
  // heartbeat interval: a binary and its libraries loaded from a cold shared filesystem,
  // or a node under load, take tens of seconds (a CI run at load ~10 once took over 15 s).
  // A short heartbeat_timeout is for noticing a running node that went silent.
  watch_limits.first_beat_grace = seconds_ms(job.cfg.cluster.ssh.connect_timeout) +
                                  std::max<std::chrono::milliseconds>(watch_limits.heartbeat_timeout, kFirstBeatFloor);
  return watch_limits;
}

RankWatchLimits rank_watch_limits(const Job& job, const RoundWatchLimits& watch_limits) {
  const auto& ft = job.cfg.fault_tolerance;
  RankWatchLimits limits;
  limits.heartbeat_interval = seconds_ms(ft.heartbeat_interval);
  limits.heartbeat_timeout = watch_limits.heartbeat_timeout;
  limits.step_timeout = seconds_ms(ft.step_timeout);
  limits.first_beat_grace = watch_limits.first_beat_grace;
  return limits;
}

// Observe: a signal, the agents' exits, heartbeats (server clock), the ranks.
void round_observe(RoundObservation& obs, std::vector<bool>& done, const std::vector<std::unique_ptr<Process>>& agents,
                   const rendezvous::StoreServer& server, const std::string& prefix, RankWatch& rank_watch,
                   const SupervisorOptions& opts) {
  const int n = static_cast<int>(agents.size());
  obs.now = Clock::now();
  obs.interrupted = opts.interrupted ? opts.interrupted->load() : 0;
  for (int k = 0; k < n; ++k) {
    NodeObservation& o = obs.nodes[static_cast<size_t>(k)];
    if (!o.exit && (o.exit = agents[k]->wait_for(0ms))) o.exit_seen_at = obs.now;
    done[k] = o.exit && o.exit->success();
  }
  const auto beats = server.heartbeats(prefix + "hb/");
  for (int k = 0; k < n; ++k) {
    auto it = beats.find(fmt::format("node{}", k));
    obs.nodes[static_cast<size_t>(k)].last_beat =
        it == beats.end() ? std::nullopt : std::optional<Clock::time_point>(it->second);
  }
  obs.rank_hang = rank_watch.check(rank_watch_snapshot(server, prefix), obs.now, done);
}

// Every agent succeeded: the round's last events, nodes.json, and whether the ranks
// stopped at a checkpoint because a host passed the probe again (RESIZED).
RoundResult round_succeeded(const Job& job, rendezvous::StoreClient& store, const std::string& prefix,
                            const SupervisorOptions& opts, OutputRouter& out, RunFiles& files,
                            ResourceView& resource_view, RejoinProber* rejoin) {
  const int n = static_cast<int>(job.plan.nodes.size());
  RoundResult result;
  if (opts.on_started && out.take_started(true)) opts.on_started();
  for (auto& ev : out.take_events()) files.event(ev);
  for (const auto& ev : resource_view.drain()) files.event(ev);
  std::vector<report::NodeHealth> health;
  for (int k = 0; k < n; ++k) health.push_back({k, job.plan.nodes[k].host.destination(), -1.0, "done"});
  write_nodes(job, files, job.spec.round, health);
  // Ranks that stopped at a checkpoint because a host passed the probe again.
  try {
    if (store.check({prefix + kElasticStoppedKey})) {
      result.end = RoundEnd::RESIZED;
      result.resized_at_step = std::atoll(store.get(prefix + kElasticStoppedKey, 1000ms).c_str());
      result.resized_for = rejoin ? rejoin->asked() : "";
    }
  } catch (const Error&) {
  }
  return result;
}

// The live view's resource lines and the alerts raised from them, with their events.
void round_show_resources(const ResourceView::Update& seen, OutputRouter& out, RunFiles& files) {
  if (seen.lines.empty() && seen.copied.empty()) return;
  out.resource_lines(seen.lines);
  for (const auto& ev : seen.copied) files.event(ev);
  for (const auto& ev : seen.raised) {
    out.resource_alert(ev);
    files.event(ev);
  }
}

// For `dtrain status`: each node's last heartbeat age and state.
void write_nodes_running(const Job& job, RunFiles& files, const RoundObservation& obs, const std::vector<bool>& done) {
  std::vector<report::NodeHealth> health;
  for (int k = 0; k < static_cast<int>(obs.nodes.size()); ++k) {
    const auto& beat = obs.nodes[static_cast<size_t>(k)].last_beat;
    const double age = beat ? std::chrono::duration<double>(obs.now - *beat).count() : -1.0;
    health.push_back({k, job.plan.nodes[k].host.destination(), age, done[k] ? "done" : beat ? "running" : "starting"});
  }
  write_nodes(job, files, job.spec.round, health);
}

RoundResult run_round(Job& job, rendezvous::StoreServer& server, rendezvous::StoreClient& store,
                      const std::string& token, const SupervisorOptions& opts, OutputRouter& out, RunFiles& files,
                      HostProbe* probe, const Membership& members) {
  const RoundWatchLimits watch_limits = round_watch_limits(job);
  const int round = job.spec.round;
  const std::string prefix = rendezvous::store_prefix(job.spec.job_id, round);
  const int n = static_cast<int>(job.plan.nodes.size());

  // The live view's resource lines and network_idle: the records the ranks' monitors
  // append to their files from now on (before the agents start: what the files hold is
  // earlier rounds'), at most once per monitor.interval (and per second).
  ResourceView resource_view(job.run_dir, job.cfg.monitor, job.plan, round);
  RoundAgents started_agents = round_start_agents(job, token, opts, out);
  auto& agents = started_agents.agents;
  std::optional<NodeFailure> fail = std::move(started_agents.failure);

  const RankWatchLimits limits = rank_watch_limits(job, watch_limits);
  RankWatch rank_watch(job.plan, limits);
  std::optional<RejoinProber> rejoin;
  if (!fail) rejoin.emplace(probe, members, job.cfg.elastic.probe_interval, store, prefix + kElasticGrowKey);
  std::string rejoin_logged;

  RoundObservation obs;
  obs.started = Clock::now();
  obs.nodes.resize(static_cast<size_t>(n));
  auto last_nodes_write = obs.started - 10s;
  std::vector<bool> done(n, false);
  while (!fail) {
    round_observe(obs, done, agents, server, prefix, rank_watch, opts);
    const RoundVerdict v = round_watch(obs, watch_limits);
    if (v.kind == RoundVerdict::Kind::SUCCEEDED)
      return round_succeeded(job, store, prefix, opts, out, files, resource_view, rejoin ? &*rejoin : nullptr);
    if (v.kind != RoundVerdict::Kind::WATCH) {
      fail = round_failure(job, v, store, prefix, out, limits, watch_limits.first_beat_grace);
      break;
    }
    if (opts.on_started && out.take_started()) opts.on_started();
    for (auto& ev : out.take_events()) files.event(ev);
    if (rejoin && rejoin_logged.empty() && !(rejoin_logged = rejoin->asked()).empty())
      log_info("{} passed the probe again: the ranks stop at their next checkpoint and the job regrows", rejoin_logged);
    round_show_resources(resource_view.poll(obs.now), out, files);
    if (obs.now - last_nodes_write > 1000ms) {
      // Refreshed every second.
      last_nodes_write = obs.now;
      write_nodes_running(job, files, obs, done);
    }
    std::this_thread::sleep_for(50ms);
  }
  round_stop(job, agents, done, fail, store, prefix, files);
  for (const auto& ev : resource_view.drain()) files.event(ev);  // before the failure record
  RoundResult result;
  result.end = fail->kind == NodeFailure::Kind::INTERRUPT ? RoundEnd::INTERRUPTED : RoundEnd::FAILED;
  result.failure = std::move(fail);
  return result;
}

}  // namespace

namespace {

// The hosts and batch of an elastic job's next round: placement over the members, and a
// config for the ranks whose batch keeps the global batch where it divides (written as
// config.elastic.yaml when the world size differs from the full membership's). One
// "membership" event with every change and its cause. False (and *problem) when fewer
// than elastic.min_nodes hosts can run.
bool elastic_plan_round(Job& job, Membership& members, HostProbe& probe, int round, int ref_world,
                        const std::string& base_config, RunFiles& files, std::string* problem) {
  const auto probes = host_probe_all(probe, members.hostfile().hosts);
  RoundMembers rm = members.plan_round(probes);
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& c : rm.changes) {
    changes.push_back({{"host", c.name}, {"change", c.joined ? "joined" : "left"}, {"cause", c.cause}});
    if (c.joined && c.cause == "initial membership") continue;
    if (c.joined) log_info("membership: {} joins round {}: {}", c.name, round, c.cause);
    else log_warn("membership: {} is left out of round {}: {}", c.name, round, c.cause);
  }
  if (!rm.problem.empty()) {
    *problem = rm.problem;
    files.event({.kind = report::EventKind::MEMBERSHIP,
                 .round = round,
                 .detail = {{"changes", changes}, {"hosts", nlohmann::json::array()}, {"problem", rm.problem}}});
    return false;
  }
  const config::Hostfile hf = members.hostfile_of(rm.hosts);
  const int port = job.plan.master_port;
  job.plan = plan_placement(hf, job.plan.master_addr, port);
  const bool train = job.spec.mode == "train";  // a benchmark has no batch to keep
  config::ElasticBatch b;
  if (train) b = config::config_elastic_batch(job.cfg, ref_world, job.plan.world_size);
  else b.note = "no batch (benchmark)";
  job.spec.config_path = base_config;
  if (train && job.plan.world_size != ref_world) {
    const std::string path = (fs::path(job.run_dir) / "config.elastic.yaml").string();
    run_dir_write_file(path, config::config_to_yaml(b.cfg), run_dir_mode_parse(job.cfg.training.run_dir_mode));
    job.spec.config_path = path;
  }
  nlohmann::json hosts = nlohmann::json::array();
  for (const auto& h : hf.hosts) hosts.push_back(h.destination());
  if (!rm.changes.empty()) {
    if (round > 0 || job.plan.world_size != ref_world)
      log_info("membership: round {} runs on {} node(s), {} rank(s); {}", round, hf.hosts.size(), job.plan.world_size,
               b.note);
    files.event({.kind = report::EventKind::MEMBERSHIP,
                 .round = round,
                 .world_size = job.plan.world_size,
                 .detail = {{"hosts", hosts},
                            {"changes", changes},
                            {"train_batch_size", b.cfg.resolved_train_batch_size},
                            {"micro_batch", b.cfg.resolved_micro_batch_size},
                            {"grad_accum", b.cfg.resolved_grad_accum_steps},
                            {"global_batch_changed", b.global_changed},
                            {"batch", b.note}}});
  }
  return true;
}

// The round's "failure" record: the node blamed (null when none) and its host, a hung
// rank's identity and silence, whether a retry follows.
report::Event failure_event(const Job& job, int round, const NodeFailure& f, bool retry) {
  report::Event ev{.kind = report::EventKind::FAILURE,
                   .round = round,
                   .node = f.node,
                   .why = f.why,
                   .exit_code = f.exit_code,
                   .retry = retry,
                   .interrupted = f.kind == NodeFailure::Kind::INTERRUPT};
  if (f.node && *f.node < static_cast<int>(job.plan.nodes.size()))
    ev.host = job.plan.nodes[static_cast<size_t>(*f.node)].host.destination();
  if (f.hang) {
    ev.host = f.hang->host;
    ev.detail = {{"hang", f.hang->kind_name()},
                 {"rank", f.hang->rank},
                 {"local_rank", f.hang->local_rank},
                 {"silent_s", f.hang->silent_s}};
    if (f.hang->pid > 0) ev.detail["pid"] = f.hang->pid;
    if (f.hang->kind == RankHang::Kind::NO_STEP) ev.detail["last_step"] = f.hang->last_step;
  }
  return ev;
}

// The probe an elastic job (--nnodes MIN:MAX) re-plans its members with before every
// round; none for a fixed job.
std::unique_ptr<HostProbe> elastic_probe(const Job& job, const Membership& members, const SupervisorOptions& opts) {
  if (!members.elastic()) return nullptr;
  const auto& el = job.cfg.elastic;
  std::unique_ptr<HostProbe> probe =
      opts.probe_factory ? opts.probe_factory(job)
                         : host_probe_version(job.cfg, job.spec.dtrain_path, seconds_ms(el.probe_timeout));
  log_info(
      "elastic: {} to {} node(s) of the {} host(s); a node is left out after failing the probe or {} round(s) "
      "in a row, and rejoins at a checkpoint once it passes the probe again",
      members.min_nodes(), members.max_nodes(), job.hosts.hosts.size(), el.max_node_failures);
  return probe;
}

// Why round `round` cannot start (no members left, a failed preflight), or nothing; an
// elastic job's plan is made over its members here.
std::optional<NodeFailure> round_blocker(Job& job, Membership& members, HostProbe* probe, int round, int ref_world,
                                         RunFiles& files, const SupervisorOptions& opts) {
  std::string no_members;
  const std::string base_config =
      (fs::path(job.run_dir) / (job.run_dir_pending ? "config.pending.yaml" : "config.yaml")).string();
  if (members.elastic() && !elastic_plan_round(job, members, *probe, round, ref_world, base_config, files, &no_members))
    return NodeFailure{.kind = NodeFailure::Kind::NOT_STARTED,
                       .why = no_members,
                       .exit_code = static_cast<int>(Exit::LAUNCH)};
  if (opts.preflight && !(members.elastic() && opts.probe_is_preflight)) {
    // (An elastic job whose probe is the preflight ran it on every host just now in
    // elastic_plan_round: the members passed it, the hosts that failed are left out.)
    PreflightVerdict v = opts.preflight(job);
    if (!v.why.empty())
      return NodeFailure{.kind = NodeFailure::Kind::NOT_STARTED,
                         .node = std::max(v.node, 0),
                         .why = "preflight: " + v.why,
                         .exit_code = static_cast<int>(Exit::LAUNCH),
                         .permanent = v.permanent};
  }
  return std::nullopt;
}

// The job's store: listening only on the address the nodes are told to dial (loopback for
// a local job), so it is not reachable from networks the job does not use.
struct JobStore {
  std::string token = rendezvous::token_generate();
  rendezvous::StoreServer server;
  rendezvous::StoreClient client;
  JobStore(const std::string& listen_addr, int port)
      : server(listen_addr, static_cast<uint16_t>(port), token), client(listen_addr, server.port(), token) {}
};

// Starts and runs one planned round, with its start event and the events its nodes sent;
// a success is logged and recorded as the job's end.
RoundResult run_recorded_round(Job& job, JobStore& js, const SupervisorOptions& opts, OutputRouter& out,
                               RunFiles& files, HostProbe* probe, const Membership& members, int round) {
  out.set_plan(job.plan, round);
  log_info("round {}: starting {} rank(s) on {} node(s), rendezvous {}", round, job.plan.world_size,
           job.plan.nodes.size(), host_port_text(job.plan.master_addr, job.plan.master_port));
  files.event({.kind = report::EventKind::ROUND_START, .round = round, .world_size = job.plan.world_size});
  auto t0 = Clock::now();
  RoundResult r = run_round(job, js.server, js.client, js.token, opts, out, files, probe, members);
  for (auto& ev : out.take_events()) files.event(ev);
  if (r.end == RoundEnd::SUCCEEDED) {
    log_info("job finished: all {} rank(s) succeeded in round {} ({:.1f} s)", job.plan.world_size, round,
             std::chrono::duration<double>(Clock::now() - t0).count());
    files.event({.kind = report::EventKind::FINISHED, .round = round});
  }
  return r;
}

void record_resize(const RoundResult& r, int round, Membership& members, RunFiles& files) {
  members.round_healthy();
  const std::string who = r.resized_for.empty() ? "a host left out" : r.resized_for;
  log_info(
      "round {} stopped after its checkpoint at step {}: {} passed the probe again, the next round takes "
      "it back",
      round, r.resized_at_step, who);
  files.event({.kind = report::EventKind::RESIZE,
               .round = round,
               .why = fmt::format("{} passed the probe again", who),
               .detail = {{"step", r.resized_at_step}}});
}

// Records a failed (or interrupted, or not started) round and decides what follows:
// the job's exit code when it ends here, nothing when a restart follows.
std::optional<int> end_after_failure(const Job& job, Membership& members, RunFiles& files, int round, RoundResult& r,
                                     int failed_rounds) {
  const auto& ft = job.cfg.fault_tolerance;
  NodeFailure& f = *r.failure;
  // A round that ran some steps before failing resets its nodes' failure streaks only
  // by succeeding; the node blamed for this one counts one more.
  if (members.elastic() && f.node && *f.node < static_cast<int>(members.members().size()))
    members.round_failed(members.members()[static_cast<size_t>(*f.node)], f.why);
  // A rank that stopped on a usage or config error fails the same way every round.
  if (f.exit_code == static_cast<int>(Exit::USAGE)) f.permanent = true;
  const bool interrupted = r.end == RoundEnd::INTERRUPTED;
  const bool retry = !interrupted && !f.permanent && failed_rounds < ft.max_retries;
  files.event(failure_event(job, round, f, retry));
  if (interrupted) {
    log_error("{}: every node stopped; continue with: dtrain resume {}", f.why, job.run_dir);
    return finish(files, f.exit_code);
  }
  log_error("round {} failed: {}; {}", round, f.why,
            f.kind == NodeFailure::Kind::NOT_STARTED ? "no node was started" : "every node stopped");
  if (f.permanent) {
    // The run's saved config.yaml is what resume reads: a config setting is fixed by
    // resume's --set (or --config), never by editing the file the job was launched with.
    log_error(
        "not restarting: retrying cannot fix this (a usage, config, host key or credential error): fix it, then "
        "dtrain resume {}; a config setting is corrected there with --set KEY=VALUE (resume reads the run's "
        "config.yaml, not the file the job was launched with)",
        job.run_dir);
    return finish(files, f.exit_code);
  }
  if (failed_rounds >= ft.max_retries) {
    log_error("giving up after {} restart(s) (fault_tolerance.max_retries = {})", failed_rounds, ft.max_retries);
    return finish(files, f.exit_code);
  }
  return std::nullopt;
}

// The retry delay after failed round `round`: the job's exit code when an interrupt ends
// it meanwhile, nothing when the next round may start.
std::optional<int> wait_to_restart(const Job& job, const SupervisorOptions& opts, RunFiles& files, int round) {
  auto until = Clock::now() + seconds_ms(job.cfg.fault_tolerance.retry_delay);
  auto next_flush = Clock::now();
  while (Clock::now() < until) {
    if (opts.interrupted && *opts.interrupted) {
      // Between rounds no node runs: nothing to stop, but the run's record says why it ended.
      const std::string why = interrupt_why(*opts.interrupted);
      files.event({.kind = report::EventKind::FAILURE,
                   .round = round,
                   .why = why + " while waiting to restart",
                   .exit_code = static_cast<int>(Exit::INTERRUPTED),
                   .interrupted = true});
      log_error("{} while waiting to restart; continue with: dtrain resume {}", why, job.run_dir);
      return finish(files, static_cast<int>(Exit::INTERRUPTED));
    }
    // Events that did not fit (a full disk) go in as soon as there is room again.
    if (Clock::now() >= next_flush && files.events_pending() > 0) {
      files.flush_events();
      next_flush = Clock::now() + 500ms;
    }
    std::this_thread::sleep_for(50ms);
  }
  return std::nullopt;
}

}  // namespace

int supervise(Job& job, const SupervisorOptions& opts) {
  DT_ENFORCE(static_cast<bool>(opts.spawner), InternalError, "supervise needs a spawner");
  JobStore js(rendezvous::store_listen_address(job.plan.master_addr, !job.all_local), job.plan.master_port);
  job_set_port(job, js.server.port());
  RunFiles files(job.run_dir);
  const auto& ft = job.cfg.fault_tolerance;
  OutputRouter out(job.run_dir, files, opts.echo, opts.tee_all, ft.straggler_factor,
                   static_cast<int>(ft.straggler_window));
  files.attempt((fs::path(job.run_dir) / "launcher.json").string(),
                [&] { report::status_write_launcher(job.run_dir, job.spec.job_id); });
  log_info("run directory: {}", job.run_dir);
  if (job.spec.mode == "train")
    for (const std::string& line : rank_device_plan_lines(job.plan, job.cfg.training.device)) log_info("{}", line);

  // Elastic membership (--nnodes MIN:MAX): job.plan is re-planned over the members
  // before every round; ref_world is the full membership's world size, the one the
  // config's batch was resolved for.
  const auto& el = job.cfg.elastic;
  Membership members(job.hosts, static_cast<int>(el.min_nodes), static_cast<int>(el.max_nodes),
                     static_cast<int>(el.max_node_failures));
  const std::unique_ptr<HostProbe> probe = elastic_probe(job, members, opts);
  const int ref_world = job.plan.world_size;

  int failed_rounds = 0;
  for (int round = 0;; ++round) {
    job.spec.round = round;
    out.set_restarts(failed_rounds);
    // A failed round may have been one that was saving a checkpoint (run_job does this
    // before round 0, before it writes anything itself).
    if (round > 0) run_dir_remove_partial_checkpoints(job.run_dir);
    const std::optional<NodeFailure> not_started =
        round_blocker(job, members, probe.get(), round, ref_world, files, opts);
    RoundResult r{.end = RoundEnd::FAILED, .failure = not_started};
    if (not_started) {
      // Recorded as a round (it uses a retry like any failed round) that no node ran in,
      // so `dtrain status` and `dtrain plot` count the restart that follows it.
      files.event({.kind = report::EventKind::ROUND_NOT_STARTED, .round = round, .why = not_started->why});
    } else {
      r = run_recorded_round(job, js, opts, out, files, probe.get(), members, round);
      if (r.end == RoundEnd::SUCCEEDED) return finish(files, 0);
      if (r.end == RoundEnd::RESIZED) {
        record_resize(r, round, members, files);
        continue;
      }
    }
    if (std::optional<int> code = end_after_failure(job, members, files, round, r, failed_rounds)) return *code;
    ++failed_rounds;
    log_info("restarting in {} s (restart {} of {})", ft.retry_delay, failed_rounds, ft.max_retries);
    if (std::optional<int> code = wait_to_restart(job, opts, files, round)) return *code;
  }
}

}  // namespace dtrain::launch
