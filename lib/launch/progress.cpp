// Progress view: parse trainer progress lines, render one in-place status line on a TTY
// or plain control-character-free lines elsewhere (each with its percentage and ETA), with
// an ETA from smoothed step times.
#include "launch/progress.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <vector>

namespace dtrain::launch {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// The whole of `s` as a number ("nan" and "inf" included, as printf writes them).
bool parse_double(std::string_view s, double* v) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_int(std::string_view s, int64_t* v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size() && *v >= 0;
}

// "key value" -> value when the field starts with "key ".
bool field_value(std::string_view field, std::string_view key, std::string_view* value) {
  if (field.size() <= key.size() || field.substr(0, key.size()) != key || field[key.size()] != ' ') return false;
  *value = trim(field.substr(key.size() + 1));
  return true;
}

// "<number><suffix>" -> number.
bool parse_suffixed(std::string_view v, std::string_view suffix, double* out) {
  if (v.size() <= suffix.size() || v.substr(v.size() - suffix.size()) != suffix) return false;
  return parse_double(v.substr(0, v.size() - suffix.size()), out);
}

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

std::optional<ProgressRecord> progress_parse(std::string_view line) {
  line = trim(line);
  if (line.rfind("step ", 0) != 0) return std::nullopt;
  std::vector<std::string_view> fields;
  for (size_t start = 0;;) {
    size_t bar = line.find(" | ", start);
    fields.push_back(trim(line.substr(start, bar == std::string_view::npos ? std::string_view::npos : bar - start)));
    if (bar == std::string_view::npos) break;
    start = bar + 3;
  }
  ProgressRecord r;
  // "step A/B"
  std::string_view sv = fields[0].substr(5);
  size_t slash = sv.find('/');
  if (slash == std::string_view::npos || !parse_int(sv.substr(0, slash), &r.step) ||
      !parse_int(sv.substr(slash + 1), &r.total_steps))
    return std::nullopt;
  bool have_loss = false;
  for (size_t i = 1; i < fields.size(); ++i) {
    std::string_view f = fields[i], v;
    bool ok = true;
    if (field_value(f, "loss", &v)) ok = have_loss = parse_double(v, &r.loss);
    else if (field_value(f, "lr", &v)) ok = parse_double(v, &r.lr);
    else if (field_value(f, "grad_norm", &v)) ok = parse_double(v, &r.grad_norm);
    else if (field_value(f, "loss_scale", &v)) ok = parse_double(v, &r.loss_scale);
    else if (field_value(f, "tokens/s", &v)) ok = parse_double(v, &r.tokens_per_s);
    else if (field_value(f, "sent", &v)) ok = parse_suffixed(v, " MB/step", &r.sent_mb_per_step);
    else if (field_value(f, "comm", &v)) ok = parse_suffixed(v, " ms/step", &r.comm_ms_per_step);
    else if (f.size() > 7 && f.substr(f.size() - 7) == " s/step")
      ok = parse_double(f.substr(0, f.size() - 7), &r.step_time_s);
    else if (f.rfind("skipped", 0) == 0) r.skipped = true;
    // Unknown fields are tolerated: a newer trainer may print more.
    if (!ok) return std::nullopt;
  }
  if (!have_loss) return std::nullopt;
  return r;
}

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

std::string ProgressView::render_tty(const ProgressRecord& r) const {
  const double pct = r.total_steps > 0 ? 100.0 * static_cast<double>(r.step) / static_cast<double>(r.total_steps) : 0.0;
  std::string s =
      fmt::format("step {}/{} ({:.0f}%) | loss {:.4f} | lr {:.1e} | {} tok/s | ETA {} | scale {:g} | gnorm {:.3f}",
                  r.step, r.total_steps, pct, r.loss, r.lr, format_rate(r.tokens_per_s),
                  progress_format_duration(eta_seconds()), r.loss_scale, r.grad_norm);
  if (r.sent_mb_per_step >= 0)
    s += fmt::format(" | sent {:.2f} MB/step, comm {:.0f} ms", r.sent_mb_per_step, r.comm_ms_per_step);
  if (restarts_ > 0) s += fmt::format(" | restarts {}", restarts_);
  if (!flag_.empty()) s += " | " + flag_;
  if (r.skipped) s += " | skipped";
  return sanitize(s);
}

bool ProgressView::consume(std::string_view rank0_line, std::string* out) {
  auto rec = progress_parse(rank0_line);
  out->clear();
  if (!rec) {
    if (tty_) {
      *out = interrupt();
      out->append(rank0_line);
    } else {
      *out = sanitize(rank0_line);
    }
    out->push_back('\n');
    return false;
  }
  // A new run (restart from a checkpoint) may go back in steps: the old EMA still holds.
  if (std::isfinite(rec->step_time_s) && rec->step_time_s >= 0)
    ema_step_s_ = ema_step_s_ < 0 ? rec->step_time_s : 0.7 * ema_step_s_ + 0.3 * rec->step_time_s;
  last_ = *rec;
  if (tty_) {
    *out = "\r\x1b[2K" + render_tty(*rec);
    line_open_ = true;
    if (rec->step >= rec->total_steps) {  // the last step: keep it on screen
      out->push_back('\n');
      line_open_ = false;
    }
  } else {
    // Logs without a terminal (an sbatch log, a pipe) get the share done and the ETA on
    // every progress line, as the TTY's status line shows them.
    const double pct =
        rec->total_steps > 0 ? 100.0 * static_cast<double>(rec->step) / static_cast<double>(rec->total_steps) : 0.0;
    *out = sanitize(rank0_line) + fmt::format(" | {:.0f}% | ETA {}", pct, progress_format_duration(eta_seconds()));
    if (restarts_ > 0) *out += fmt::format(" | restarts {}", restarts_);
    if (!flag_.empty()) *out += " | " + sanitize(flag_);
    out->push_back('\n');
  }
  return true;
}

std::string ProgressView::interrupt() {
  if (!line_open_) return "";
  line_open_ = false;
  return "\n";
}

}  // namespace dtrain::launch
