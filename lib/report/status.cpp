// Run status: liveness of the launcher, rounds and failures, training progress, the
// latest checkpoint and per-node heartbeat ages, gathered from the run directory.
#include "report/jsonl.h"
#include "report/round_history.h"
#include "report/status.h"
#include "report/straggler.h"

#include "core/check.h"
#include "core/input_file.h"
#include "core/unix_time.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <tuple>
#include <cstdlib>
#include <functional>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dtrain::report {

namespace {

using nlohmann::json;

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); -1 if unknown.
int64_t pid_start_ticks(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // The command name (field 2) may hold spaces and ')': fields resume after the last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return -1;
  try {
    return std::stoll(field);
  } catch (const std::exception&) {
    return -1;
  }
}

// A zombie (ended, not yet reaped by its parent) is not alive: a launcher that exited is
// not "running" because whatever started it has not collected its exit code yet.
bool pid_alive(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || (stat[close + 2] != 'Z' && stat[close + 2] != 'X');
}

// The process that wrote a run's record (the launcher, or rank 0 of dtrain run) is alive:
// its pid exists and, where its start time was recorded, started then (a recycled pid
// belongs to some other process started at another time).
bool owner_alive(int pid, int64_t pid_start) {
  if (!pid_alive(pid)) return false;
  if (pid_start < 0) return true;
  const int64_t now_start = pid_start_ticks(pid);
  return now_start < 0 || now_start == pid_start;
}

// Writes text to path atomically: a reader sees the old or the new file, never half.
// IoError naming the file and the system's reason; a failed write leaves no tmp file (on
// a full disk it would hold on to the space).
void write_atomic(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp" + std::to_string(::getpid());
  const std::string data = text + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  DT_ENFORCE(fd >= 0, IoError, "cannot write {}: {}", tmp.string(), std::strerror(errno));
  int err = 0;
  for (size_t off = 0; off < data.size() && err == 0;) {
    const ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    // write() of a regular file returns 0 only when nothing more fits (errno is not set).
    if (w <= 0) err = w < 0 ? errno : ENOSPC;
    else off += static_cast<size_t>(w);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot write {}: {}", tmp.string(), std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    DT_THROW(IoError, "cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
  }
}

// A file the launcher writes atomically (launcher.json, nodes.json): missing is nullopt,
// anything but one JSON object is corruption (IoError naming the file).
std::optional<json> read_json(const fs::path& path) {
  std::string why;
  InputFile f = input_file_try_open(path.string(), kInputMetaMaxBytes, &why);
  if (why == "does not exist") return std::nullopt;
  DT_ENFORCE(why.empty(), IoError,
             "{} {}: the run directory was changed by something else (the launcher writes a regular file there)",
             path.string(), why);
  const std::string text = f.read_all("run directory file", kInputMetaMaxBytes);
  try {
    json j = json::parse(text);
    if (j.is_object()) return j;
    DT_THROW(IoError,
             "{} is corrupt: it holds a JSON {}, not the object the launcher writes there; the file was "
             "damaged (edited, or written by something else)",
             path.string(), j.type_name());
  } catch (const json::parse_error& e) {
    // e.byte is 1-based; the line is what a reader looks for.
    const size_t at = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    const long line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
    DT_THROW(IoError,
             "{}:{}: corrupt: not valid JSON ({}); the file was damaged (edited, or written by something "
             "else)",
             path.string(), line, e.what());
  }
}

// What `dtrain launch` leaves in a run directory before its first rank starts, and what
// the ranks add: a directory holding none of these is not a run.
constexpr const char* RUN_MARKERS[] = {"config.yaml", "launcher.json", "events.jsonl", "metrics.jsonl",
                                       "hostfile",    "nodes.json",    "checkpoints"};

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

std::string duration(double s) {
  if (s < 0) s = 0;
  auto t = static_cast<int64_t>(s);
  if (t >= 86400) return fmt::format("{}d{:02}h", t / 86400, (t % 86400) / 3600);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{:.1f} s", s);
}

std::string rate(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

}  // namespace

// ---------------------------------------------------------------------------
// Writers

void status_write_launcher(const std::string& run_dir, const std::string& job_id) {
  json j{{"pid", ::getpid()},
         {"host", this_host()},
         {"job_id", job_id},
         {"started_ms", unix_ms()},
         {"pid_start", pid_start_ticks(::getpid())}};
  write_atomic(fs::path(run_dir) / "launcher.json", j.dump());
}

std::vector<Event> status_external_round_start(const std::string& run_dir, int world_size,
                                               const std::string& started_by) {
  const std::vector<json> events = read_jsonl(fs::path(run_dir) / "events.jsonl");
  const int round = static_cast<int>(round_history(events).rounds.size());
  std::optional<json> open;  // the last round_start when nothing followed it
  for (const json& e : events) {
    const std::string ev = get_or<std::string>(e, "event", "");
    if (ev.empty()) continue;
    open = ev == "round_start" ? std::optional<json>(e) : std::nullopt;
  }
  std::vector<Event> out;
  const int64_t now = unix_ms();
  if (open) {
    const bool external = !get_or<std::string>(*open, "started_by", "").empty();
    const std::string why =
        external ? fmt::format("ended without a final event: its rank 0 (pid {} on {}) was killed or lost",
                               get_or<int>(*open, "pid", 0), get_or<std::string>(*open, "host", "?"))
                 : "ended without a final event: its launcher was killed or lost";
    out.push_back(
        {.kind = EventKind::FAILURE, .round = get_or<int>(*open, "round", round - 1), .time_ms = now, .why = why});
  }
  out.push_back(
      {.kind = EventKind::ROUND_START,
       .round = round,
       .time_ms = now,
       .host = this_host(),
       .world_size = world_size,
       .detail = {{"started_by", started_by}, {"pid", ::getpid()}, {"pid_start", pid_start_ticks(::getpid())}}});
  return out;
}

void status_write_nodes(const std::string& run_dir, int round, const std::vector<NodeHealth>& nodes,
                        double straggler_factor, int straggler_window) {
  json arr = json::array();
  for (const auto& n : nodes) {
    json x{{"node", n.node}, {"host", n.host}, {"heartbeat_age_s", n.heartbeat_age_s}, {"state", n.state}};
    if (n.first_rank >= 0) {
      x["first_rank"] = n.first_rank;
      x["num_ranks"] = n.num_ranks;
    }
    arr.push_back(std::move(x));
  }
  json j{{"time_ms", unix_ms()}, {"round", round}, {"nodes", arr}};
  if (straggler_factor > 0 && straggler_window > 0) {
    j["straggler_factor"] = straggler_factor;
    j["straggler_window"] = straggler_window;
  }
  write_atomic(fs::path(run_dir) / "nodes.json", j.dump());
}

// ---------------------------------------------------------------------------
// Reading

const char* run_state_name(RunState s) {
  switch (s) {
    case RunState::NOT_STARTED: return "not started";
    case RunState::RUNNING: return "running";
    case RunState::FINISHED: return "finished";
    case RunState::FAILED: return "failed";
    case RunState::INTERRUPTED: return "interrupted";
    case RunState::LOST: return "lost";
  }
  return "?";
}

namespace {

void require_run_dir(const fs::path& dir, const std::string& run_dir) {
  std::error_code ec;
  DT_ENFORCE(fs::is_directory(dir, ec), IoError, "{} is not a run directory (no such directory)", run_dir);
  bool any_marker = false;
  for (const char* m : RUN_MARKERS) any_marker = any_marker || fs::exists(dir / m, ec);
  if (!any_marker)
    DT_THROW(UsageError,
             "{} is not a dtrain run directory: it holds none of config.yaml, launcher.json, events.jsonl, "
             "metrics.jsonl, hostfile, nodes.json or checkpoints/ (what dtrain launch writes there); give the "
             "directory the job ran in (its --output-dir or training.output_dir)",
             run_dir);
}

void read_launcher(const fs::path& dir, RunStatus& st) {
  auto l = read_json(dir / "launcher.json");
  if (!l) return;
  st.have_launcher = true;
  st.launcher_pid = get_or<int>(*l, "pid", 0);
  st.launcher_host = get_or<std::string>(*l, "host", "");
  st.job_id = get_or<std::string>(*l, "job_id", "");
  st.started_ms = get_or<int64_t>(*l, "started_ms", 0);
  const int64_t pid_start = get_or<int64_t>(*l, "pid_start", -1);
  st.launcher_remote = !st.launcher_host.empty() && st.launcher_host != this_host();
  if (!st.launcher_remote) st.launcher_alive = owner_alive(st.launcher_pid, pid_start);
}

MembershipRecord membership_of(const json& e, int round, int64_t t) {
  MembershipRecord m;
  m.round = round;
  m.time_ms = t;
  if (e.contains("hosts") && e["hosts"].is_array())
    for (const json& h : e["hosts"])
      if (h.is_string()) m.hosts.push_back(h.get<std::string>());
  m.world_size = get_or<int>(e, "world_size", 0);
  if (e.contains("changes") && e["changes"].is_array())
    for (const json& c : e["changes"])
      if (c.is_object())
        m.changes.push_back(fmt::format("{} {}: {}", get_or<std::string>(c, "change", "?"),
                                        get_or<std::string>(c, "host", "?"), get_or<std::string>(c, "cause", "")));
  m.batch = get_or<std::string>(e, "batch", "");
  m.problem = get_or<std::string>(e, "problem", "");
  return m;
}

RoundFailure failure_of(const json& e, int round, int64_t t, bool round_started) {
  RoundFailure f;
  f.round = round;
  f.node = event_node(e);
  f.interrupted = event_interrupted(e);
  f.why = get_or<std::string>(e, "why", "");
  f.exit_code = get_or<int>(e, "exit_code", 0);
  f.time_ms = t;
  f.started = round_started;
  f.retry = get_or<bool>(e, "retry", false);
  return f;
}

// events.jsonl: the rounds, membership changes, failures and resource alerts, and the last
// event. Returns the pid start time of a `dtrain run` rank 0 that owns the record (-1: none).
int64_t read_events(const fs::path& dir, RunStatus& st) {
  int64_t ext_pid_start = -1;
  // Every record of events.jsonl names its event: one that does not is damage, not a
  // record to skip (skipping them all would read as "not started").
  const std::vector<json> events =
      read_jsonl_strict(dir / "events.jsonl", {"event"}, {"round", "time_ms", "world_size", "exit_code", "pid"});
  const RoundHistory rounds = round_history(events);
  st.rounds = static_cast<int>(rounds.rounds.size());
  st.rounds_not_started = rounds.not_started;
  st.restarts = rounds.restarts;
  st.resizes = rounds.resizes;
  st.resumes = rounds.resumes;
  bool round_started = true;  // the last round record was a round_start
  for (const json& e : events) {
    const std::string ev = get_or<std::string>(e, "event", "");
    const int64_t t = get_or<int64_t>(e, "time_ms", 0);
    const int round = get_or<int>(e, "round", 0);
    if (ev.empty()) continue;
    // A rank's resource alert says nothing of the job's state (the last event decides it).
    if (auto a = resource_alert_of(e)) {
      st.resource_alerts.push_back(std::move(*a));
      continue;
    }
    st.last_event = ev;
    st.last_event_ms = t;
    if (ev == "round_start" || ev == "round_not_started") round_started = ev == "round_start";
    if (ev == "round_start") {
      st.started_by = get_or<std::string>(e, "started_by", "");
      if (!st.started_by.empty()) {  // dtrain run: its rank 0 owns the record
        st.launcher_pid = get_or<int>(e, "pid", 0);
        st.launcher_host = get_or<std::string>(e, "host", "");
        ext_pid_start = get_or<int64_t>(e, "pid_start", -1);
      }
    } else if (ev == "membership") {
      st.membership.push_back(membership_of(e, round, t));
    } else if (ev == "failure") {
      st.failures.push_back(failure_of(e, round, t, round_started));
    }
  }
  return ext_pid_start;
}

using RecordTimes = std::vector<std::pair<std::vector<double>, std::vector<double>>>;  // compute, comm per record

// metrics.jsonl: the last loss and eval loss; returns the per-rank times of each record.
RecordTimes read_metrics(const fs::path& dir, RunStatus& st) {
  RecordTimes rank_times;
  for (const json& m : read_jsonl(dir / "metrics.jsonl")) {
    auto step = m.find("step");
    if (step == m.end() || !step->is_number()) continue;
    if (auto rc = m.find("rank_compute_ms"); rc != m.end() && rc->is_array()) {
      std::vector<double> v, w;
      for (const json& x : *rc) v.push_back(x.is_number() ? x.get<double>() : 0.0);
      if (auto cm = m.find("rank_comm_ms"); cm != m.end() && cm->is_array())
        for (const json& x : *cm) w.push_back(x.is_number() ? x.get<double>() : 0.0);
      rank_times.emplace_back(std::move(v), std::move(w));
    }
    if (m.contains("loss") && m["loss"].is_number()) {
      st.last_step = step->get<int64_t>();
      st.last_loss = m["loss"].get<double>();
      st.tokens_per_s = get_or<double>(m, "tokens_per_s", 0.0);
      st.last_metrics = metrics_record_get(m);  // none in records before named metrics
    }
    if (m.contains("eval_loss") && m["eval_loss"].is_number()) {
      st.last_eval_step = step->get<int64_t>();
      st.last_eval_loss = m["eval_loss"].get<double>();
    }
  }
  return rank_times;
}

// The checkpoint checkpoints/latest names, or why it names none.
void read_latest(const fs::path& dir, RunStatus& st) {
  std::error_code ec;
  std::string why;
  InputFile f = input_file_try_open((dir / "checkpoints" / "latest").string(), 4096, &why);
  if (why == "does not exist") return;
  if (!why.empty()) {
    st.checkpoint_note = fmt::format("checkpoints/latest {}", why);
    return;
  }
  std::istringstream in(f.read_all("checkpoints/latest", 4096));
  std::string name;
  std::getline(in, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    st.checkpoint_note = fmt::format("checkpoints/latest holds '{}', not a checkpoint name", name);
  else if (!fs::is_directory(dir / "checkpoints" / name, ec))
    st.checkpoint_note = fmt::format("checkpoints/latest names {}, but checkpoints/{} does not exist", name, name);
  else if (!fs::exists(dir / "checkpoints" / name / "manifest.json", ec))
    st.checkpoint_note = fmt::format("checkpoints/{} has no manifest.json (incomplete)", name);
  else st.checkpoint = name;
}

// What a resume would load: latest when it verifies, else the newest older checkpoint
// that does (train/checkpoint_load.cpp's order); none when none does, saying why.
void pick_resume_checkpoint(const fs::path& dir, RunStatus& st, const CheckpointProblem& checkpoint_problem) {
  std::error_code ec;
  if (!checkpoint_problem || !fs::is_directory(dir / "checkpoints", ec)) return;
  std::vector<std::pair<long long, std::string>> older;
  long long limit = -1;
  if (!st.checkpoint.empty() && st.checkpoint.rfind("step", 0) == 0) limit = std::atoll(st.checkpoint.c_str() + 4);
  for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n.rfind("step", 0) == 0 && n.find_first_not_of("0123456789", 4) == std::string::npos &&
        e.is_directory(ec))
      older.emplace_back(std::atoll(n.c_str() + 4), n);
  }
  std::sort(older.begin(), older.end(), std::greater<>());
  std::vector<std::string> candidates;
  if (!st.checkpoint.empty()) candidates.push_back(st.checkpoint);
  for (const auto& [k, n] : older)
    if (limit < 0 ? st.checkpoint.empty() : k < limit) candidates.push_back(n);
  std::vector<std::string> refused;
  std::string usable;
  for (const auto& n : candidates) {
    const std::string why = checkpoint_problem((dir / "checkpoints" / n).string());
    if (why.empty()) {
      usable = n;
      break;
    }
    refused.push_back(why);
  }
  std::string reasons;
  for (const auto& r : refused) reasons += (reasons.empty() ? "" : "; ") + r;
  if (!refused.empty())
    st.checkpoint_note =
        usable.empty() ? fmt::format("none verifies: {}", reasons) : fmt::format("newer ones skipped: {}", reasons);
  if (!candidates.empty()) st.checkpoint = usable;
}

void read_nodes(const fs::path& dir, RunStatus& st) {
  auto n = read_json(dir / "nodes.json");
  if (!n) return;
  st.have_nodes = true;
  st.nodes_time_ms = get_or<int64_t>(*n, "time_ms", 0);
  st.nodes_round = get_or<int>(*n, "round", 0);
  if (n->contains("nodes") && (*n)["nodes"].is_array())
    for (const json& x : (*n)["nodes"]) {
      if (!x.is_object()) continue;
      NodeHealth h;
      h.node = get_or<int>(x, "node", 0);
      h.host = get_or<std::string>(x, "host", "");
      h.heartbeat_age_s = get_or<double>(x, "heartbeat_age_s", -1.0);
      h.state = get_or<std::string>(x, "state", "");
      h.first_rank = get_or<int>(x, "first_rank", -1);
      h.num_ranks = get_or<int>(x, "num_ranks", 0);
      st.nodes.push_back(std::move(h));
    }
  st.straggler_factor = get_or<double>(*n, "straggler_factor", 0.0);
  st.straggler_window = get_or<int>(*n, "straggler_window", 0);
}

// The launcher's straggler rule over the records (a record of another world size, a
// later round's, starts it over); hosts from the latest round's placement.
void flag_stragglers(RunStatus& st, const RecordTimes& rank_times) {
  if (st.straggler_factor <= 1.0 || st.straggler_window <= 0 || rank_times.empty()) return;
  StragglerDetector det(st.straggler_factor, st.straggler_window);
  for (const auto& [compute, comm] : rank_times) det.add(compute, comm);
  for (const Straggler& x : det.flagged()) {
    StragglerFlag f{x.rank, "?", x.compute_ms, x.median_ms, x.ratio, x.records};
    for (const NodeHealth& h : st.nodes)
      if (h.first_rank >= 0 && x.rank >= h.first_rank && x.rank < h.first_rank + h.num_ranks) f.host = h.host;
    st.stragglers.push_back(std::move(f));
  }
}

// The run's state from its launcher (or `dtrain run` rank 0) and its last event.
void decide_state(RunStatus& st, int64_t ext_pid_start) {
  if (!st.started_by.empty()) {
    // Rank 0 of dtrain run is alive exactly while its round runs.
    st.launcher_remote = !st.launcher_host.empty() && st.launcher_host != this_host();
    st.launcher_alive = false;
    if (st.last_event == "round_start" && !st.launcher_remote)
      st.launcher_alive = owner_alive(st.launcher_pid, ext_pid_start);
  }
  const std::string& last_event = st.last_event;
  if (st.launcher_alive) st.state = RunState::RUNNING;
  else if (last_event == "finished") st.state = RunState::FINISHED;
  else if (last_event == "failure")
    st.state = st.failures.back().interrupted ? RunState::INTERRUPTED : RunState::FAILED;
  else if (last_event == "round_start" || last_event == "round_not_started")
    st.state = st.launcher_remote ? RunState::RUNNING : RunState::LOST;
  else st.state = RunState::NOT_STARTED;
}

// A `dtrain run` job has no launcher to copy the ranks' alert records into events.jsonl:
// they are read from the last MiB of each rank's file (thousands of samples; older ones
// are not shown), beside any events.jsonl holds (a launcher's earlier rounds), once each.
void external_alerts_add(const std::string& run_dir, RunStatus& st) {
  auto key = [](const ResourceAlertRecord& a) { return std::make_tuple(a.time_ms, a.rank, a.node, a.alert); };
  std::set<std::tuple<int64_t, int, int, std::string>> have;
  for (const auto& a : st.resource_alerts) have.insert(key(a));
  for (auto& a : resource_alerts_read(run_dir, 1u << 20))
    if (have.insert(key(a)).second) st.resource_alerts.push_back(std::move(a));
  std::stable_sort(st.resource_alerts.begin(), st.resource_alerts.end(),
                   [](const auto& a, const auto& b) { return a.time_ms < b.time_ms; });
}

}  // namespace

RunStatus status_read(const std::string& run_dir, const CheckpointProblem& checkpoint_problem) {
  const fs::path dir(run_dir);
  require_run_dir(dir, run_dir);
  RunStatus st;
  st.run_dir = run_dir;
  read_launcher(dir, st);
  const int64_t ext_pid_start = read_events(dir, st);
  const RecordTimes rank_times = read_metrics(dir, st);
  st.resources = resource_read(dir.string());
  if (!st.started_by.empty()) external_alerts_add(dir.string(), st);
  read_latest(dir, st);
  pick_resume_checkpoint(dir, st, checkpoint_problem);
  read_nodes(dir, st);
  flag_stragglers(st, rank_times);
  decide_state(st, ext_pid_start);
  return st;
}

namespace {

// The status report being written: rows of "key  value" and indented detail lines.
struct StatusText {
  const RunStatus& st;
  int64_t now_ms;
  std::string out;

  void row(const char* key, const std::string& value) { out += fmt::format("{:<11}{}\n", key, value); }
  std::string ago(int64_t t) const { return duration(static_cast<double>(now_ms - t) / 1000.0); }
};

// `dtrain resume` only where there is a checkpoint to continue from: after a "no usable
// checkpoint" failure (exit 7) it would fail the same way, and without any checkpoint
// it starts again from step 0.
std::string next_step(const RunStatus& st, int exit_code) {
  if (exit_code == static_cast<int>(Exit::CHECKPOINT))
    return fmt::format(
        "no usable checkpoint under {}/checkpoints (the failure says why each one was refused): "
        "set the damaged ones aside, or start a new run with dtrain launch --output-dir DIR",
        st.run_dir);
  if (st.checkpoint.empty())
    return fmt::format("no usable checkpoint to continue from{}: dtrain resume {} would start again from step 0",
                       st.checkpoint_note.empty() ? "" : " (" + st.checkpoint_note + ")", st.run_dir);
  return fmt::format("continue with: dtrain resume {} (from {})", st.run_dir, st.checkpoint);
}

// The "state" row: the state, who runs it or how it ended, and what to do next.
std::string state_text(const StatusText& t) {
  const RunStatus& st = t.st;
  std::string state = run_state_name(st.state);
  switch (st.state) {
    case RunState::RUNNING:
      if (!st.started_by.empty())
        state += fmt::format(": dtrain run under {}, rank 0 pid {} on {}{}", st.started_by, st.launcher_pid,
                             st.launcher_host, st.launcher_remote ? " (liveness not checkable from this host)" : "");
      else if (st.launcher_remote)
        state += fmt::format(": launcher on {} (pid {}; liveness not checkable from this host)", st.launcher_host,
                             st.launcher_pid);
      else state += fmt::format(": launcher pid {} on {}", st.launcher_pid, st.launcher_host);
      if (st.started_ms > 0) state += fmt::format(", started {} ago", t.ago(st.started_ms));
      if (st.last_event == "failure" && st.failures.back().retry) state += "; restarting after a failure";
      break;
    case RunState::FINISHED: state += fmt::format(" {} ago", t.ago(st.last_event_ms)); break;
    case RunState::FAILED:
    case RunState::INTERRUPTED:
      if (!st.started_by.empty())
        state += fmt::format(
            " {} ago (exit code {}); {} restarts the processes (or start them again): they "
            "resume from the latest complete checkpoint",
            t.ago(st.last_event_ms), st.failures.back().exit_code, st.started_by);
      else
        state += fmt::format(" {} ago (exit code {}); {}", t.ago(st.last_event_ms), st.failures.back().exit_code,
                             next_step(st, st.failures.back().exit_code));
      break;
    case RunState::LOST:
      if (!st.started_by.empty()) {
        state += fmt::format(
            ": rank 0 of dtrain run (pid {} on {}) is gone without a final event (killed); {} "
            "restarts the processes (or start them again): they resume from the latest complete "
            "checkpoint",
            st.launcher_pid, st.launcher_host.empty() ? "?" : st.launcher_host, st.started_by);
        break;
      }
      state += fmt::format(
          ": the launcher (pid {} on {}) is gone without a final event (killed, or it could not "
          "write events.jsonl: see its output); {}",
          st.launcher_pid, st.launcher_host.empty() ? "?" : st.launcher_host, next_step(st, 0));
      break;
    case RunState::NOT_STARTED: break;
  }
  return state;
}

// Progress, checkpoint, and the rounds: restarts, failures, resumes, resizes, membership.
void history_rows(StatusText& t) {
  const RunStatus& st = t.st;
  std::string& out = t.out;
  if (st.last_step) {
    std::string p = fmt::format("step {}, loss {:.4f}", *st.last_step, st.last_loss);
    if (st.tokens_per_s > 0) p += fmt::format(", {} tokens/s", rate(st.tokens_per_s));
    if (st.last_eval_step) p += fmt::format("; eval_loss {:.4f} at step {}", st.last_eval_loss, *st.last_eval_step);
    t.row("progress", p);
    if (!st.last_metrics.empty()) {
      std::string m;
      for (const auto& [name, value] : st.last_metrics)
        m += fmt::format("{}{} {:.4f}", m.empty() ? "" : ", ", name, value);
      t.row("metrics", fmt::format("{} (step {})", m, *st.last_step));
    }
  } else {
    t.row("progress", "no training step logged yet");
  }

  if (!st.checkpoint.empty())
    t.row("checkpoint", st.checkpoint_note.empty() ? st.checkpoint : st.checkpoint + " (" + st.checkpoint_note + ")");
  else t.row("checkpoint", st.checkpoint_note.empty() ? "none" : "none (" + st.checkpoint_note + ")");

  std::string restarts = std::to_string(st.restarts);
  if (st.rounds_not_started > 0)
    restarts += fmt::format(" ({} round(s) could not start: no node ran)", st.rounds_not_started);
  t.row("restarts", restarts);
  for (const auto& f : st.failures) {
    std::string who = f.node ? fmt::format("node {}: ", *f.node) : "";
    out += fmt::format("  round {} {} {} ago: {}{}{}\n", f.round, f.started ? "failed" : "could not start",
                       t.ago(f.time_ms), who, f.why,
                       f.exit_code != 0 ? fmt::format(" [exit code {}]", f.exit_code) : std::string());
  }
  if (st.resumes > 0) t.row("resumes", fmt::format("{} (later launches by dtrain resume)", st.resumes));

  if (st.resizes > 0)
    t.row("resizes", fmt::format("{} (rounds stopped at a checkpoint to take a host back)", st.resizes));
  if (!st.membership.empty()) {
    t.row("membership", fmt::format("{} change(s) of the elastic job's nodes", st.membership.size()));
    for (const auto& m : st.membership) {
      std::string hosts;
      for (const auto& h : m.hosts) hosts += (hosts.empty() ? "" : " ") + h;
      if (!m.problem.empty())
        out += fmt::format("  round {} ({} ago): cannot run: {}\n", m.round, t.ago(m.time_ms), m.problem);
      else
        out += fmt::format("  round {} ({} ago): {} node(s), {} rank(s): {}\n", m.round, t.ago(m.time_ms),
                           m.hosts.size(), m.world_size, hosts);
      for (const auto& c : m.changes) out += fmt::format("    {}\n", c);
      if (!m.batch.empty()) out += fmt::format("    batch: {}\n", m.batch);
    }
  }
}

// The ranks and nodes now: stragglers, resources, resource alerts, node health.
void health_rows(StatusText& t) {
  const RunStatus& st = t.st;
  std::string& out = t.out;
  if (!st.stragglers.empty()) {
    t.row("stragglers", fmt::format("{} rank(s) slower than {:g}x the median for {}+ progress records in a row",
                                    st.stragglers.size(), st.straggler_factor, st.straggler_window));
    for (const auto& x : st.stragglers)
      out += fmt::format("  rank {} on {}: compute {:.1f} ms/step, {:.1f}x the median {:.1f} ms ({} records)\n", x.rank,
                         x.host, x.compute_ms, x.ratio, x.median_ms, x.records);
  }

  if (!st.resources.empty()) {
    t.row("resources", "latest sample of every rank, by node (resources/rank<R>.jsonl, monitor.interval)");
    out += resource_lines(st.resources, t.now_ms);
  }
  if (!st.resource_alerts.empty()) {
    // The newest few: each is one episode's start, the log keeps them all.
    constexpr size_t kShown = 5;
    t.row("alerts", fmt::format("{} resource alert(s) in events.jsonl{}{}", st.resource_alerts.size(),
                                st.started_by.empty() ? "" : " and the ranks' resources/rank<R>.jsonl",
                                st.resource_alerts.size() > kShown ? fmt::format(", the last {}", kShown) : ""));
    for (size_t i = st.resource_alerts.size() > kShown ? st.resource_alerts.size() - kShown : 0;
         i < st.resource_alerts.size(); ++i) {
      const auto& a = st.resource_alerts[i];
      out +=
          fmt::format("  {} ago node{} {} rank {}: {}: {}\n", t.ago(a.time_ms), a.node, a.host, a.rank, a.alert, a.why);
    }
  }

  if (st.have_nodes && !st.nodes.empty()) {
    const double lag = static_cast<double>(t.now_ms - st.nodes_time_ms) / 1000.0;
    t.row("nodes", fmt::format("round {}, as of {} ago", st.nodes_round, duration(lag)));
    for (const auto& n : st.nodes) {
      // Ended nodes (done / failed / stopped) are written without an age: nothing to say.
      const bool ended = n.state == "done" || n.state == "failed" || n.state == "stopped";
      // A node recorded as live by a launcher that is gone: the launcher could not write
      // its final record (a full disk) or was killed. Its ranks ended with it.
      if (!ended && st.state != RunState::RUNNING) {
        out += fmt::format("  node{} {} unknown: the launcher ended without recording how this node ended\n", n.node,
                           n.host);
        continue;
      }
      std::string hb = n.heartbeat_age_s >= 0 ? fmt::format("last heartbeat {} ago", duration(n.heartbeat_age_s + lag))
                       : ended                ? std::string()
                                              : std::string("no heartbeat yet");
      out += fmt::format("  node{} {}{} {}\n", n.node, n.host, n.state.empty() ? "" : " " + n.state, hb);
    }
  }
}

}  // namespace

std::string status_format(const RunStatus& st, int64_t now_ms) {
  StatusText t{st, now_ms, {}};
  t.row("run", st.job_id.empty() ? st.run_dir : fmt::format("{} (job {})", st.run_dir, st.job_id));
  t.row("state", state_text(t));
  history_rows(t);
  health_rows(t);
  return t.out;
}

std::string status_report(const std::string& run_dir, const CheckpointProblem& checkpoint_problem) {
  const int64_t now = unix_ms();
  return status_format(status_read(run_dir, checkpoint_problem), now);
}

}  // namespace dtrain::report
