// CUDA graphs in the trainer (training.cuda_graph): the steady-state step is one graph
// launch, and the run is bit-identical to the run without graphs (losses, gradient
// norms, the exported weights): fp32, bf16, fp16 with loss-scale overflow steps, one
// rank and two at ZeRO stage 1 (NCCL captured on its own stream), plain text and SFT data
// (the step's target count, summed over the ranks on the device, is not recorded). Only the engine can capture and trace, so any other build reports SKIPPED.
#include "gpu/gpu_skip.h"

#include <doctest/doctest.h>

#include <cstdlib>

#ifndef DTRAIN_CUDA_EMU

EMU_ONLY_SUITE("step graph")

#else

#include "gpu/train_runs.h"

using namespace dtrain;
using namespace dtrain::train;
using namespace train_runs;

TEST_CASE("step graph: CUDA graphs replay the steady-state step bit-identically (one rank: fp32, bf16, fp16)") {
  for (const char* dt : {"fp32", "bf16", "fp16"}) {
    CAPTURE(dt);
    std::vector<std::string> extra;
    if (std::string(dt) != "fp32") extra.push_back(std::string(dt) + ".enabled=true");
    graph_vs_eager(1, extra);
  }
}

TEST_CASE("step graph: fp16 overflow steps skipped on the device, with and without graphs") {
  // A loss scale that doubles every other step until the fp16 gradients overflow.
  const std::vector<std::string> extra = {"fp16.enabled=true", "fp16.initial_scale_power=12",
                                          "fp16.loss_scale_window=2", "fp16.hysteresis=1"};
  const Run probe = train_ranks(1, 12, extra);
  int64_t skipped = 0;
  for (int x : probe.res[0].skipped) skipped += x;
  CHECK(skipped > 0);
  graph_vs_eager(1, extra, 12);
}

TEST_CASE("step graph: CUDA graphs with two ranks at ZeRO stage 1 (NCCL captured on its own stream)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  if (device::cuda_count() < 2) {
    MESSAGE("one CUDA device: the two-rank case needs two");
    return;
  }
  // Plain text: every position is a target.
  const std::vector<std::string> text = {"data.train=configs/data/text/train.txt", "data.format=text",
                                         "zero_optimization.stage=1"};
  graph_vs_eager(2, text);
  std::vector<std::string> bf16 = text;
  bf16.push_back("bf16.enabled=true");
  graph_vs_eager(2, bf16);
  // SFT data: the ranks' shares of the unmasked targets change every step; the backward
  // reads the step's count from device memory (summed by NCCL inside the graph), so the
  // recorded step replays, bit-identically.
  graph_vs_eager(2, {"zero_optimization.stage=1"});
}

#endif
