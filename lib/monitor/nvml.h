// NVML, the driver's management library, loaded with dlopen at run time (no build
// dependency): the few calls the resource monitor reads a GPU with, through a function
// table that the loader fills from the library (or a test from an NVML it links).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dtrain::monitor {

// The C ABI of nvml.h (NVML API v2 names), declared here so no header is needed.
using nvml_return_t = int;  ///< nvmlReturn_t: 0 = NVML_SUCCESS
using nvml_device_t = struct nvmlDevice_st*;
struct NvmlUtilization {
  unsigned int gpu, memory;  ///< percent of the last sample period
};
struct NvmlMemory {
  unsigned long long total, free, used;  ///< bytes
};
inline constexpr nvml_return_t kNvmlSuccess = 0;
inline constexpr nvml_return_t kNvmlErrorNotSupported = 3;
inline constexpr int kNvmlTemperatureGpu = 0;  ///< nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
inline constexpr int kNvmlClockSm = 1;         ///< nvmlClockType_t NVML_CLOCK_SM
// nvmlClocksThrottleReasons bits that mean the GPU is held back by heat or power.
inline constexpr unsigned long long kThrottleSwPowerCap = 0x4, kThrottleHwSlowdown = 0x8, kThrottleSwThermal = 0x20,
                                    kThrottleHwThermal = 0x40, kThrottleHwPowerBrake = 0x80;
inline constexpr unsigned long long kThrottleThermal = kThrottleSwThermal | kThrottleHwThermal;
inline constexpr unsigned long long kThrottlePower = kThrottleSwPowerCap | kThrottleHwPowerBrake;

/// The NVML entry points the monitor calls (nvml.h's signatures). A null entry other than
/// init/shutdown/handle means "not available": that field is left out.
struct NvmlApi {
  nvml_return_t (*init)() = nullptr;      // nvmlInit_v2
  nvml_return_t (*shutdown)() = nullptr;  // nvmlShutdown
  const char* (*error_string)(nvml_return_t) = nullptr;
  nvml_return_t (*handle_by_index)(unsigned int, nvml_device_t*) = nullptr;  // nvmlDeviceGetHandleByIndex_v2
  nvml_return_t (*utilization)(nvml_device_t, NvmlUtilization*) = nullptr;
  nvml_return_t (*memory)(nvml_device_t, NvmlMemory*) = nullptr;
  nvml_return_t (*temperature)(nvml_device_t, int, unsigned int*) = nullptr;
  nvml_return_t (*power)(nvml_device_t, unsigned int*) = nullptr;       // milliwatts
  nvml_return_t (*clock)(nvml_device_t, int, unsigned int*) = nullptr;  // MHz
  nvml_return_t (*throttle_reasons)(nvml_device_t, unsigned long long*) = nullptr;
};

/// One reading of one GPU; a field NVML does not give on this device is nullopt.
struct GpuReading {
  unsigned int index = 0;
  std::optional<double> util_pct, mem_util_pct;
  std::optional<int64_t> mem_used, mem_total;  // bytes
  std::optional<double> temperature_c, power_w;
  std::optional<int64_t> sm_clock_mhz;
  std::optional<unsigned long long> throttle_reasons;
};

/// An initialised NVML (nvmlShutdown on destruction).
class Nvml {
 public:
  /// dlopen(library) ("" = the process itself: an NVML linked into the program) and
  /// nvmlInit_v2. nullptr with *why set when the library is missing, lacks a required
  /// symbol or does not initialise (no driver).
  static std::unique_ptr<Nvml> open(const std::string& library, std::string* why);
  /// Over a table already filled (tests: the CUDA execution engine's NVML); inits it.
  static std::unique_ptr<Nvml> from_api(const NvmlApi& api, std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// Reads GPU `index` (NVML's numbering, the PCI order: not CUDA_VISIBLE_DEVICES's);
  /// nullopt with *why when it has no handle.
  std::optional<GpuReading> read(unsigned int index, std::string* why) const;

 private:
  Nvml(const NvmlApi& api, void* lib) : api_(api), lib_(lib) {}
  std::string error(nvml_return_t r) const;
  NvmlApi api_;
  void* lib_;  // dlopen handle, or nullptr (from_api)
};

/// The NVML index of a rank's GPU: entry local_rank of CUDA_VISIBLE_DEVICES when it is a
/// list of numbers, else local_rank (UUID lists cannot be mapped without more NVML calls:
/// local_rank then, which is right when the list is in PCI order).
unsigned int nvml_index_of(int local_rank, const char* cuda_visible_devices);

}  // namespace dtrain::monitor
