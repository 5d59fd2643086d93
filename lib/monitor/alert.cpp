// Alert conditions over one sample, and their episodes.
#include "monitor/alert.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::monitor {

const char* alert_kind_name(AlertKind k) {
  switch (k) {
    case AlertKind::LOW_MEMORY: return "low_memory";
    case AlertKind::GPU_MEMORY: return "gpu_memory";
    case AlertKind::GPU_THROTTLE: return "gpu_throttle";
  }
  return "?";
}

namespace {

double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

std::string throttle_names(unsigned long long r) {
  std::string out;
  auto add = [&](unsigned long long bit, const char* name) {
    if (r & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  };
  add(kThrottleSwThermal, "software thermal slowdown");
  add(kThrottleHwThermal, "hardware thermal slowdown");
  add(kThrottleSwPowerCap, "power cap");
  add(kThrottleHwPowerBrake, "hardware power brake");
  return out;
}

}  // namespace

std::vector<Alert> AlertState::update(const ResourceSample& s, const AlertLimits& limits) {
  std::vector<Alert> out;
  // A figure that is missing this time neither starts nor ends an episode.
  auto step = [&](AlertKind k, std::optional<bool> on, auto why) {
    if (!on) return;
    bool& active = active_[static_cast<size_t>(k)];
    if (*on && !active) out.push_back({k, why()});
    active = *on;
  };
  if (limits.node_checks && limits.min_free_memory_bytes > 0 && s.mem_available_bytes) {
    // An episode starts under the threshold and ends only once the node has 5 % of it (at
    // least 256 MiB) more: a node hovering at the threshold, as compiles or page cache
    // come and go, is one episode and one alert, not one per crossing.
    const int64_t t = limits.min_free_memory_bytes;
    const bool active = active_[static_cast<size_t>(AlertKind::LOW_MEMORY)];
    const int64_t end_above = t + std::max<int64_t>(t / 20, int64_t{256} << 20);
    const bool low = active ? *s.mem_available_bytes < end_above : *s.mem_available_bytes < t;
    step(AlertKind::LOW_MEMORY, low, [&] {
      return fmt::format("the node's available memory is {:.2f} GiB, under monitor.min_free_memory = {:.2f} GiB",
                         gib(*s.mem_available_bytes), gib(limits.min_free_memory_bytes));
    });
  }
  if (s.gpu && s.gpu->mem_used && s.gpu->mem_total && *s.gpu->mem_total > 0) {
    const double f = static_cast<double>(*s.gpu->mem_used) / static_cast<double>(*s.gpu->mem_total);
    step(AlertKind::GPU_MEMORY, f > limits.gpu_memory_fraction, [&] {
      return fmt::format("GPU {} memory is {:.1f} % used ({:.2f} of {:.2f} GiB), over {:.0f} %", s.gpu->index, 100 * f,
                         gib(*s.gpu->mem_used), gib(*s.gpu->mem_total), 100 * limits.gpu_memory_fraction);
    });
  }
  if (s.gpu && s.gpu->throttle_reasons) {
    const unsigned long long r = *s.gpu->throttle_reasons & (kThrottleThermal | kThrottlePower);
    step(AlertKind::GPU_THROTTLE, r != 0, [&] {
      return fmt::format("GPU {} is throttled: {} (NVML throttle reasons 0x{:x})", s.gpu->index, throttle_names(r),
                         *s.gpu->throttle_reasons);
    });
  }
  return out;
}

}  // namespace dtrain::monitor
