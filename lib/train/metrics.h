// Training metrics: metrics.jsonl (one JSON object per line, flushed per record) and
// the wall-clock breakdown timers (forward, backward, comm, optimizer, data,
// checkpoint) that DeepSpeed's wall_clock_breakdown reports.
#pragma once

#include "core/append_record.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::train {

// ----------------------------------------------------------------------------
/// Appends JSON records to a JSON-lines file. Each write() is one line written with a
/// single write(2) and flushed to the kernel, so a crash loses at most the record being
/// written; with fsync_each it is also on disk before write() returns.
class MetricsWriter {
 public:
  /// append=false truncates; append=true continues the file, first cutting off a partial
  /// last line left by a crash. Throws IoError naming the path.
  MetricsWriter(const std::string& path, bool append, bool fsync_each = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  /// Appends the record as one line. Throws InternalError unless record is an object. A
  /// failed write (a full disk) does not throw: the file keeps only whole records, the
  /// first failure is logged once, and false is returned.
  bool write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool fsync_each_;
  AppendReport report_;
};

/// Reads every record of a metrics.jsonl file (blank lines skipped). Throws IoError
/// naming path:line for a line that is not a JSON object.
std::vector<nlohmann::json> metrics_read(const std::string& path);

// ----------------------------------------------------------------------------
/// Monotonic seconds since an arbitrary origin (std::chrono::steady_clock).
double monotonic_seconds();

/// Elapsed wall time since construction or restart().
class Stopwatch {
 public:
  Stopwatch() : start_(monotonic_seconds()) {}
  void restart() { start_ = monotonic_seconds(); }
  double elapsed_s() const { return monotonic_seconds() - start_; }

 private:
  double start_;
};

enum class Section : uint8_t { FORWARD = 0, BACKWARD, COMM, OPTIMIZER, DATA, CHECKPOINT };
inline constexpr size_t kSectionCount = 6;
/// "forward", "backward", "comm", "optimizer", "data", "checkpoint".
const char* section_name(Section s);

/// Accumulates wall time per section over one logging interval. GPU work must be
/// synchronised by the caller before stop() for the figure to mean anything.
class StepTimer {
 public:
  using Clock = std::function<double()>;  ///< seconds; monotonic_seconds by default
  explicit StepTimer(Clock clock = {});

  /// start/stop pairs may repeat within an interval; times add up. Starting a running
  /// section or stopping an idle one throws InternalError.
  void start(Section s);
  void stop(Section s);
  double elapsed_ms(Section s) const;
  int64_t count(Section s) const;  ///< completed start/stop pairs
  bool running(Section s) const { return running_[static_cast<size_t>(s)]; }
  /// Zeroes every section (running ones are stopped and discarded).
  void reset();
  /// {"forward_ms": x, "backward_ms": ..., ...}: every section, ms as double.
  nlohmann::json to_json() const;
  /// Called as each section starts (started = true) and after it stops (the memory
  /// trace's phase boundaries); none by default.
  using Observer = std::function<void(Section, bool started)>;
  void set_observer(Observer o) { observer_ = std::move(o); }

  /// RAII start/stop.
  class Scope {
   public:
    Scope(StepTimer& t, Section s) : t_(&t), s_(s) { t_->start(s_); }
    ~Scope() {
      if (t_->running(s_)) t_->stop(s_);  // a reset() inside the scope already stopped it
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepTimer* t_;
    Section s_;
  };
  Scope scope(Section s) { return Scope(*this, s); }

 private:
  Clock clock_;
  Observer observer_;
  std::array<double, kSectionCount> total_s_{};
  std::array<double, kSectionCount> started_at_{};
  std::array<bool, kSectionCount> running_{};
  std::array<int64_t, kSectionCount> count_{};
};

}  // namespace dtrain::train
