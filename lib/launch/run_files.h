// The launcher's own writes into the run directory (events.jsonl, nodes.json,
// launcher.json, logs/*.log). A write that fails (a full disk, a read-only or vanished
// directory) is reported once per file with the path and the system's reason, and the
// launcher goes on supervising; events that could not be written are kept and written,
// in order, as soon as a later attempt succeeds.
#pragma once

#include "report/event.h"

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launch {

class RunFiles {
 public:
  explicit RunFiles(std::string run_dir);
  ~RunFiles();
  RunFiles(const RunFiles&) = delete;
  RunFiles& operator=(const RunFiles&) = delete;

  /// Appends ev (report::event_json) as one line to <run_dir>/events.jsonl, after any
  /// events that failed before it. False when it could not (it stays pending).
  bool event(const report::Event& ev);

  /// Writes the pending events, if any. False when some are still pending.
  bool flush_events();

  /// Appends text to path (created with 0666 & umask). A write that fails part-way is
  /// cut back, so the file never keeps half a line. False when it could not.
  bool append(const std::string& path, std::string_view text);

  /// Runs write, which replaces path and throws dtrain::Error when it cannot (e.g.
  /// report::status_write_nodes). False when it threw.
  bool attempt(const std::string& path, const std::function<void()>& write);

  size_t events_pending();

  /// The errors of the files whose last write failed, "; "-separated; "" when none.
  std::string failing();

 private:
  bool append_locked(const std::string& path, std::string_view text);
  bool write_pending_locked(size_t fresh);  // fresh: lines at the end tried for the first time
  void failed_locked(const std::string& path, const std::string& message);
  void succeeded_locked(const std::string& path);

  std::mutex mu_;
  std::string events_path_;
  std::map<std::string, int> fds_;              // append targets, opened once
  std::map<std::string, std::string> failing_;  // path -> the error of its last write
  std::vector<std::string> pending_;            // event lines not yet written
};

}  // namespace dtrain::launch
