// Supervisor: rounds of agents under one rendezvous store; first failure stops all.
#include "launch/supervisor.h"

#include "core/check.h"
#include "core/log.h"
#include "core/net_address.h"
#include "launch/agent.h"
#include "launch/local_spawner.h"
#include "launch/rank_device.h"
#include "launch/ssh_spawner.h"
#include "launch/progress.h"
#include "launch/run_dir.h"
#include "launch/run_files.h"
#include "launch/rank_watch.h"
#include "rendezvous/store.h"
#include "report/status.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <unistd.h>

namespace fs = std::filesystem;

namespace dtrain::launch {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string expand_home(const std::string& p) {
  const char* home = std::getenv("HOME");
  return path_expand_home(p, home ? home : "");
}

// Output of all nodes. Terminal: rank 0's stdout as is (the job's own output), every
// rank's stderr and the agents' own lines with their "[nodeK rankR]" prefix, other
// ranks' stdout only with tee_all. Files: every line of rank R in logs/rankR.log, the
// agent's own lines in logs/nodeK.log.
class OutputRouter {
 public:
  OutputRouter(const std::string& run_dir, RunFiles& files, bool echo, bool tee_all)
      : dir_(fs::path(run_dir) / "logs"), files_(files), echo_(echo), tee_all_(tee_all),
        progress_(::isatty(STDOUT_FILENO) != 0, 0) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
  }

  void line(int node, Stream s, std::string_view text) {
    int rank = -1;
    std::string_view body = text;
    if (text.rfind("[node", 0) == 0) {
      auto r = text.find(" rank");
      auto close = text.find("] ");
      if (r != std::string_view::npos && close != std::string_view::npos && r < close) {
        rank = std::atoi(std::string(text.substr(r + 5, close - r - 5)).c_str());
        body = text.substr(close + 2);
      }
    }
    if (rank == 0 && s == Stream::STDOUT && !started_ &&
        (body.rfind("train: ", 0) == 0 || body.rfind("resumed from step ", 0) == 0 || progress_parse(body)))
      started_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    // An agent's own warning or error (e.g. why it cannot reach the store) explains a
    // node that fails or never heartbeats: kept for the failure message.
    if (rank < 0 && s == Stream::STDERR && (text.find("error: ") != std::string_view::npos ||
                                            text.find("warning: ") != std::string_view::npos))
      agent_said_[node] = std::string(text);
    if (echo_) {
      if (rank == 0 && s == Stream::STDOUT) {
        // Progress lines become one redrawn status line on a TTY, plain lines otherwise.
        std::string shown;
        if (progress_.consume(body, &shown)) {
          std::fwrite(shown.data(), 1, shown.size(), stdout);
          std::fflush(stdout);
        } else {
          end_status_line();
          print(stdout, "", body);
        }
      } else if (rank < 0) {
        end_status_line();
        print(stderr, fmt::format("[node{}] ", node), text);
      } else if (s == Stream::STDERR || tee_all_) {
        end_status_line();
        print(s == Stream::STDOUT ? stdout : stderr, "", text);
      }
    }
    std::string file = rank >= 0 ? fmt::format("rank{}.log", rank) : fmt::format("node{}.log", node);
    std::string record(body);
    record.push_back('\n');
    files_.append((dir_ / file).string(), record);
  }

  // True once, the first time it is asked after rank 0 reported that training started
  // (or always_now: the round succeeded). Supervising thread only.
  bool take_started(bool always_now = false) {
    if (started_taken_ || !(always_now || started_)) return false;
    started_taken_ = true;
    return true;
  }

  // The last warning/error line node k's agent printed ("" when none).
  std::string agent_said(int node) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = agent_said_.find(node);
    return it == agent_said_.end() ? "" : it->second;
  }

  void set_restarts(int restarts) {
    std::lock_guard<std::mutex> lock(mu_);
    agent_said_.clear();  // a new round: the previous agents' words no longer apply
    progress_.set_restarts(restarts);
  }

  // Other output must start on a fresh line when a redrawn status line is open.
  void end_status_line() {
    std::string nl = progress_.interrupt();
    if (!nl.empty()) {
      std::fwrite(nl.data(), 1, nl.size(), stdout);
      std::fflush(stdout);
    }
  }

 private:
  static void print(std::FILE* f, const std::string& prefix, std::string_view text) {
    std::fwrite(prefix.data(), 1, prefix.size(), f);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fputc('\n', f);
    std::fflush(f);
  }

  fs::path dir_;
  RunFiles& files_;
  bool echo_, tee_all_;
  ProgressView progress_;
  std::mutex mu_;
  std::map<int, std::string> agent_said_;
  std::atomic<bool> started_{false};
  bool started_taken_ = false;
};

// " (its agent said: ...)" when the agent printed a warning or error, else "".
std::string agent_said_suffix(const std::string& said) {
  return said.empty() ? std::string() : fmt::format(" (its agent said: {})", said);
}

struct Failure {
  enum class Kind { NONE, SPAWN, AGENT_EXIT, HEARTBEAT, RANK_HUNG, INTERRUPT, PREFLIGHT };
  int node = -1;
  std::string why;
  int exit_code = 0;
  Kind kind = Kind::NONE;
  bool permanent = false;  // retrying cannot help (host key / authentication refused)
  std::optional<RankHang> hang = std::nullopt;  // RANK_HUNG: which rank, how long silent
};

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Why node k's agent ended unsuccessfully: the agent's own account of the failing rank
// (store key fail/node<k>, given a moment to land), prefixed with the node and host.
Failure agent_failure(const Job& job, rendezvous::StoreClient& store, const std::string& prefix, int k,
                      const ExitStatus& st, const std::string& agent_said) {
  std::string detail;
  try {
    if (store.wait({prefix + agent_failure_key(k)}, 500ms)) detail = store.get(prefix + agent_failure_key(k), 100ms);
  } catch (const Error&) {
  }
  std::string host = job.plan.nodes[k].host.destination();
  if (detail.empty()) detail = fmt::format("the agent {}{}", st.describe(), agent_said_suffix(agent_said));
  int code = st.exited ? st.code : 128 + st.signal;
  if (st.connection_lost) code = static_cast<int>(Exit::LAUNCH);
  return {k, fmt::format("node {} ({}): {}", k, host, detail), code == 0 ? static_cast<int>(Exit::LAUNCH) : code,
          Failure::Kind::AGENT_EXIT};
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
void write_nodes(const Job& job, RunFiles& files, int round, const std::vector<report::NodeHealth>& health) {
  files.attempt((fs::path(job.run_dir) / "nodes.json").string(),
                [&] { report::status_write_nodes(job.run_dir, round, health); });
}

// The end of supervise: what could not be recorded, said where the user sees it.
int finish(RunFiles& files, int rc) {
  files.flush_events();
  if (const size_t n = files.events_pending(); n > 0)
    log_error("{} event(s) (the job's end among them) could not be written to events.jsonl, so `dtrain status` "
              "cannot tell how the job ended: {}",
              n, files.failing());
  else if (std::string f = files.failing(); !f.empty())
    log_warn("some run directory files could not be fully written: {}", f);
  return rc;
}

// One round: start agents, watch, stop. Returns nullopt-like Failure{node=-1} on success.
Failure run_round(Job& job, rendezvous::StoreServer& server, rendezvous::StoreClient& store,
                  const std::string& token, const SupervisorOptions& opts, OutputRouter& out, RunFiles& files) {
  const auto& ft = job.cfg.fault_tolerance;
  const auto hb_timeout = seconds_ms(ft.heartbeat_timeout);
  // Grace before the first heartbeat: SSH connect plus agent start.
  const auto first_hb_grace = seconds_ms(job.cfg.cluster.ssh.connect_timeout) + hb_timeout;
  const int round = job.spec.round;
  const std::string prefix = rendezvous::store_prefix(job.spec.job_id, round);
  const auto env = environ_map();
  const int n = static_cast<int>(job.plan.nodes.size());

  std::vector<std::unique_ptr<Process>> agents(n);
  std::vector<std::string> spawn_errors(n);
  std::vector<char> spawn_permanent(n, 0);
  {
    // Sessions open in parallel: a slow or dead host does not delay the others.
    std::vector<std::thread> starters;
    for (int k = 0; k < n; ++k) {
      starters.emplace_back([&, k] {
        try {
          NodeCommand cmd = node_command_build(job.plan, k, job.spec, env);
          agents[k] = opts.spawner(job.plan.nodes[k], cmd, token + "\n",
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
  Failure fail;
  for (int k = 0; k < n; ++k)
    if (!spawn_errors[k].empty() && fail.node < 0) {
      fail = {k, fmt::format("could not start node {} ({}): {}", k, job.plan.nodes[k].host.destination(), spawn_errors[k]),
              static_cast<int>(Exit::LAUNCH), Failure::Kind::SPAWN, spawn_permanent[k] != 0};
    }

  RankWatchLimits limits;
  limits.heartbeat_interval = seconds_ms(ft.heartbeat_interval);
  limits.heartbeat_timeout = hb_timeout;
  limits.step_timeout = seconds_ms(ft.step_timeout);
  limits.first_beat_grace = first_hb_grace;
  RankWatch rank_watch(job.plan, limits);

  const auto started = Clock::now();
  auto last_nodes_write = started - 10s;
  std::vector<bool> done(n, false);
  while (fail.node < 0) {
    if (opts.interrupted && *opts.interrupted) {
      fail = {-2, interrupt_why(*opts.interrupted), static_cast<int>(Exit::INTERRUPTED), Failure::Kind::INTERRUPT};
      break;
    }
    int finished = 0;
    for (int k = 0; k < n && fail.node < 0; ++k) {
      if (done[k]) {
        ++finished;
        continue;
      }
      auto st = agents[k]->wait_for(0ms);
      if (!st) continue;
      if (st->success()) {
        done[k] = true;
        ++finished;
        continue;
      }
      fail = agent_failure(job, store, prefix, k, *st, out.agent_said(k));
      // When a rank dies its peers fail too, with communication errors, at nearly the
      // same moment: look a little longer for the failure that is not a consequence.
      if (fail.exit_code == static_cast<int>(Exit::COMM)) {
        auto until = Clock::now() + 1000ms;
        while (Clock::now() < until && fail.exit_code == static_cast<int>(Exit::COMM)) {
          for (int j = 0; j < n; ++j) {
            if (j == k || done[j]) continue;
            auto sj = agents[j]->wait_for(0ms);
            if (!sj || sj->success()) continue;
            Failure fj = agent_failure(job, store, prefix, j, *sj, out.agent_said(j));
            if (fj.exit_code != static_cast<int>(Exit::COMM)) {
              fail = fj;
              break;
            }
          }
          std::this_thread::sleep_for(20ms);
        }
      }
    }
    if (fail.node >= 0) break;
    if (opts.on_started && out.take_started(finished == n)) opts.on_started();
    if (finished == n) {  // every node succeeded
      std::vector<report::NodeHealth> health;
      for (int k = 0; k < n; ++k) health.push_back({k, job.plan.nodes[k].host.destination(), -1.0, "done"});
      write_nodes(job, files, round, health);
      return fail;
    }

    // Heartbeats, measured on the server's clock.
    auto beats = server.heartbeats(prefix + "hb/");
    auto now = Clock::now();
    if (now - last_nodes_write > 1000ms) {
      // For `dtrain status`: each node's last heartbeat age, refreshed every second.
      last_nodes_write = now;
      std::vector<report::NodeHealth> health;
      for (int k = 0; k < n; ++k) {
        auto it = beats.find(fmt::format("node{}", k));
        double age = it == beats.end() ? -1.0 : std::chrono::duration<double>(now - it->second).count();
        health.push_back({k, job.plan.nodes[k].host.destination(), age,
                          done[k] ? "done" : it == beats.end() ? "starting" : "running"});
      }
      write_nodes(job, files, round, health);
    }
    for (int k = 0; k < n; ++k) {
      if (done[k]) continue;
      auto it = beats.find(fmt::format("node{}", k));
      std::string host = job.plan.nodes[k].host.destination();
      if (it == beats.end()) {
        if (now - started > first_hb_grace) {
          fail = {k, fmt::format("node {} ({}) sent no heartbeat within {:.0f} s of its start{}", k, host,
                                 std::chrono::duration<double>(first_hb_grace).count(),
                                 agent_said_suffix(out.agent_said(k))),
                  static_cast<int>(Exit::LAUNCH), Failure::Kind::HEARTBEAT};
          break;
        }
      } else if (now - it->second > hb_timeout) {
        fail = {k, fmt::format("node {} ({}) missed heartbeats for {:.1f} s (heartbeat_timeout {} s)", k, host,
                               std::chrono::duration<double>(now - it->second).count(), ft.heartbeat_timeout),
                static_cast<int>(Exit::LAUNCH), Failure::Kind::HEARTBEAT};
        break;
      }
    }
    if (fail.node >= 0) break;
    // Ranks: their own heartbeats (a stopped process is silent) and training steps.
    if (auto hang = rank_watch.check(rank_watch_snapshot(server, prefix), Clock::now(), done)) {
      fail = {hang->node, hang->describe(limits), static_cast<int>(Exit::HUNG), Failure::Kind::RANK_HUNG};
      fail.hang = std::move(hang);
      break;
    }
    std::this_thread::sleep_for(50ms);
  }

  // Stop every node: the stop key reaches agents that still talk to the store; closing
  // the sessions (stdin EOF / SIGTERM) reaches the rest.
  try {
    store.set(prefix + kStopKey, "1");
  } catch (const Error&) {
  }
  std::vector<std::thread> stoppers;
  for (int k = 0; k < n; ++k)
    if (agents[k] && agents[k]->running())
      stoppers.emplace_back([&, k] {
        // A node that stopped answering cannot stop anything: drop its session now (its
        // agent stops its ranks when its stdin closes or the store vanishes).
        if (k == fail.node && fail.kind == Failure::Kind::HEARTBEAT) {
          agents[k]->terminate(1000ms);
          return;
        }
        // Agents stop their ranks within their own grace; give them that plus margin.
        if (!agents[k]->wait_for(3000ms)) agents[k]->terminate(8000ms);
      });
  for (auto& t : stoppers) t.join();
  {
    std::vector<report::NodeHealth> health;
    for (int k = 0; k < n; ++k)
      health.push_back({k, job.plan.nodes[k].host.destination(), -1.0,
                        k == fail.node ? "failed" : done[k] ? "done" : "stopped"});
    write_nodes(job, files, round, health);
  }
  return fail;
}

}  // namespace

// ---------------------------------------------------------------------------

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

int supervise(Job& job, const SupervisorOptions& opts) {
  DT_ENFORCE(static_cast<bool>(opts.spawner), InternalError, "supervise needs a spawner");
  const std::string token = rendezvous::token_generate();
  // Listen only on the address the nodes are told to dial (loopback for a local job), so
  // the store is not reachable from networks the job does not use.
  const std::string listen_addr = rendezvous::store_listen_address(job.plan.master_addr, !job.all_local);
  rendezvous::StoreServer server(listen_addr, static_cast<uint16_t>(job.plan.master_port), token);
  job_set_port(job, server.port());
  rendezvous::StoreClient store(listen_addr, server.port(), token);
  RunFiles files(job.run_dir);
  OutputRouter out(job.run_dir, files, opts.echo, opts.tee_all);
  files.attempt((fs::path(job.run_dir) / "launcher.json").string(),
                [&] { report::status_write_launcher(job.run_dir, job.spec.job_id); });
  log_info("run directory: {}", job.run_dir);
  if (job.spec.mode == "train")
    for (const std::string& line : rank_device_plan_lines(job.plan, job.cfg.training.device)) log_info("{}", line);
  const auto& ft = job.cfg.fault_tolerance;

  for (int round = 0;; ++round) {
    job.spec.round = round;
    out.set_restarts(round);
    // A failed round may have been one that was saving a checkpoint (run_job does this
    // before round 0, before it writes anything itself).
    if (round > 0) run_dir_remove_partial_checkpoints(job.run_dir);
    log_info("round {}: starting {} rank(s) on {} node(s), rendezvous {}", round, job.plan.world_size,
             job.plan.nodes.size(), host_port_text(job.plan.master_addr, job.plan.master_port));
    files.event({{"time_ms", unix_ms()}, {"event", "round_start"}, {"round", round},
                 {"world_size", job.plan.world_size}});
    auto t0 = Clock::now();
    Failure f;
    if (opts.preflight) {
      PreflightVerdict v = opts.preflight(job);
      if (!v.why.empty())
        f = {std::max(v.node, 0), "preflight: " + v.why, static_cast<int>(Exit::LAUNCH), Failure::Kind::PREFLIGHT};
    }
    if (f.kind != Failure::Kind::PREFLIGHT) f = run_round(job, server, store, token, opts, out, files);
    if (f.node == -1) {
      log_info("job finished: all {} rank(s) succeeded in round {} ({:.1f} s)", job.plan.world_size, round,
               std::chrono::duration<double>(Clock::now() - t0).count());
      files.event({{"time_ms", unix_ms()}, {"event", "finished"}, {"round", round}});
      return finish(files, 0);
    }
    // A rank that stopped on a usage or config error fails the same way every round.
    if (f.exit_code == static_cast<int>(Exit::USAGE)) f.permanent = true;
    const bool retry = f.node != -2 && !f.permanent && round < ft.max_retries;
    nlohmann::json ev{{"time_ms", unix_ms()}, {"event", "failure"},         {"round", round}, {"node", f.node},
                      {"why", f.why},         {"exit_code", f.exit_code}, {"retry", retry}};
    if (f.hang) {
      ev["hang"] = f.hang->kind_name();
      ev["rank"] = f.hang->rank;
      ev["local_rank"] = f.hang->local_rank;
      ev["host"] = f.hang->host;
      if (f.hang->pid > 0) ev["pid"] = f.hang->pid;
      ev["silent_s"] = f.hang->silent_s;
      if (f.hang->kind == RankHang::Kind::NO_STEP) ev["last_step"] = f.hang->last_step;
    }
    files.event(ev);
    if (f.node == -2) {
      log_error("{}: every node stopped; continue with: dtrain resume {}", f.why, job.run_dir);
      return finish(files, f.exit_code);
    }
    log_error("round {} failed: {}; {}", round, f.why,
              f.kind == Failure::Kind::PREFLIGHT ? "no node was started" : "every node stopped");
    if (f.permanent) {
      log_error("not restarting: retrying cannot fix this (a usage, config, host key or credential error): fix it, then dtrain resume");
      return finish(files, f.exit_code);
    }
    if (round >= ft.max_retries) {
      log_error("giving up after {} restart(s) (fault_tolerance.max_retries = {})", round, ft.max_retries);
      return finish(files, f.exit_code);
    }
    log_info("restarting in {} s (restart {} of {})", ft.retry_delay, round + 1, ft.max_retries);
    auto until = Clock::now() + seconds_ms(ft.retry_delay);
    auto next_flush = Clock::now();
    while (Clock::now() < until) {
      if (opts.interrupted && *opts.interrupted) {
        // Between rounds no node runs: nothing to stop, but the run's record says why it ended.
        const std::string why = interrupt_why(*opts.interrupted);
        files.event({{"time_ms", unix_ms()}, {"event", "failure"}, {"round", round}, {"node", -2},
                     {"why", why + " while waiting to restart"},
                     {"exit_code", static_cast<int>(Exit::INTERRUPTED)}});
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
  }
}

}  // namespace dtrain::launch
