// Where a rank's host memory goes, phase by phase (monitor.memory_trace /
// DTRAIN_MEMORY_TRACE): the peak resident set of each phase of the job (the build, each
// step's data, forward, backward, optimizer, the evaluation, the checkpoint, the export),
// read from the kernel's own high-water mark (VmHWM of /proc/self/status), which the trace
// resets at each phase boundary (/proc/self/clear_refs, "5"). The memory plan (--dry-run)
// is the prediction; this is the measurement it is held against.
#pragma once

#include "device/device.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::train {

/// VmHWM of /proc/self/status: the peak resident bytes of this process (since its start,
/// or since the last reset by a MemoryTrace); 0 where unavailable.
size_t process_peak_rss_bytes();
/// VmRSS (resident bytes now), 0 where unavailable.
size_t process_rss_bytes();

class MemoryTrace {
 public:
  /// Off: mark() does nothing and peak() is VmHWM. On: each mark() closes a phase.
  explicit MemoryTrace(bool enabled);
  /// The device the job's buffers live on (the CPU device for a CPU rank): each phase
  /// also records its allocator's peak bytes in use and what it holds.
  void set_device(device::Device* dev) { dev_ = dev; }

  bool enabled() const { return enabled_; }
  /// Closes the phase that ran since the last mark (or the process start) under `phase`:
  /// its peak resident bytes become that phase's figure (the largest over its repeats),
  /// and the kernel's high-water mark is reset to the resident bytes now.
  void mark(const std::string& phase);
  /// The process's peak resident bytes: over all phases when on (the high-water mark
  /// itself is reset by mark), VmHWM when off.
  size_t peak() const;

  struct Phase {
    std::string name;
    size_t peak = 0;      ///< the largest peak resident bytes over the phase's runs
    size_t start = 0;     ///< resident bytes when that run began
    int64_t runs = 0;     ///< how many times the phase ran
    size_t dev_used_peak = 0, dev_reserved = 0;  ///< the device allocator's (memory_stats), largest over the runs
  };
  /// The phases in the order they first ran.
  const std::vector<Phase>& phases() const { return phases_; }
  /// "build 2.01 GiB (+2.01; cpu used 1.80, held 1.90), forward ...": each phase's peak
  /// resident bytes, how far it rose above the resident bytes it started from, and the
  /// device allocator's peak in use and bytes held.
  std::string summary() const;
  /// False where the kernel does not let this process reset its high-water mark (the
  /// phases' figures are then cumulative peaks).
  bool resettable() const { return resettable_; }

 private:
  bool enabled_;
  device::Device* dev_ = nullptr;
  bool resettable_ = true;
  size_t max_peak_ = 0, last_rss_ = 0;
  std::vector<Phase> phases_;
};

}  // namespace dtrain::train
