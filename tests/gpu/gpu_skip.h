// The GPU suites' skips, both ending the binary with exit code 77, which ctest reports as
// SKIPPED (never passed): SKIP_WITHOUT_GPU() as a case's first line when no CUDA device is
// visible, and EMU_ONLY_SUITE for a suite only the CPU execution engine can run (it traces
// the device work). Under the engine (the EMU tree) devices are always visible.
#pragma once

#include "device/device.h"
#include "skip.h"

#include <doctest/doctest.h>

#include <cstdlib>

#define SKIP_WITHOUT_GPU()                                                             \
  do {                                                                                 \
    if (::dtrain::device::cuda_count() == 0)                                           \
      ::dtrain::test::skip_binary("no CUDA device visible: this GPU test is skipped"); \
  } while (0)

// Outside the EMU build, the whole of an engine-only suite: one case, named after the
// suite, that skips the binary. Use as `#ifndef DTRAIN_CUDA_EMU EMU_ONLY_SUITE("x") #else ...`.
#define EMU_ONLY_SUITE(suite)                                                                                \
  TEST_CASE(suite ": needs the CPU execution engine (EMU build)") {                                          \
    ::dtrain::test::skip_binary(                                                                             \
        "this suite runs only in the EMU build (the CPU execution engine traces the device work): skipped"); \
  }

namespace dtrain::test {

// The multi-rank GPU suites' first line: NCCL between the ranks on loopback, and the skip
// without a GPU.
struct GpuSetup {
  GpuSetup() {
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    SKIP_WITHOUT_GPU();
  }
};

// Whether n CUDA devices are visible; says which cases it leaves out when not.
inline bool enough_gpus(int n) {
  if (::dtrain::device::cuda_count() >= n) return true;
  MESSAGE("only " << ::dtrain::device::cuda_count() << " CUDA device(s): the " << n << "-rank cases need " << n);
  return false;
}

}  // namespace dtrain::test
