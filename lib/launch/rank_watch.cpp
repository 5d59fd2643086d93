// Rank watch: the rank-side key names, the server snapshot and the check for ranks that
// stopped beating or stepping.
#include "launch/rank_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dtrain::launch {

using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// "4" for whole seconds, else "2.5": limits as the user wrote them.
std::string limit_text(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000);
  return fmt::format("{:g}", static_cast<double>(ms.count()) / 1000.0);
}

// The step a progress value names, or -1 ("done", empty, garbage).
int64_t step_of(const std::string& v) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 18) return -1;
  return std::strtoll(v.c_str(), nullptr, 10);
}

// The rank to blame among those over the step timeout (`stalled`, not empty), the ranks
// still within it (`watched`) that are part of the same stall named with it.
RankHang stalled_blame(std::vector<RankHang> stalled, const std::vector<RankHang>& watched) {
  // The rank the others wait for: at the step they are stuck on or before it, outside any
  // collective. Its own last report may be younger than the timeout (a loaded host
  // delivers reports late), but it is what the waiting ranks wait for, so it is named too.
  // A rank waiting in a collective is named as waiting however young its report: the
  // collective cannot return while a peer is stuck outside it (its report can trail the
  // stuck rank's by more than one poll when rank 0 also logs and gathers the step's times).
  int64_t stuck_step = 0;
  for (const RankHang& h : stalled) stuck_step = std::max(stuck_step, h.last_step);
  for (const RankHang& h : watched)
    if (h.waiting || h.last_step <= stuck_step) stalled.push_back(h);
  std::sort(stalled.begin(), stalled.end(), [](const RankHang& a, const RankHang& b) {
    if (a.waiting != b.waiting) return !a.waiting;
    if (a.last_step != b.last_step) return a.last_step < b.last_step;
    if (a.silent_s != b.silent_s) return a.silent_s > b.silent_s;
    return a.rank < b.rank;
  });
  RankHang h = stalled.front();
  for (size_t i = 1; i < stalled.size(); ++i) {
    h.others.push_back(stalled[i].rank);
    if (stalled[i].waiting) h.others_waiting.push_back(stalled[i].rank);
  }
  std::sort(h.others.begin(), h.others.end());
  std::sort(h.others_waiting.begin(), h.others_waiting.end());
  return h;
}

}  // namespace

constexpr const char* kWaiting = " waiting";

std::string rank_beat_name(int rank) { return fmt::format("rank{}", rank); }
std::string rank_progress_value(int64_t step, bool in_collective) {
  return fmt::format("{}{}", step, in_collective ? kWaiting : "");
}
std::string rank_info_key(int rank) { return fmt::format("rankinfo/rank{}", rank); }

// ---------------------------------------------------------------------------

const char* RankHang::kind_name() const {
  switch (kind) {
    case Kind::NO_FIRST_BEAT: return "no_heartbeat";
    case Kind::MISSED_BEATS: return "missed_heartbeats";
    case Kind::NO_STEP: return "no_step";
  }
  return "?";
}

std::string RankHang::describe(const RankWatchLimits& limits) const {
  std::string who = fmt::format("rank {} (local rank {}", rank, local_rank);
  if (pid > 0) who += fmt::format(", pid {}", pid);
  if (!hostname.empty() && hostname != host) who += fmt::format(" on {}", hostname);
  who += ")";
  std::string what;
  switch (kind) {
    case Kind::NO_FIRST_BEAT:
      what = fmt::format(
          "sent no heartbeat within {:.1f} s of its agent's first one: the rank process did not start "
          "or is stopped",
          silent_s);
      break;
    case Kind::MISSED_BEATS:
      what = fmt::format(
          "sent no heartbeat for {:.1f} s (fault_tolerance.heartbeat_timeout {} s): the process is "
          "hung (stopped, frozen or starved) while its agent is alive",
          silent_s, limit_text(limits.heartbeat_timeout));
      break;
    case Kind::NO_STEP: {
      what = fmt::format(
          "made no step for {:.1f} s (fault_tolerance.step_timeout {} s; last step {}) while its "
          "heartbeat goes on: {}",
          silent_s, limit_text(limits.step_timeout), last_step,
          waiting ? "waiting in a collective that does not return" : "stuck in its own work, outside any collective");
      auto list = [](const std::vector<int>& ranks) {
        std::string s = ranks.size() > 1 ? "ranks " : "rank ";
        for (size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ranks[i]);
        return s;
      };
      std::vector<int> busy;
      for (int r : others)
        if (std::find(others_waiting.begin(), others_waiting.end(), r) == others_waiting.end()) busy.push_back(r);
      if (!others_waiting.empty())
        what += fmt::format("; {} wait{} in a collective", list(others_waiting), others_waiting.size() > 1 ? "" : "s");
      if (!busy.empty()) what += fmt::format("; also without a step: {}", list(busy));
      break;
    }
  }
  return fmt::format("node {} ({}): {} {}", node, host, who, what);
}

// ---------------------------------------------------------------------------

RankWatchSnapshot rank_watch_snapshot(const rendezvous::StoreServer& server, const std::string& prefix) {
  RankWatchSnapshot s;
  s.beats = server.entries(prefix + "hb/");
  s.progress = server.entries(prefix + "progress/");
  s.info = server.entries(prefix + "rankinfo/");
  return s;
}

RankWatch::RankWatch(const Plan& plan, RankWatchLimits limits)
    : plan_(plan), limits_(limits), agent_seen_(plan.nodes.size()) {}

void RankWatch::fill_identity(const RankWatchSnapshot& s, RankHang& h) const {
  const NodePlan& node = plan_.nodes[static_cast<size_t>(h.node)];
  h.host = node.host.destination();
  h.local_rank = h.rank - node.first_rank;
  auto it = s.info.find(rank_beat_name(h.rank));
  if (it == s.info.end()) return;
  const std::string& v = it->second.value;  // "<pid> <hostname>"
  const size_t sp = v.find(' ');
  h.pid = std::atoi(v.substr(0, sp).c_str());
  if (sp != std::string::npos) h.hostname = v.substr(sp + 1);
}

std::vector<char> RankWatch::judged_nodes(const RankWatchSnapshot& s, Clock::time_point now,
                                          const std::vector<bool>& node_done) {
  const auto agent_fresh = 2 * limits_.heartbeat_interval + std::chrono::milliseconds(500);
  std::vector<char> judged(plan_.nodes.size(), 0);  // the node's agent beats: its ranks can be judged
  for (size_t k = 0; k < plan_.nodes.size(); ++k) {
    if (k < node_done.size() && node_done[k]) continue;
    auto it = s.beats.find(fmt::format("node{}", k));
    if (it == s.beats.end()) continue;
    if (!agent_seen_[k]) agent_seen_[k] = it->second.set_at;
    judged[k] = now - it->second.set_at <= agent_fresh;
  }
  return judged;
}

std::optional<RankHang> RankWatch::beat_hang(const RankWatchSnapshot& s, Clock::time_point now,
                                             const std::vector<char>& judged) const {
  // Heartbeats: the longest silence past the limit.
  std::optional<RankHang> worst;
  for (size_t k = 0; k < plan_.nodes.size(); ++k) {
    if (!judged[k]) continue;
    for (const RankInfo& r : plan_.nodes[k].ranks) {
      RankHang h;
      h.rank = r.rank;
      h.node = static_cast<int>(k);
      auto it = s.beats.find(rank_beat_name(r.rank));
      if (it == s.beats.end()) {
        if (now - *agent_seen_[k] <= limits_.first_beat_grace) continue;
        h.kind = RankHang::Kind::NO_FIRST_BEAT;
        h.silent_s = seconds(now - *agent_seen_[k]);
      } else {
        if (it->second.value == kRankBeatExited || now - it->second.set_at <= limits_.heartbeat_timeout) continue;
        h.kind = RankHang::Kind::MISSED_BEATS;
        h.silent_s = seconds(now - it->second.set_at);
      }
      if (!worst || h.silent_s > worst->silent_s) worst = h;
    }
  }
  return worst;
}

std::optional<RankHang> RankWatch::step_hang(const RankWatchSnapshot& s, Clock::time_point now,
                                             const std::vector<bool>& node_done, const std::vector<char>& judged) {
  // Steps: a rank is watched from its first progress value until it says "done".
  std::vector<RankHang> stalled, watched;  // over the step timeout / within it
  for (size_t k = 0; k < plan_.nodes.size(); ++k) {
    if (k < node_done.size() && node_done[k]) continue;
    for (const RankInfo& r : plan_.nodes[k].ranks) {
      auto it = s.progress.find(rank_beat_name(r.rank));
      if (it == s.progress.end()) continue;
      const std::string& v = it->second.value;
      const bool waiting = v.size() > std::strlen(kWaiting) && v.ends_with(kWaiting);
      const std::string step = waiting ? v.substr(0, v.size() - std::strlen(kWaiting)) : v;
      Progress& p = progress_[r.rank];
      if (p.step != step) p = {step, waiting, it->second.set_at};
      p.waiting = waiting;
      if (limits_.step_timeout.count() <= 0 || !judged[k] || p.step == kRankStepsDone) continue;
      auto beat = s.beats.find(rank_beat_name(r.rank));
      if (beat != s.beats.end() && beat->second.value == kRankBeatExited) continue;
      RankHang h;
      h.kind = RankHang::Kind::NO_STEP;
      h.rank = r.rank;
      h.node = static_cast<int>(k);
      h.silent_s = seconds(now - p.since);
      h.last_step = step_of(p.step);
      h.waiting = p.waiting;
      (now - p.since > limits_.step_timeout ? stalled : watched).push_back(h);
    }
  }
  if (stalled.empty()) return std::nullopt;
  return stalled_blame(std::move(stalled), watched);
}

std::optional<RankHang> RankWatch::check(const RankWatchSnapshot& s, Clock::time_point now,
                                         const std::vector<bool>& node_done) {
  const std::vector<char> judged = judged_nodes(s, now, node_done);
  std::optional<RankHang> h = beat_hang(s, now, judged);
  if (!h) h = step_hang(s, now, node_done, judged);
  if (h) fill_identity(s, *h);
  return h;
}

}  // namespace dtrain::launch
