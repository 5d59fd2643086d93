// The trainer's CUDA step reads from the device once: train_run on the CPU execution
// engine's devices, traced; the device-to-host copies a step adds (a 6-step run minus a
// 3-step run, over 3) are the step's one read-back (gradient norm, overflow flag and the
// micro-batch losses and, summed over the ranks on the device, the loss sum and the
// target count together), with one rank or several. Only the engine traces, so any other
// build reports SKIPPED.
#include "gpu/gpu_skip.h"

#include <doctest/doctest.h>

#include <cstdlib>

#ifndef DTRAIN_CUDA_EMU

EMU_ONLY_SUITE("train step")

#else

#include "gpu/train_runs.h"

using namespace dtrain;
using namespace dtrain::train;
using namespace train_runs;

TEST_CASE("train step: one device-to-host read per step on one rank (fp32, bf16, fp16)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  for (const char* dt : {"fp32", "bf16", "fp16"}) {
    CAPTURE(dt);
    std::vector<std::string> extra;
    if (std::string(dt) != "fp32") extra.push_back(std::string(dt) + ".enabled=true");
    CHECK(per_step(1, extra) == std::vector<size_t>{1});
  }
}

TEST_CASE("train step: two ranks at ZeRO stage 1 agree on the norm on the device (NCCL)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  if (device::cuda_count() < 2) {
    MESSAGE("one CUDA device: the two-rank case needs two");
    return;
  }
  // The read-back alone: the norm, the overflow flag, the target count (before the
  // backward) and the loss sum (for the log) are summed over the ranks by NCCL.
  CHECK(per_step(2, {"zero_optimization.stage=1"}) == std::vector<size_t>{1, 1});
}

#endif
