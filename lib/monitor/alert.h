// Resource alerts, once per episode: a condition raises one alert when it begins and
// none while it lasts; once it has cleared, the next time it begins is a new episode.
#pragma once

#include "monitor/sample.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::monitor {

enum class AlertKind { LOW_MEMORY = 0, GPU_MEMORY, GPU_THROTTLE };
inline constexpr size_t kAlertKinds = 3;
/// "low_memory", "gpu_memory", "gpu_throttle".
const char* alert_kind_name(AlertKind k);

struct Alert {
  AlertKind kind;
  std::string why;  // "node memory available 0.8 GiB < monitor.min_free_memory 2 GiB"
};

struct AlertLimits {
  int64_t min_free_memory_bytes = 0;  // node MemAvailable below this: LOW_MEMORY (0 = off)
  double gpu_memory_fraction = 0.95;  // GPU memory used above this: GPU_MEMORY
  bool node_checks = true;            // this rank checks its node's memory (one rank per node does)
};

/// The episode state of one rank's monitor.
class AlertState {
 public:
  /// The alerts that begin with this sample.
  std::vector<Alert> update(const ResourceSample& s, const AlertLimits& limits);

 private:
  std::array<bool, kAlertKinds> active_{};
};

}  // namespace dtrain::monitor
