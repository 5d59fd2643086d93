// Device discovery through the CUDA runtime.
#include "kernels/device.cuh"

#include "core/cuda_check.h"

#include <cstdio>

namespace dtrain::kernels {

int device_count() {
  int n = 0;
  // No driver / no GPU is a normal CPU-only situation, not an error.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

size_t device_memory_bytes(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return prop.totalGlobalMem;
}

std::string device_describe(int device) {
  cudaDeviceProp prop{};
  DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                prop.totalGlobalMem / double(1ull << 30));
  return buf;
}

}  // namespace dtrain::kernels
