// NVML loader: dlopen + dlsym into a function table; reads every field it can and
// leaves out what the device does not support.
#include "monitor/nvml.h"

#include <fmt/format.h>

#include <dlfcn.h>

#include <cstdlib>
#include <string_view>
#include <vector>

namespace dtrain::monitor {

namespace {

template <class F>
void sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
}

}  // namespace

std::unique_ptr<Nvml> Nvml::open(const std::string& library, std::string* why) {
  void* lib = ::dlopen(library.empty() ? nullptr : library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    *why = fmt::format("cannot load {}: {}", library.empty() ? "the program's own NVML" : library,
                       e ? e : "unknown error");
    return nullptr;
  }
  NvmlApi a;
  sym(lib, "nvmlInit_v2", &a.init);
  sym(lib, "nvmlShutdown", &a.shutdown);
  sym(lib, "nvmlErrorString", &a.error_string);
  sym(lib, "nvmlDeviceGetHandleByIndex_v2", &a.handle_by_index);
  sym(lib, "nvmlDeviceGetUtilizationRates", &a.utilization);
  sym(lib, "nvmlDeviceGetMemoryInfo", &a.memory);
  sym(lib, "nvmlDeviceGetTemperature", &a.temperature);
  sym(lib, "nvmlDeviceGetPowerUsage", &a.power);
  sym(lib, "nvmlDeviceGetClockInfo", &a.clock);
  sym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", &a.throttle_reasons);
  auto n = from_api(a, why);
  if (!n) {
    if (library.empty()) *why = "the program has no NVML (" + *why + ")";
    else *why = library + ": " + *why;
    if (!library.empty()) ::dlclose(lib);
    return nullptr;
  }
  n->lib_ = lib;
  return n;
}

std::unique_ptr<Nvml> Nvml::from_api(const NvmlApi& api, std::string* why) {
  if (!api.init || !api.shutdown || !api.handle_by_index) {
    *why = "no nvmlInit_v2, nvmlShutdown or nvmlDeviceGetHandleByIndex_v2";
    return nullptr;
  }
  const nvml_return_t r = api.init();
  if (r != kNvmlSuccess) {
    *why = fmt::format("nvmlInit_v2 failed: {}", api.error_string ? api.error_string(r) : std::to_string(r).c_str());
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(api, nullptr));
}

Nvml::~Nvml() {
  api_.shutdown();
  // The process itself (dlopen(nullptr)) is not closed; a library is.
  if (lib_) ::dlclose(lib_);
}

std::string Nvml::error(nvml_return_t r) const {
  if (api_.error_string) return api_.error_string(r);
  return fmt::format("NVML error {}", r);
}

std::optional<GpuReading> Nvml::read(unsigned int index, std::string* why) const {
  nvml_device_t dev = nullptr;
  const nvml_return_t r = api_.handle_by_index(index, &dev);
  if (r != kNvmlSuccess) {
    *why = fmt::format("nvmlDeviceGetHandleByIndex_v2({}): {}", index, error(r));
    return std::nullopt;
  }
  GpuReading g;
  g.index = index;
  if (NvmlUtilization u{}; api_.utilization && api_.utilization(dev, &u) == kNvmlSuccess) {
    g.util_pct = u.gpu;
    g.mem_util_pct = u.memory;
  }
  if (NvmlMemory m{}; api_.memory && api_.memory(dev, &m) == kNvmlSuccess) {
    g.mem_used = static_cast<int64_t>(m.used);
    g.mem_total = static_cast<int64_t>(m.total);
  }
  if (unsigned int t = 0; api_.temperature && api_.temperature(dev, kNvmlTemperatureGpu, &t) == kNvmlSuccess)
    g.temperature_c = t;
  if (unsigned int mw = 0; api_.power && api_.power(dev, &mw) == kNvmlSuccess) g.power_w = mw / 1000.0;
  if (unsigned int mhz = 0; api_.clock && api_.clock(dev, kNvmlClockSm, &mhz) == kNvmlSuccess) g.sm_clock_mhz = mhz;
  if (unsigned long long t = 0; api_.throttle_reasons && api_.throttle_reasons(dev, &t) == kNvmlSuccess)
    g.throttle_reasons = t;
  return g;
}

unsigned int nvml_index_of(int local_rank, const char* cuda_visible_devices) {
  const unsigned int fallback = static_cast<unsigned int>(local_rank < 0 ? 0 : local_rank);
  if (!cuda_visible_devices || !*cuda_visible_devices) return fallback;
  std::vector<unsigned int> ids;
  std::string_view s(cuda_visible_devices);
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    if (item.empty() || item.find_first_not_of("0123456789 ") != std::string_view::npos) return fallback;
    ids.push_back(static_cast<unsigned int>(std::strtoul(std::string(item).c_str(), nullptr, 10)));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return static_cast<size_t>(local_rank) < ids.size() ? ids[static_cast<size_t>(local_rank)] : fallback;
}

}  // namespace dtrain::monitor
