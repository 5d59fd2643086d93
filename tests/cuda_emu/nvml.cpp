// CUDA execution engine (test-only): the NVML subset of include/nvml.h over the engine's
// own accounting (allocator totals, kernel busy time, the card model).
#include <nvml.h>

#include "engine.h"
#include "memory_internal.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>

namespace cuda_emu {

namespace {

constexpr int kMaxDevices = 64;
std::array<std::atomic<int64_t>, kMaxDevices> g_busy_ns{};

struct UtilWindow {
  int64_t wall_ns = 0, busy_ns = 0;  // at the previous query (or nvmlInit)
};
std::mutex g_nvml_mu;
int g_init = 0;  // nvmlInit_v2 count minus nvmlShutdown count
std::array<UtilWindow, kMaxDevices> g_window{};
std::array<unsigned int, kMaxDevices> g_last_util{};

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// NVML numbers the machine's devices (CUDA_VISIBLE_DEVICES does not apply); a handle is
// that number + 1, so no handle is null.
int device_of(nvmlDevice_t d) {
  const auto i = static_cast<int64_t>(reinterpret_cast<uintptr_t>(d)) - 1;
  return i >= 0 && i < device_physical_count() && i < kMaxDevices ? static_cast<int>(i) : -1;
}

// The kernel time of physical device p in this process (0 when it is not visible here).
int64_t busy_of(int p) {
  const int d = device_of_physical(p);
  return d >= 0 && d < kMaxDevices ? g_busy_ns[static_cast<size_t>(d)].load() : 0;
}

}  // namespace

void device_busy_add(int device, int64_t ns) {
  if (device >= 0 && device < kMaxDevices) g_busy_ns[static_cast<size_t>(device)].fetch_add(ns);
}

}  // namespace cuda_emu

using namespace cuda_emu;

extern "C" {

nvmlReturn_t nvmlInit_v2(void) {
  std::lock_guard<std::mutex> lock(g_nvml_mu);
  if (g_init++ == 0)
    for (int i = 0; i < kMaxDevices; ++i) g_window[static_cast<size_t>(i)] = {wall_ns(), busy_of(i)};
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard<std::mutex> lock(g_nvml_mu);
  if (g_init == 0) return NVML_ERROR_UNINITIALIZED;
  --g_init;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  {
    std::lock_guard<std::mutex> lock(g_nvml_mu);
    if (g_init == 0) return NVML_ERROR_UNINITIALIZED;
  }
  if (!device) return NVML_ERROR_INVALID_ARGUMENT;
  if (index >= static_cast<unsigned int>(std::min(device_physical_count(), kMaxDevices)))
    return NVML_ERROR_INVALID_ARGUMENT;
  *device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(index) + 1);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  const int d = device_of(device);
  if (d < 0 || !u) return NVML_ERROR_INVALID_ARGUMENT;
  std::lock_guard<std::mutex> lock(g_nvml_mu);
  if (g_init == 0) return NVML_ERROR_UNINITIALIZED;
  // The share of wall time since the previous query that kernels ran (summed over the
  // executors, so capped at 100); a query right after another repeats the last figure.
  UtilWindow& w = g_window[static_cast<size_t>(d)];
  const int64_t now = wall_ns(), busy = busy_of(d);
  if (now - w.wall_ns >= 1000000) {
    const double f = static_cast<double>(busy - w.busy_ns) / static_cast<double>(now - w.wall_ns);
    g_last_util[static_cast<size_t>(d)] = static_cast<unsigned int>(std::clamp(f, 0.0, 1.0) * 100.0 + 0.5);
    w = {now, busy};
  }
  u->gpu = g_last_util[static_cast<size_t>(d)];
  u->memory = u->gpu;  // kernels are what touches device memory here
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* m) {
  const int d = device_of(device);
  if (d < 0 || !m) return NVML_ERROR_INVALID_ARGUMENT;
  // Every device is the same card model; what this process allocated on it is "used"
  // (the engine sees no other process).
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return NVML_ERROR_UNKNOWN;
  const int cuda = device_of_physical(d);
  m->total = p.totalGlobalMem;
  m->used = cuda < 0 ? 0 : std::min<unsigned long long>(mem_used(cuda), m->total);
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t, unsigned int* temp) {
  if (device_of(device) < 0 || !temp) return NVML_ERROR_INVALID_ARGUMENT;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  if (device_of(device) < 0 || !power) return NVML_ERROR_INVALID_ARGUMENT;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int* clock) {
  const int d = device_of(device);
  if (d < 0 || !clock) return NVML_ERROR_INVALID_ARGUMENT;
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return NVML_ERROR_UNKNOWN;
  if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) *clock = static_cast<unsigned int>(p.clockRate / 1000);
  else if (type == NVML_CLOCK_MEM) *clock = static_cast<unsigned int>(p.memoryClockRate / 1000);
  else return NVML_ERROR_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long* reasons) {
  const int d = device_of(device);
  if (d < 0 || !reasons) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned long long r = 0;
  {
    std::lock_guard<std::mutex> lock(g_nvml_mu);
    if (g_last_util[static_cast<size_t>(d)] == 0) r |= nvmlClocksThrottleReasonGpuIdle;
  }
  if (const char* inject = std::getenv("DTRAIN_EMU_NVML_THROTTLE"); inject && *inject)
    r |= std::strtoull(inject, nullptr, 16);
  *reasons = r;
  return NVML_SUCCESS;
}

}  // extern "C"
