// Launcher side of the doctor: start doctor-node everywhere, barrier, collect, judge.
#include "doctor/doctor.h"

#include "core/check.h"
#include "core/log.h"
#include "core/version.h"
#include "doctor/node_probe.h"
#include "doctor/net_probe.h"
#include "launch/ssh_session.h"
#include "rendezvous/store.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace fs = std::filesystem;

namespace dtrain::doctor {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string random_hex(int bytes) {
  std::random_device rd;
  std::string s;
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    s.push_back(hex[v >> 4]);
    s.push_back(hex[v & 15]);
  }
  return s;
}

// What one node's doctor-node said, filled by its reader thread.
struct NodeState {
  std::mutex mu;
  std::condition_variable cv;
  bool facts = false, clock = false, shared = false, net = false;
  nlohmann::json facts_json, shared_json, net_json;
  int64_t clock_ns = 0, clock_arrival_ns = 0;
  std::string error;  // an "error" line
  std::deque<std::string> stderr_tail;
  std::string bad_line;  // stdout that was not a JSON object

  void line(launch::Stream s, std::string_view text) {
    std::lock_guard lock(mu);
    if (s == launch::Stream::STDERR) {
      stderr_tail.emplace_back(text);
      if (stderr_tail.size() > 4) stderr_tail.pop_front();
      return;
    }
    const int64_t now = wall_ns();
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("type")) {
      if (bad_line.empty()) bad_line = std::string(text.substr(0, 200));
      return;
    }
    const std::string type = j["type"].is_string() ? j["type"].get<std::string>() : "";
    if (type == "facts") facts = true, facts_json = j;
    else if (type == "clock") clock = true, clock_ns = j.value("time_ns", int64_t{0}), clock_arrival_ns = now;
    else if (type == "shared") shared = true, shared_json = j;
    else if (type == "net") net = true, net_json = j;
    else if (type == "error") error = j.value("error", std::string("unknown error"));
    cv.notify_all();
  }

  std::string tail() {
    std::string s;
    for (const auto& l : stderr_tail) s += (s.empty() ? "" : " | ") + l;
    return s;
  }
};

double seconds_between(int64_t a_ns, int64_t b_ns) { return static_cast<double>(b_ns - a_ns) / 1e9; }

}  // namespace

bool Report::ok() const {
  for (const Finding& f : findings)
    if (f.status == Status::FAIL) return false;
  return true;
}

std::vector<int> Report::failed_nodes() const {
  std::vector<int> out;
  for (const Finding& f : findings)
    if (f.status == Status::FAIL && f.node >= 0 && std::find(out.begin(), out.end(), f.node) == out.end())
      out.push_back(f.node);
  return out;
}

namespace {

// What every node's report is held against.
Expectations expectations_for(const launch::Job& job, const DoctorOptions& opts) {
  const auto& dc = job.cfg.doctor;
  Expectations ex;
  ex.version = version();
  ex.build_id = opts.expected_build_id.empty() ? build_id() : opts.expected_build_id;
  ex.device = job.cfg.training.device;
  ex.run_dir = job.run_dir;
  ex.dtrain_path = job.spec.dtrain_path;
  ex.workdir = job.spec.workdir;
  ex.min_free_gb = dc.min_free_gb;
  ex.max_clock_skew = dc.max_clock_skew;
  ex.slow_factor = dc.slow_factor;
  return ex;
}

// One check in flight: node i of plans is node index which[i], its output parser state[i]
// and its process procs[i] (null when it did not start); the network phase meets in a store
// of its own (never the job's port).
struct Probe {
  std::vector<int> which;
  int nnodes = 0;  // highest node index + 1
  std::string session = random_hex(8);
  std::string token;
  std::unique_ptr<rendezvous::StoreServer> server;
  std::unique_ptr<rendezvous::StoreClient> store;
  std::vector<std::unique_ptr<NodeState>> state;
  std::vector<std::unique_ptr<launch::Process>> procs;

  size_t size() const { return which.size(); }
};

void index_nodes(const std::vector<launch::NodePlan>& plans, Probe& pr) {
  for (const launch::NodePlan& p : plans) {
    DT_ENFORCE(p.node_rank >= 0 && std::find(pr.which.begin(), pr.which.end(), p.node_rank) == pr.which.end(),
               InternalError, "doctor: node index {} negative or given twice", p.node_rank);
    pr.which.push_back(p.node_rank);
    pr.nnodes = std::max(pr.nnodes, p.node_rank + 1);
  }
  for (size_t i = 0; i < pr.size(); ++i) pr.state.push_back(std::make_unique<NodeState>());
  pr.procs.resize(pr.size());
}

void open_network_store(const launch::Job& job, Probe& pr) {
  pr.token = rendezvous::token_generate();
  const std::string listen = rendezvous::store_listen_address(job.plan.master_addr, !job.all_local);
  pr.server = std::make_unique<rendezvous::StoreServer>(listen, 0, pr.token);
  pr.store = std::make_unique<rendezvous::StoreClient>(listen, pr.server->port(), pr.token);
}

// The doctor-node command line for node k.
launch::NodeCommand node_command(const launch::Job& job, const DoctorOptions& opts, const Probe& pr,
                                 const Expectations& ex, int k) {
  const auto& dc = job.cfg.doctor;
  NodeProbeArgs a;
  a.node = k;
  a.run_dir = job.run_dir;
  a.session = pr.session;
  a.nonce = ex.nonces.at(node_nonce_name(k));
  a.timeout = dc.timeout;
  if (opts.network) {
    a.network = true;
    a.master_addr = job.plan.master_addr;
    a.master_port = pr.server->port();
    a.interface = job.cfg.cluster.network_interface;
    a.link_seconds = dc.link_seconds;
  }
  launch::NodeCommand cmd;
  cmd.argv = {job.spec.dtrain_path, "doctor-node"};
  for (auto& w : node_probe_argv(a)) cmd.argv.push_back(w);
  cmd.workdir = job.spec.workdir;
  return cmd;
}

// Starts doctor-node on every node at once; a node that cannot be started gets its
// start_error (start_refused when SSH refused it) and no process.
void start_nodes(const launch::Job& job, const launch::NodeSpawner& spawner, const DoctorOptions& opts,
                 const std::vector<launch::NodePlan>& plans, Probe& pr, Report& rep) {
  rep.nodes.resize(pr.size());
  std::vector<std::thread> starters;
  for (size_t i = 0; i < pr.size(); ++i) {
    const int k = pr.which[i];
    rep.nodes[i].node = k;
    rep.nodes[i].host = plans[i].host.destination();
    rep.nodes[i].slots = static_cast<int>(plans[i].ranks.size());
    starters.emplace_back([&, i, k] {
      const launch::NodeCommand cmd = node_command(job, opts, pr, rep.expect, k);
      NodeState* st = pr.state[i].get();
      try {
        pr.procs[i] = spawner(plans[i], cmd, opts.network ? pr.token + "\n" : std::string(),
                              [st](launch::Stream s, std::string_view line) { st->line(s, line); });
      } catch (const SshRefusedError& e) {
        rep.nodes[i].start_error = e.what();
        rep.nodes[i].start_refused = true;
      } catch (const Error& e) {
        rep.nodes[i].start_error = e.what();
      }
    });
  }
  for (auto& t : starters) t.join();
}

// Phase 1: every started node reports its facts (its nonce is then written), until the
// deadline. Returns the nodes that did: the world of the network phase.
nlohmann::json wait_for_facts(Probe& pr, Clock::time_point deadline) {
  for (size_t i = 0; i < pr.size(); ++i) {
    if (!pr.procs[i]) continue;
    while (Clock::now() < deadline) {
      {
        std::unique_lock lock(pr.state[i]->mu);
        if (pr.state[i]->facts || !pr.state[i]->error.empty()) break;
      }
      if (!pr.procs[i]->running()) break;
      std::unique_lock lock(pr.state[i]->mu);
      pr.state[i]->cv.wait_for(lock, 50ms);
    }
  }
  nlohmann::json world = nlohmann::json::array();
  for (size_t i = 0; i < pr.size(); ++i) {
    std::lock_guard lock(pr.state[i]->mu);
    if (pr.procs[i] && pr.state[i]->facts) world.push_back(pr.which[i]);
  }
  return world;
}

// What a finished (or stopped) node reported, into o; closed_ns is when its barrier closed.
void observe_end(NodeObservation& o, NodeState& st, const std::optional<launch::ExitStatus>& status, int64_t closed_ns,
                 bool network) {
  std::lock_guard lock(st.mu);
  if (st.facts) o.facts = facts_from_json(st.facts_json);
  if (st.clock) {
    const int64_t mid = closed_ns + (st.clock_arrival_ns - closed_ns) / 2;
    o.clock_offset_s = seconds_between(mid, st.clock_ns);
    o.clock_uncertainty_s = seconds_between(closed_ns, st.clock_arrival_ns) / 2;
  }
  if (st.shared && st.shared_json.contains("seen") && st.shared_json["seen"].is_object()) {
    std::map<std::string, std::string> seen;
    for (auto& [name, v] : st.shared_json["seen"].items())
      if (v.is_string()) seen[name] = v.get<std::string>();
    o.seen = seen;
  }
  if (st.net) {
    if (st.net_json.contains("allreduce_ok")) o.allreduce_ok = st.net_json["allreduce_ok"].get<bool>();
    o.net_error = st.net_json.value("error", std::string());
  }
  if (o.end_error.empty() && !st.error.empty()) o.end_error = st.error;
  if (o.end_error.empty() && status && !status->success())
    o.end_error =
        fmt::format("dtrain doctor-node {}{}{}", status->describe(), st.tail().empty() ? "" : ": " + st.tail(),
                    st.bad_line.empty() ? "" : " (stdout: " + st.bad_line + ")");
  if (o.end_error.empty() && !st.facts)
    o.end_error = fmt::format("dtrain doctor-node printed no report{}",
                              st.bad_line.empty() ? "" : " (stdout: " + st.bad_line + ")");
  if (network && o.facts && !st.net && o.net_error.empty() && o.end_error.empty())
    o.net_error = "the node reported no network result";
}

// Phase 2: the barrier. Each node answers with its clock at once (NTP-style: the offset is
// measured against the midpoint of close and answer), then runs the network phase among
// `world_size` nodes and ends; a node still running at the deadline is stopped.
void close_and_wait(const launch::Job& job, const DoctorOptions& opts, Probe& pr, size_t world_size,
                    std::chrono::milliseconds timeout, Report& rep) {
  const auto& dc = job.cfg.doctor;
  std::vector<int64_t> closed_ns(pr.size(), 0);
  for (size_t i = 0; i < pr.size(); ++i)
    if (pr.procs[i]) {
      closed_ns[i] = wall_ns();
      pr.procs[i]->close_stdin();
    }
  const int pairs = static_cast<int>(world_size * (world_size - 1) / 2);
  const auto net_budget = opts.network
                              ? std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::duration<double>(pairs * 2 * (2 * dc.link_seconds + 1.0) + 5.0)) +
                                    timeout
                              : 0ms;
  const auto end_deadline = Clock::now() + timeout + net_budget;
  for (size_t i = 0; i < pr.size(); ++i) {
    if (!pr.procs[i]) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_deadline - Clock::now());
    auto status = pr.procs[i]->wait_for(std::max(left, 0ms));
    NodeObservation& o = rep.nodes[i];
    if (!status) {
      pr.procs[i]->terminate(1000ms);
      o.end_error = fmt::format("the node check did not finish within {:.0f} s",
                                std::chrono::duration<double>(timeout + net_budget).count());
    }
    observe_end(o, *pr.state[i], status, closed_ns[i], opts.network);
  }
}

// Links: each end reports the direction it sent.
NetworkSummary gather_links(const Probe& pr, double slow_factor) {
  std::vector<LinkSample> parts;
  for (size_t i = 0; i < pr.size(); ++i) {
    std::lock_guard lock(pr.state[i]->mu);
    if (!pr.state[i]->net || !pr.state[i]->net_json.contains("links")) continue;
    for (const auto& l : pr.state[i]->net_json["links"])
      parts.push_back({l.value("a", 0), l.value("b", 0), l.value("ab", 0.0), l.value("ba", 0.0)});
  }
  return network_summarize(link_merge(parts), pr.nnodes, slow_factor);
}

// The findings from the observations, with the options' adjustments.
void add_findings(Report& rep, const DoctorOptions& opts, double slow_factor) {
  rep.findings = analyze_nodes(rep.nodes, rep.expect);
  if (opts.clock_is_warning)
    for (Finding& f : rep.findings)
      if (f.check == "clock" && f.status == Status::FAIL) f.status = Status::WARN;
  if (opts.network) {
    auto more = analyze_network(rep.nodes, rep.net, slow_factor);
    rep.findings.insert(rep.findings.end(), more.begin(), more.end());
  }
}

// The checks over `plans` (each identified by its node_rank), with job's config,
// run directory and dtrain path.
Report run_checks(const launch::Job& job, const launch::NodeSpawner& spawner, const DoctorOptions& opts,
                  const std::vector<launch::NodePlan>& plans) {
  const auto t_begin = Clock::now();
  const auto& dc = job.cfg.doctor;
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(dc.timeout));
  Report rep;
  rep.run_dir = job.run_dir;
  rep.network = opts.network;
  rep.expect = expectations_for(job, opts);
  Expectations& ex = rep.expect;
  Probe pr;
  index_nodes(plans, pr);

  // The launcher's nonce first: every node looks for it.
  std::error_code ec;
  const bool run_dir_existed = fs::exists(job.run_dir, ec);
  ex.nonces["launcher"] = random_hex(16);
  for (int k : pr.which) ex.nonces[node_nonce_name(k)] = random_hex(16);
  ex.launcher_write_error = nonce_write(job.run_dir, pr.session, "launcher", ex.nonces["launcher"]);

  if (opts.network) open_network_store(job, pr);
  start_nodes(job, spawner, opts, plans, pr, rep);
  const nlohmann::json world = wait_for_facts(pr, Clock::now() + timeout);
  if (pr.store) pr.store->set(fmt::format("doctor/{}/world", pr.session), world.dump());
  close_and_wait(job, opts, pr, world.size(), timeout, rep);
  if (opts.network) rep.net = gather_links(pr, dc.slow_factor);

  // The session's files as the launcher sees them, read last: a node writes its nonce
  // before it reports its facts, and on a loaded machine a report may come after phase 1's
  // deadline (read there, such a node was blamed for a run directory it does share).
  ex.launcher_seen = nonces_read(job.run_dir, pr.session);
  // Then they go, and an empty run directory the check created goes too.
  fs::remove_all(session_dir(job.run_dir, pr.session), ec);
  fs::remove(fs::path(job.run_dir) / ".doctor", ec);  // only when empty
  if (!run_dir_existed) fs::remove(job.run_dir, ec);  // only when empty

  add_findings(rep, opts, dc.slow_factor);
  rep.seconds = std::chrono::duration<double>(Clock::now() - t_begin).count();
  return rep;
}

}  // namespace

Report doctor_run(const launch::Job& job, const launch::NodeSpawner& spawner, const DoctorOptions& opts) {
  std::vector<launch::NodePlan> plans;
  for (size_t k = 0; k < job.plan.nodes.size(); ++k)
    if (opts.nodes.empty() || std::find(opts.nodes.begin(), opts.nodes.end(), static_cast<int>(k)) != opts.nodes.end())
      plans.push_back(job.plan.nodes[k]);
  for (int k : opts.nodes)
    DT_ENFORCE(k >= 0 && k < static_cast<int>(job.plan.nodes.size()), InternalError, "doctor: node {} of {}", k,
               job.plan.nodes.size());
  return run_checks(job, spawner, opts, plans);
}

Report preflight(const launch::Job& job, const launch::NodeSpawner& spawner, const std::vector<int>& nodes,
                 const std::string& expected_build_id) {
  DoctorOptions o;
  o.expected_build_id = expected_build_id;
  o.network = false;
  o.nodes = nodes;
  o.clock_is_warning = true;
  return doctor_run(job, spawner, o);
}

Report preflight_nodes(const launch::Job& job, const launch::NodeSpawner& spawner,
                       const std::vector<launch::NodePlan>& nodes, const std::string& expected_build_id) {
  DoctorOptions o;
  o.expected_build_id = expected_build_id;
  o.network = false;
  o.clock_is_warning = true;
  return run_checks(job, spawner, o, nodes);
}

launch::PreflightVerdict preflight_verdict(const Report& r) {
  launch::PreflightVerdict v;
  if (r.ok()) return v;
  auto failed = r.failed_nodes();
  v.node = failed.empty() ? 0 : failed.front();
  v.why = preflight_message(r);
  // A host key mismatch, an unknown host under the strict policy or refused credentials
  // fail every retry the same way: the launcher does not spend restarts on them.
  for (const NodeObservation& n : r.nodes) v.permanent = v.permanent || n.start_refused;
  return v;
}

std::string preflight_message(const Report& r) {
  std::string s;
  for (const Finding& f : r.findings) {
    if (f.status != Status::FAIL) continue;
    if (!s.empty()) s += "\n";
    s += f.node >= 0 ? fmt::format("node {} ({}): {}: {}", f.node, f.host, f.check, f.detail)
                     : fmt::format("{}: {}", f.check, f.detail);
    if (!f.advice.empty()) s += "; " + f.advice;
  }
  return s;
}

}  // namespace dtrain::doctor
