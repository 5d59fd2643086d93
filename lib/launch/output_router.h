// The launcher's output of all nodes: each line a node's agent forwards sorted to the
// terminal and the per-rank log files (OutputRouter), rank 0's progress records to the
// live view (LauncherTerminal) and the straggler check (StragglerWatch).
#pragma once

#include "launch/placement.h"
#include "launch/progress.h"
#include "launch/run_files.h"
#include "launch/spawner.h"
#include "report/event.h"
#include "report/progress_record.h"
#include "report/straggler.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::launch {

/// A line as an agent forwards it: "[nodeK rankR] <body>" is rank R's, anything else is
/// the agent's own (rank -1, body = the whole line).
struct NodeLine {
  int rank = -1;
  std::string_view body;
};
NodeLine node_line_parse(std::string_view text);

/// The launcher's terminal: whole lines, each after ending the live view's redrawn
/// status line when one is open, and the live view. Shows nothing without echo. Not
/// thread-safe (the OutputRouter serializes calls).
class LauncherTerminal {
 public:
  explicit LauncherTerminal(bool echo);
  bool echo() const { return echo_; }
  /// prefix + text + "\n" on f (stdout or stderr).
  void say(std::FILE* f, const std::string& prefix, std::string_view text);
  /// One of rank 0's progress records: one redrawn status line on a TTY, plain lines otherwise.
  void show(const report::ProgressRecord& rec);
  ProgressView& progress() { return progress_; }

 private:
  // Other output must start on a fresh line when a redrawn status line is open.
  void end_status_line();

  bool echo_;
  ProgressView progress_;
};

/// Rank 0's step times through the straggler rule (report/straggler.h): a rank flagged,
/// or no longer flagged, is said on the terminal naming its host, marked on the live
/// progress line and kept as an event. Not thread-safe.
class StragglerWatch {
 public:
  StragglerWatch(double factor, int window) : stragglers_(factor, window) {}
  /// The round's placement, for naming a straggler's host; a new round counts afresh.
  void set_plan(const Plan& plan, int round);
  void check(const report::RankTimes& t, LauncherTerminal& term);
  /// Events (stragglers flagged or recovered) for the supervising thread to record.
  std::vector<report::Event> take_events() { return std::exchange(events_, {}); }

 private:
  std::pair<int, std::string> where(int rank) const;  // node, host; -1, "?" when unknown

  report::StragglerDetector stragglers_;
  std::vector<std::pair<int, std::string>> rank_where_;  // by global rank: node, host
  std::map<int, report::Straggler> flagged_;
  std::vector<report::Event> events_;
  int round_ = 0;
};

/// Output of all nodes. Terminal: rank 0's stdout as is (the job's own output), every
/// rank's stderr and the agents' own lines with their "[nodeK rankR]" prefix, other
/// ranks' stdout only with tee_all. Files: every line of rank R in logs/rankR.log, the
/// agent's own lines in logs/nodeK.log. line() runs on the spawners' reader threads.
class OutputRouter {
 public:
  OutputRouter(const std::string& run_dir, RunFiles& files, bool echo, bool tee_all, double straggler_factor,
               int straggler_window);

  /// The round's placement, for naming a straggler's host; a new round counts afresh.
  void set_plan(const Plan& plan, int round);
  void line(int node, Stream s, std::string_view text);
  /// True once, the first time it is asked after rank 0 reported that training started
  /// (or always_now: the round succeeded). Supervising thread only.
  bool take_started(bool always_now = false);
  /// The last warning/error line node k's agent printed ("" when none).
  std::string agent_said(int node);
  void set_restarts(int restarts);
  /// Events (stragglers flagged or recovered) for the supervising thread to record.
  std::vector<report::Event> take_events();
  /// The live view's resource lines: one compact line per node from the ranks' monitors.
  void resource_lines(const std::vector<std::string>& lines);
  /// An alert the launcher raised from every rank's samples (network_idle).
  void resource_alert(const report::Event& ev);

 private:
  // Under mu_.
  void record_line(const report::ProgressRecord& rec);
  void echo_line(int node, const NodeLine& l, Stream s, std::string_view text);

  std::filesystem::path dir_;
  RunFiles& files_;
  bool tee_all_;
  LauncherTerminal term_;
  StragglerWatch stragglers_;
  bool record_warned_ = false;  // this round's unreadable progress record was reported
  std::mutex mu_;
  std::map<int, std::string> agent_said_;
  std::atomic<bool> started_{false};
  bool started_taken_ = false;
};

}  // namespace dtrain::launch
