// Progress view: rank 0's progress records as one in-place status line on a TTY or plain
// control-character-free lines elsewhere (each with its percentage and ETA), with an ETA
// from smoothed step times.
#include "launch/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

namespace dtrain::launch {

namespace {

// Replaces every byte below 0x20 (tab: a space) and DEL so the text is safe for logs.
std::string sanitize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (u == '\t') c = ' ';
    else if (u < 0x20 || u == 0x7f) c = '?';
  }
  return out;
}

// 18234 -> "18.2k", 1234567 -> "1.23M".
std::string format_rate(double v) {
  if (!std::isfinite(v)) return "?";
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

}  // namespace

// ---------------------------------------------------------------------------

std::string progress_format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 86400) return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// ---------------------------------------------------------------------------

double ProgressView::eta_seconds() const {
  if (!last_ || ema_step_s_ < 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(std::max<int64_t>(0, last_->total_steps - last_->step)) * ema_step_s_;
}

std::string ProgressView::render_tty(const report::ProgressRecord& r) const {
  const double pct = r.total_steps > 0 ? 100.0 * static_cast<double>(r.step) / static_cast<double>(r.total_steps) : 0.0;
  std::string s =
      fmt::format("step {}/{} ({:.0f}%) | loss {:.4f} | lr {:.1e} | {} tok/s | ETA {} | scale {:g} | gnorm {:.3f}",
                  r.step, r.total_steps, pct, r.loss, r.lr, format_rate(r.tokens_per_s),
                  progress_format_duration(eta_seconds()), r.loss_scale, r.grad_norm);
  if (!r.metrics.empty()) s += " | " + report::progress_metrics_compact(r.metrics);
  if (r.comm_bytes_per_step >= 0)
    s += fmt::format(" | sent {:.2f} MB/step, comm {:.0f} ms", r.comm_bytes_per_step / 1e6, 1e3 * r.comm_s_per_step);
  if (restarts_ > 0) s += fmt::format(" | restarts {}", restarts_);
  if (!flag_.empty()) s += " | " + flag_;
  if (r.skipped) s += " | skipped";
  return sanitize(s);
}

void ProgressView::show(const report::ProgressRecord& rec, std::string* out) {
  out->clear();
  // A new run (restart from a checkpoint) may go back in steps: the old EMA still holds.
  if (std::isfinite(rec.step_time_s) && rec.step_time_s >= 0)
    ema_step_s_ = ema_step_s_ < 0 ? rec.step_time_s : 0.7 * ema_step_s_ + 0.3 * rec.step_time_s;
  last_ = rec;
  if (tty_) {
    *out = "\r\x1b[2K" + render_tty(rec);
    line_open_ = true;
    if (rec.step >= rec.total_steps) {  // the last step: keep it on screen
      out->push_back('\n');
      line_open_ = false;
    }
  } else {
    // Logs without a terminal (an sbatch log, a pipe) get the human line with the share
    // done and the ETA, as the TTY's status line shows them.
    const double pct =
        rec.total_steps > 0 ? 100.0 * static_cast<double>(rec.step) / static_cast<double>(rec.total_steps) : 0.0;
    *out = sanitize(report::progress_line(rec)) +
           fmt::format(" | {:.0f}% | ETA {}", pct, progress_format_duration(eta_seconds()));
    if (restarts_ > 0) *out += fmt::format(" | restarts {}", restarts_);
    if (!flag_.empty()) *out += " | " + sanitize(flag_);
    out->push_back('\n');
  }
}

std::string ProgressView::interrupt() {
  if (!line_open_) return "";
  line_open_ = false;
  return "\n";
}

}  // namespace dtrain::launch
