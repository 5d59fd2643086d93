// The GPU suites' first line: without a visible CUDA device the binary ends with exit code
// 77, which ctest reports as SKIPPED (never passed). Under the CPU execution engine (the
// EMU tree) devices are always visible, so these suites run in every test run.
#pragma once

#include "device/device.h"

#include <cstdio>
#include <cstdlib>

#define SKIP_WITHOUT_GPU()                                               \
  do {                                                                   \
    if (::dtrain::device::cuda_count() == 0) {                           \
      std::printf("no CUDA device visible: this GPU test is skipped\n"); \
      std::fflush(stdout);                                               \
      std::exit(77);                                                     \
    }                                                                    \
  } while (0)
