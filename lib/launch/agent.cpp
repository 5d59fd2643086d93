// Node agent: spawn local ranks, forward their output, heartbeat, stop them all on the
// first failure or when the launcher goes away.
#include "launch/agent.h"

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "core/net_address.h"
#include "device/device.h"
#include "launch/job.h"
#include "launch/local_rank_group.h"
#include "launch/local_spawner.h"
#include "launch/rank_device.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/store.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace dtrain::launch {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The device this node's ranks train on, decided before any of them starts: the config's
// choice against the CUDA devices this agent sees and, with several nodes, against every
// other node's verdict (one job, one backend). Returns the device, or "" after reporting
// the problem (this node's own, or node 0 for a disagreement) as the node's failure;
// nodes without a problem of their own then wait for the launcher's stop.
std::string agent_decide_device(const AgentArgs& args, const std::string& host, rendezvous::PrefixStore& store,
                                const std::function<bool()>& stop_asked) {
  const int visible = args.device == "cpu" ? 0 : device::cuda_count();
  NodeDeviceVerdict mine = node_device_verdict(args.device, visible, args.devices, host);
  std::vector<std::pair<std::string, NodeDeviceVerdict>> all;
  if (args.nnodes == 1 || args.device == "cpu") {
    all.emplace_back(host, mine);
  } else {
    store.set(device_verdict_key(args.node_rank), device_verdict_value(mine, host));
    std::vector<std::string> keys;
    for (int k = 0; k < args.nnodes; ++k) keys.push_back(device_verdict_key(k));
    // Bounded: the launcher stops the round when a node never comes up.
    bool ready = false;
    for (int i = 0; i < 600 && !ready; ++i) {
      ready = store.wait(keys, std::chrono::milliseconds(1000));
      if (!ready && stop_asked()) return "";
    }
    DT_ENFORCE(ready, CommError, "the other nodes did not publish their devices within 10 minutes");
    for (int k = 0; k < args.nnodes; ++k) {
      all.push_back(device_verdict_parse(store.get(keys[static_cast<size_t>(k)], std::chrono::milliseconds(5000)),
                                         fmt::format("node {}", k)));
    }
  }
  NodeDeviceVerdict job = rank_device_agree(all);
  if (job.problem.empty()) return job.device;
  // Each node reports its own problem; a disagreement between sound nodes, node 0.
  bool any_own = false;
  for (const auto& [h, v] : all) any_own = any_own || !v.problem.empty();
  const bool report = !mine.problem.empty() || (args.node_rank == 0 && !any_own);
  if (report) {
    const std::string why = mine.problem.empty() ? job.problem : mine.problem;
    log_error("{}", why);
    store.set(agent_failure_key(args.node_rank), why);
    return "";
  }
  for (int i = 0; i < 600 && !stop_asked(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return "";
}

// Reads the token line from fd, then watches for EOF on a thread.
class LauncherLink {
 public:
  explicit LauncherLink(int fd) : fd_(fd) {}
  ~LauncherLink() {
    stop_ = true;
    if (watcher_.joinable()) watcher_.join();
  }

  std::string read_token(std::chrono::milliseconds timeout) {
    return read_line(Clock::now() + timeout, 4096, "the rendezvous token");
  }

  // The secret environment after the token (node_command.h, agent_stdin_payload): at most
  // 4096 lines of at most 1 MiB, up to the empty line.
  std::map<std::string, std::string> read_env(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::map<std::string, std::string> env;
    for (int i = 0; i < 4096; ++i) {
      const std::string line = read_line(deadline, 1 << 20, "the environment (cluster.env.set)");
      if (line.empty()) return env;
      env.insert(agent_env_line_parse(line));
    }
    DT_THROW(UsageError, "more than 4096 environment lines on the agent's stdin");
  }

  void watch() {
    watcher_ = std::thread([this] {
      char buf[256];
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        int r = ::poll(&p, 1, 200);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        if (r == 0) continue;
        ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: the launcher (or its SSH connection) is gone
      }
      if (!stop_) gone_ = true;
    });
  }

  bool gone() const { return gone_; }

 private:
  std::string read_line(Clock::time_point deadline, size_t max_len, const char* what) {
    std::string line;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, 100);
      if (r < 0 && errno == EINTR) continue;
      DT_ENFORCE(r >= 0, IoError, "poll on the agent's stdin failed");
      if (r == 0) continue;
      char c;
      ssize_t n = ::read(fd_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) DT_THROW(UsageError, "the launcher closed stdin before sending {}", what);
      if (c == '\n') return line;
      line.push_back(c);
      if (line.size() > max_len) DT_THROW(UsageError, "{} on stdin: a line is longer than {} bytes", what, max_len);
    }
    DT_THROW(UsageError, "{} did not arrive on stdin in time (the agent is started by dtrain launch)", what);
  }

  int fd_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> gone_{false};
  std::thread watcher_;
};

// Connects to the launcher's store. The reason a first short attempt failed (refused,
// timed out, ...) goes to stderr at once, because the launcher may give up on this node's
// heartbeats before our own timeout ends and shows the user only what we printed.
std::unique_ptr<rendezvous::StoreClient> store_connect(const AgentArgs& args, const std::string& token,
                                                       std::chrono::milliseconds timeout) {
  const auto port = static_cast<uint16_t>(args.master_port);
  const auto first = std::min<std::chrono::milliseconds>(timeout, 2000ms);
  const auto t0 = Clock::now();
  try {
    return std::make_unique<rendezvous::StoreClient>(args.master_addr, port, token, first);
  } catch (const CommError& e) {
    // Given up before its time: a name that does not exist or a refused token, which
    // waiting cannot fix.
    if (timeout <= first || Clock::now() - t0 < first) throw;
    log_warn("{}; still trying for up to {} s", e.what(),
             std::chrono::duration_cast<std::chrono::seconds>(timeout - first).count());
  }
  return std::make_unique<rendezvous::StoreClient>(args.master_addr, port, token, timeout - first);
}

// agent_decide_device, and the decision logged: the ranks' device and collectives.
std::string agent_rank_device(const AgentArgs& args, const std::string& host, rendezvous::PrefixStore& store,
                              const std::function<bool()>& stop_asked) {
  const std::string device = agent_decide_device(args, host, store, stop_asked);
  if (device.empty()) return device;
  std::string ids;
  for (size_t i = 0; i < args.devices.size(); ++i) ids += (i ? "," : "") + std::to_string(args.devices[i]);
  log_info("{} rank(s) on {}{}, collectives: {}", args.local_world_size, device,
           device == "cuda" ? " devices " + ids : "", rank_backend_name(device, args.world_size));
  return device;
}

// The node's ranks: `dtrain worker [rank args]`, token on stdin.
std::vector<LocalRankSpec> agent_rank_specs(const AgentArgs& args, const AgentArgs& resolved,
                                            const std::map<std::string, std::string>& secret_env,
                                            const std::string& token) {
  const std::string exe = self_exe_path();
  std::vector<LocalRankSpec> specs;
  for (int lr = 0; lr < args.local_world_size; ++lr) {
    LocalRankSpec r;
    r.argv = {exe, "worker"};
    r.argv.insert(r.argv.end(), args.rank_args.begin(), args.rank_args.end());
    // The rank contract (RANK, ...) wins over cluster.env.set, as over anything forwarded.
    r.env = agent_rank_env(resolved, lr);
    r.env.insert(secret_env.begin(), secret_env.end());
    r.stdin_data = token + "\n";
    r.prefix = fmt::format("[node{} rank{}] ", args.node_rank, args.first_rank + lr);
    specs.push_back(std::move(r));
  }
  return specs;
}

// Watches the ranks until they end, one fails, the launcher says stop or goes away
// (launcher_gone: why, "" while it is there); the agent's exit code.
int agent_watch_ranks(const AgentArgs& args, const std::string& host, LocalRankGroup& ranks,
                      rendezvous::PrefixStore& round_store, const std::function<const char*()>& launcher_gone) {
  auto last_stop_check = Clock::now();
  while (true) {
    const LocalRankGroupStatus g = ranks.poll();
    if (g.state == LocalRankGroupStatus::State::SUCCEEDED) return 0;
    if (g.state == LocalRankGroupStatus::State::FAILED) {
      std::string why = fmt::format("rank {} (local rank {}) on {} {}", args.first_rank + g.local_rank, g.local_rank,
                                    host, g.exit.describe());
      if (!g.said.empty()) why += ": " + g.said;
      log_error("{}", why);
      try {
        round_store.set(agent_failure_key(args.node_rank), why);
      } catch (const Error&) {
        // The launcher is gone too; stopping the ranks is all that is left to do.
      }
      ranks.stop();
      return g.exit_code;
    }
    if (g.state == LocalRankGroupStatus::State::FAILING) {  // its cause is looked for a little longer
      std::this_thread::sleep_for(20ms);
      continue;
    }
    if (const std::string gone = launcher_gone(); !gone.empty()) {
      log_error("the launcher went away ({}): stopping {} local rank(s)", gone, ranks.size());
      ranks.stop();
      return static_cast<int>(Exit::COMM);
    }
    if (Clock::now() - last_stop_check > 300ms) {
      last_stop_check = Clock::now();
      bool stop = false;
      try {
        stop = round_store.check({kStopKey});
      } catch (const Error& e) {
        log_error("lost the rendezvous store: {}", e.what());
        ranks.stop();
        return static_cast<int>(Exit::COMM);
      }
      if (stop) {
        ranks.stop();
        return static_cast<int>(Exit::STOPPED);
      }
    }
    std::this_thread::sleep_for(20ms);
  }
}

}  // namespace

// ---------------------------------------------------------------------------

std::string agent_failure_key(int node_rank) { return fmt::format("fail/node{}", node_rank); }

AgentTiming agent_timing_from_env() {
  AgentTiming t;
  // Seconds from the launcher (fault_tolerance.heartbeat_interval, .store_connect_timeout);
  // a value out of range leaves the default.
  auto seconds = [](const char* name, double most, std::chrono::milliseconds& out) {
    const char* v = env_get(name);
    if (!v) return;
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end != v && s > 0 && s < most) out = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  };
  seconds("DTRAIN_HEARTBEAT_INTERVAL", 3600, t.heartbeat_interval);
  seconds("DTRAIN_STORE_CONNECT_TIMEOUT", 86400, t.store_connect_timeout);
  return t;
}

std::map<std::string, std::string> agent_rank_env(const AgentArgs& a, int local_rank) {
  std::map<std::string, std::string> env;
  env["RANK"] = std::to_string(a.first_rank + local_rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(a.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(a.local_world_size);
  env["NODE_RANK"] = std::to_string(a.node_rank);
  env["GROUP_RANK"] = std::to_string(a.node_rank);
  env["NNODES"] = std::to_string(a.nnodes);
  env["MASTER_ADDR"] = a.master_addr;
  env["MASTER_PORT"] = std::to_string(a.master_port);
  std::string devices;
  for (size_t i = 0; i < a.devices.size(); ++i) devices += (i ? "," : "") + std::to_string(a.devices[i]);
  env["CUDA_VISIBLE_DEVICES"] = devices;
  env["DTRAIN_JOB_ID"] = a.job_id;
  env["DTRAIN_ROUND"] = std::to_string(a.round);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(a.round);
  env["DTRAIN_RUN_DIR"] = a.run_dir;
  env["DTRAIN_MODE"] = a.mode;
  if (a.mode == "train") env["DTRAIN_DEVICE"] = a.device;
  if (!a.config_path.empty()) env["DTRAIN_CONFIG"] = a.config_path;
  // Ranks on one node share its cores.
  env.merge(rank_thread_env(a.local_world_size));
  return env;
}

int agent_run(const AgentArgs& args, int token_fd, const AgentTiming& timing) {
  const std::string host = host_name();
  set_error_context(fmt::format("host={} node={}", host, args.node_rank));
  LauncherLink link(token_fd);
  const std::string token = link.read_token(timing.store_connect_timeout);
  const std::map<std::string, std::string> secret_env = link.read_env(timing.store_connect_timeout);
  link.watch();

  const uint16_t port = static_cast<uint16_t>(args.master_port);
  auto store = store_connect(args, token, timing.store_connect_timeout);
  rendezvous::PrefixStore round_store(*store, args.job_id, args.round);
  round_store.set(fmt::format("agent/node{}", args.node_rank), fmt::format("{} pid {}", host, ::getpid()));

  // Heartbeats on their own connection so a blocked request never delays them. A beat
  // that fails means the launcher's store is gone: the ranks are stopped.
  rendezvous::Heartbeat hb(args.master_addr, port, token, fmt::format("node{}", args.node_rank),
                           timing.heartbeat_interval, round_store.prefix(),
                           std::max(timing.heartbeat_interval * 3, std::chrono::milliseconds(5000)));
  auto store_lost = [&hb] { return !hb.last_error().empty(); };

  // The ranks' device, before any of them starts.
  AgentArgs resolved = args;
  if (args.mode == "train") {
    resolved.device = agent_rank_device(args, host, round_store,
                                        [&] { return link.gone() || store_lost() || round_store.check({kStopKey}); });
    if (resolved.device.empty()) {
      const bool own = round_store.check({agent_failure_key(args.node_rank)});
      return own ? static_cast<int>(Exit::USAGE) : static_cast<int>(Exit::STOPPED);
    }
  }

  LocalRankGroup ranks(agent_rank_specs(args, resolved, secret_env, token), timing.stop_grace);
  return agent_watch_ranks(args, host, ranks, round_store, [&] {
    if (link.gone()) return "its connection closed";
    return store_lost() ? "the rendezvous store is unreachable" : "";
  });
}

int agent_main(const std::vector<std::string>& argv) {
  ::signal(SIGPIPE, SIG_IGN);
  spawner_become_subreaper();
  AgentArgs args = agent_args_parse(argv);
  return agent_run(args, 0, agent_timing_from_env());
}

}  // namespace dtrain::launch
