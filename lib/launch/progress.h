// The launcher's live progress view: parses rank 0's training progress line (the format
// train/trainer.cpp prints every steps_per_print) and renders it either as one status
// line redrawn in place on a terminal, or passed through as plain lines otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dtrain::launch {

/// One parsed progress line:
///     step 40/200 | loss 2.3141 | lr 3.0e-04 | grad_norm 0.812 | loss_scale 65536 |
///     tokens/s 18234 | 0.45 s/step[ | skipped (fp16 overflow)]
struct ProgressRecord {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double loss_scale = 0.0;
  double tokens_per_s = 0.0;
  double step_time_s = 0.0;  ///< mean seconds per step over the last print interval
  bool skipped = false;      ///< the step was skipped (fp16 overflow)
  /// Several ranks only (-1 otherwise): MB rank 0 sent per step and ms per step the
  /// ZeRO engine's collectives ran, over the last print interval.
  double sent_mb_per_step = -1.0;
  double comm_ms_per_step = -1.0;
};

/// Parses a progress line; nullopt for any other line (including a malformed one, which
/// then passes through untouched). Never throws.
std::optional<ProgressRecord> progress_parse(std::string_view line);

/// "1h02m", "3m05s", "42s": a compact duration for the ETA (negative/NaN: "?").
std::string progress_format_duration(double seconds);

/// Renders rank 0's output for the terminal. Not thread-safe: the caller (the
/// supervisor's output router) serializes calls.
///
/// tty = true: a progress line becomes "\r\x1b[2K" + one compact status line with no
/// newline, redrawn in place; any other line first ends the status line ("\n") so
/// it is not overwritten.
/// tty = false: a progress line is passed through unchanged with "\n" (plus
/// " | restarts N" when there were restarts); no byte below 0x20 other than '\n' is
/// ever produced (control characters in the input are replaced by '?').
class ProgressView {
 public:
  ProgressView(bool tty, int restarts) : tty_(tty), restarts_(restarts) {}

  /// Sets the restart count shown from now on (the supervisor calls it per round).
  void set_restarts(int restarts) { restarts_ = restarts; }

  /// A mark shown on every progress line from now on ("" = none): the supervisor's
  /// straggler flag, e.g. "straggler rank 2 (node3) 3.1x".
  void set_flag(std::string flag) { flag_ = std::move(flag); }

  /// Consumes one line of rank 0's stdout (without '\n') and sets *out to the bytes to
  /// write. Returns true when the line was a progress line.
  bool consume(std::string_view rank0_line, std::string* out);

  /// Bytes to write before other output (another rank's line, a launcher log line) so
  /// it does not land on the status line: "\n" while a status line is shown on a TTY,
  /// else "". Marks the status line as ended.
  std::string interrupt();

  /// The ETA in seconds from the last record: remaining steps times the smoothed step
  /// time (exponential moving average over the intervals seen); NaN before any record.
  double eta_seconds() const;

 private:
  std::string render_tty(const ProgressRecord& r) const;

  bool tty_;
  int restarts_;
  std::string flag_;
  bool line_open_ = false;  // a status line without '\n' is on the terminal
  std::optional<ProgressRecord> last_;
  double ema_step_s_ = -1.0;
};

}  // namespace dtrain::launch
