// A rate limit for warnings that outsiders can cause at will (the store's "refused
// connection" and "closing connection" lines): the first few of each kind per interval in
// full, the rest counted and summarised in one line per interval, so a flood of
// connections cannot flood the log (4,200 idle connections once gave 16,561 lines in 45 s).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>

namespace dtrain::rendezvous {

class WarnLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  /// `sink` receives every line written (a warning or a summary). Not thread-safe: the
  /// store calls it from its io thread only.
  WarnLimiter(size_t burst, std::chrono::milliseconds interval, std::function<void(const std::string&)> sink);

  /// `line` of kind `kind` (a short label, e.g. "not authenticated within the hello
  /// timeout"): written when fewer than `burst` of that kind were written in this
  /// interval, else counted. Closes the interval first when it has run out.
  void warn(const std::string& kind, const std::string& line, Clock::time_point now = Clock::now());

  /// When the interval has run out (or `force`): writes one summary line of what it
  /// counted, if anything, and starts a new interval. Call it periodically and at the end.
  void flush(Clock::time_point now = Clock::now(), bool force = false);

  /// Warnings counted and not written since this limiter started (for tests and logs).
  size_t suppressed_total() const { return suppressed_total_; }

 private:
  size_t burst_;
  std::chrono::milliseconds interval_;
  std::function<void(const std::string&)> sink_;
  Clock::time_point window_start_;
  std::map<std::string, size_t> written_, suppressed_;  // this interval, by kind
  size_t suppressed_total_ = 0;
};

}  // namespace dtrain::rendezvous
