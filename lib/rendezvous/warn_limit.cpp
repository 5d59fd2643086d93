// WarnLimiter: per-kind burst within an interval, then one summary line per interval.
#include "rendezvous/warn_limit.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace dtrain::rendezvous {

WarnLimiter::WarnLimiter(size_t burst, std::chrono::milliseconds interval, std::function<void(const std::string&)> sink)
    : burst_(burst), interval_(interval), sink_(std::move(sink)), window_start_(Clock::now()) {}

void WarnLimiter::warn(const std::string& kind, const std::string& line, Clock::time_point now) {
  flush(now);
  size_t& written = written_[kind];
  if (written < burst_) {
    ++written;
    sink_(line);
    return;
  }
  ++suppressed_[kind];
  ++suppressed_total_;
}

void WarnLimiter::flush(Clock::time_point now, bool force) {
  if (!force && now - window_start_ < interval_) return;
  if (!suppressed_.empty()) {
    // Most frequent kind first: what the flood is made of.
    std::vector<std::pair<size_t, std::string>> kinds;
    size_t total = 0;
    for (const auto& [kind, n] : suppressed_) {
      kinds.emplace_back(n, kind);
      total += n;
    }
    std::sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::string parts;
    for (const auto& [n, kind] : kinds) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", n, kind);
    const double secs = std::chrono::duration<double>(now - window_start_).count();
    sink_(
        fmt::format("rendezvous: {} more such connection warning(s) in the last {:.0f} s not shown ({} per kind "
                    "are): {}",
                    total, secs, burst_, parts));
  }
  suppressed_.clear();
  written_.clear();
  window_start_ = now;
}

}  // namespace dtrain::rendezvous
