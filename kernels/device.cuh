// Device discovery: how many CUDA devices this process sees (0 without a driver or
// GPU, never an exception), and a description of one for logs.
#pragma once

#include <cstddef>
#include <string>

namespace dtrain::kernels {
int device_count();
/// Global memory of a device in bytes (0 when it cannot be queried).
size_t device_memory_bytes(int device);
std::string device_describe(int device);
}  // namespace dtrain::kernels
