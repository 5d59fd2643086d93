// The launcher's live progress view: renders rank 0's progress records (the trainer's
// typed records, report/progress_record.h, read by the supervisor) either as one status
// line redrawn in place on a terminal, or as plain lines otherwise.
#pragma once

#include "report/progress_record.h"

#include <optional>
#include <string>

namespace dtrain::launch {

/// "1h02m", "3m05s", "42s": a compact duration for the ETA (negative/NaN: "?").
std::string progress_format_duration(double seconds);

/// Renders rank 0's output for the terminal. Not thread-safe: the caller (the
/// supervisor's output router) serializes calls.
///
/// tty = true: a progress record becomes "\r\x1b[2K" + one compact status line with no
/// newline, redrawn in place (named metrics in their short form, "acc 0.93 margin 1.2");
/// other output first ends the status line (interrupt()) so it is not overwritten.
/// tty = false: a progress record becomes its human line (report::progress_line) plus
/// " | 42% | ETA 3m10s" (and " | restarts N" when there were restarts) and "\n", with no
/// byte below 0x20 other than '\n'.
class ProgressView {
 public:
  ProgressView(bool tty, int restarts) : tty_(tty), restarts_(restarts) {}

  /// Sets the restart count shown from now on (the supervisor calls it per round).
  void set_restarts(int restarts) { restarts_ = restarts; }

  /// A mark shown on every progress line from now on ("" = none): the supervisor's
  /// straggler flag, e.g. "straggler rank 2 (node3) 3.1x".
  void set_flag(std::string flag) { flag_ = std::move(flag); }

  /// Sets *out to the bytes to write for one progress record of rank 0.
  void show(const report::ProgressRecord& record, std::string* out);

  /// Bytes to write before other output (another rank's line, a launcher log line) so
  /// it does not land on the status line: "\n" while a status line is shown on a TTY,
  /// else "". Marks the status line as ended.
  std::string interrupt();

  /// The ETA in seconds from the last record: remaining steps times the smoothed step
  /// time (exponential moving average over the intervals seen); NaN before any record.
  double eta_seconds() const;

 private:
  std::string render_tty(const report::ProgressRecord& r) const;

  bool tty_;
  int restarts_;
  std::string flag_;
  bool line_open_ = false;  // a status line without '\n' is on the terminal
  std::optional<report::ProgressRecord> last_;
  double ema_step_s_ = -1.0;
};

}  // namespace dtrain::launch
