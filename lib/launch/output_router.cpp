// OutputRouter: the nodes' lines to the terminal and logs/*.log; rank 0's progress
// records to the live view and the straggler check.
#include "launch/output_router.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <system_error>

namespace fs = std::filesystem;

namespace dtrain::launch {

NodeLine node_line_parse(std::string_view text) {
  NodeLine l{.body = text};
  if (text.rfind("[node", 0) == 0) {
    auto r = text.find(" rank");
    auto close = text.find("] ");
    if (r != std::string_view::npos && close != std::string_view::npos && r < close) {
      l.rank = std::atoi(std::string(text.substr(r + 5, close - r - 5)).c_str());
      l.body = text.substr(close + 2);
    }
  }
  return l;
}

// ---------------------------------------------------------------------------
// LauncherTerminal

LauncherTerminal::LauncherTerminal(bool echo) : echo_(echo), progress_(::isatty(STDOUT_FILENO) != 0, 0) {}

void LauncherTerminal::say(std::FILE* f, const std::string& prefix, std::string_view text) {
  if (!echo_) return;
  end_status_line();
  std::fwrite(prefix.data(), 1, prefix.size(), f);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

void LauncherTerminal::show(const report::ProgressRecord& rec) {
  if (!echo_) return;
  std::string shown;
  progress_.show(rec, &shown);
  std::fwrite(shown.data(), 1, shown.size(), stdout);
  std::fflush(stdout);
}

void LauncherTerminal::end_status_line() {
  std::string nl = progress_.interrupt();
  if (!nl.empty()) {
    std::fwrite(nl.data(), 1, nl.size(), stdout);
    std::fflush(stdout);
  }
}

// ---------------------------------------------------------------------------
// StragglerWatch

void StragglerWatch::set_plan(const Plan& plan, int round) {
  rank_where_.clear();
  for (const NodePlan& n : plan.nodes)
    for (size_t i = 0; i < n.ranks.size(); ++i) rank_where_.emplace_back(n.node_rank, n.host.destination());
  stragglers_ = report::StragglerDetector(stragglers_.factor(), stragglers_.window());
  flagged_.clear();
  round_ = round;
}

std::pair<int, std::string> StragglerWatch::where(int rank) const {
  return rank < static_cast<int>(rank_where_.size()) ? rank_where_[static_cast<size_t>(rank)]
                                                     : std::pair<int, std::string>{-1, "?"};
}

void StragglerWatch::check(const report::RankTimes& t, LauncherTerminal& term) {
  const auto& now = stragglers_.add(t.compute_ms, t.comm_ms);
  std::map<int, report::Straggler> cur;
  for (const auto& x : now) cur[x.rank] = x;
  std::string flag;
  for (const auto& [r, x] : cur) {
    const auto [node, host] = where(r);
    if (!flag.empty()) flag += ", ";
    flag += fmt::format("rank {} ({}) {:.1f}x", r, host, x.ratio);
    if (flagged_.count(r)) continue;
    const std::string msg = fmt::format(
        "straggler: rank {} on {} (node {}) computes {:.1f} ms per step, {:.1f}x the median rank's {:.1f} ms, for {} "
        "progress records in a row (fault_tolerance.straggler_factor {:g}, straggler_window {}); its peers wait for "
        "it in every collective",
        r, host, node, x.compute_ms, x.ratio, x.median_ms, x.records, stragglers_.factor(), stragglers_.window());
    term.say(stderr, "", "[dtrain] warning: " + msg);
    events_.push_back(
        {.kind = report::EventKind::STRAGGLER,
         .round = round_,
         .node = node >= 0 ? std::optional<int>(node) : std::nullopt,
         .host = host,
         .detail = {{"rank", r}, {"compute_ms", x.compute_ms}, {"median_ms", x.median_ms}, {"ratio", x.ratio}}});
  }
  for (const auto& [r, x] : flagged_)
    if (!cur.count(r)) {
      const std::string host = where(r).second;
      term.say(stderr, "",
               fmt::format("[dtrain] straggler: rank {} on {} is no longer slower than {:g}x the median", r, host,
                           stragglers_.factor()));
      events_.push_back(
          {.kind = report::EventKind::STRAGGLER_RECOVERED, .round = round_, .host = host, .detail = {{"rank", r}}});
    }
  flagged_ = std::move(cur);
  term.progress().set_flag(flag.empty() ? "" : "straggler " + flag);
}

// ---------------------------------------------------------------------------
// OutputRouter

OutputRouter::OutputRouter(const std::string& run_dir, RunFiles& files, bool echo, bool tee_all,
                           double straggler_factor, int straggler_window)
    : dir_(fs::path(run_dir) / "logs"), files_(files), tee_all_(tee_all), term_(echo),
      stragglers_(straggler_factor, straggler_window) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
}

void OutputRouter::set_plan(const Plan& plan, int round) {
  std::lock_guard<std::mutex> lock(mu_);
  stragglers_.set_plan(plan, round);
  term_.progress().set_flag("");
  record_warned_ = false;
}

void OutputRouter::line(int node, Stream s, std::string_view text) {
  const NodeLine l = node_line_parse(text);
  // Rank 0's progress records (report/progress_record.h): the live view, the straggler
  // check and the human line in its log; never shown as they are.
  std::optional<report::ProgressRecord> rec;
  std::string record_error;
  if (l.rank == 0 && s == Stream::STDOUT) rec = report::progress_record_parse(l.body, &record_error);
  if (l.rank == 0 && s == Stream::STDOUT && !started_ &&
      (l.body.rfind("train: ", 0) == 0 || l.body.rfind("resumed from step ", 0) == 0 || rec))
    started_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  // An agent's own warning or error (e.g. why it cannot reach the store) explains a
  // node that fails or never heartbeats: kept for the failure message.
  if (l.rank < 0 && s == Stream::STDERR &&
      (text.find("error: ") != std::string_view::npos || text.find("warning: ") != std::string_view::npos))
    agent_said_[node] = std::string(text);
  if (rec) {
    record_line(*rec);
    return;
  }
  // A record this launcher cannot read (another dtrain build on the node, damage): said
  // once a round; the line itself goes on as any other line.
  if (!record_error.empty() && !record_warned_) {
    record_warned_ = true;
    term_.say(stderr, "",
              fmt::format("[dtrain] warning: rank 0 sent a progress record this launcher cannot read: {}; the live "
                          "view and the straggler check skip such records (the line is kept in logs/rank0.log)",
                          record_error));
  }
  echo_line(node, l, s, text);
  std::string file = l.rank >= 0 ? fmt::format("rank{}.log", l.rank) : fmt::format("node{}.log", node);
  std::string record(l.body);
  record.push_back('\n');
  files_.append((dir_ / file).string(), record);
}

void OutputRouter::record_line(const report::ProgressRecord& rec) {
  if (!rec.times.compute_ms.empty()) stragglers_.check(rec.times, term_);
  files_.append((dir_ / "rank0.log").string(), report::progress_line(rec) + "\n");
  term_.show(rec);
}

void OutputRouter::echo_line(int node, const NodeLine& l, Stream s, std::string_view text) {
  if (l.rank == 0 && s == Stream::STDOUT) term_.say(stdout, "", l.body);
  else if (l.rank < 0) term_.say(stderr, fmt::format("[node{}] ", node), text);
  else if (s == Stream::STDERR || tee_all_) term_.say(s == Stream::STDOUT ? stdout : stderr, "", text);
}

bool OutputRouter::take_started(bool always_now) {
  if (started_taken_ || !(always_now || started_)) return false;
  started_taken_ = true;
  return true;
}

std::string OutputRouter::agent_said(int node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agent_said_.find(node);
  return it == agent_said_.end() ? "" : it->second;
}

void OutputRouter::set_restarts(int restarts) {
  std::lock_guard<std::mutex> lock(mu_);
  agent_said_.clear();  // a new round: the previous agents' words no longer apply
  term_.progress().set_restarts(restarts);
}

std::vector<report::Event> OutputRouter::take_events() {
  std::lock_guard<std::mutex> lock(mu_);
  return stragglers_.take_events();
}

void OutputRouter::resource_lines(const std::vector<std::string>& lines) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!term_.echo() || lines.empty()) return;
  for (const auto& l : lines) term_.say(stdout, "", "[resources] " + l);
}

void OutputRouter::resource_alert(const report::Event& ev) {
  std::lock_guard<std::mutex> lock(mu_);
  term_.say(stderr, "",
            fmt::format("[resources] alert {} on node{} {}: {}", ev.detail.value("alert", ""), ev.node.value_or(-1),
                        ev.host.value_or("?"), ev.why.value_or("")));
}

}  // namespace dtrain::launch
