// Device discovery: how many CUDA devices this process sees (0 without a driver or
// GPU, never an exception), and a description of one for logs.
#pragma once

#include <string>

namespace dtrain::kernels {
int device_count();
std::string device_describe(int device);
}  // namespace dtrain::kernels
