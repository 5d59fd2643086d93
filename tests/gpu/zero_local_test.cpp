// The trainer's ZeRO engine at stage 2 with overlap_comm (buckets reduced on the
// communicator's stream during the backward) on two ranks as threads sharing one CUDA
// device over the device-local communicator: the same per-step losses as the same two ranks
// on two devices over NCCL, and as one rank with the whole batch.
#include "gpu/gpu_skip.h"
#include "gpu/local_runs.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
using local_runs::Link;
using local_runs::train_over;

TEST_CASE("ZeRO-2 with overlap_comm on two ranks sharing one device (device-local) trains as NCCL's and one rank") {
  test::GpuSetup setup;
  const std::vector<std::string> base = {"training.max_steps=4", "zero_optimization.stage=2",
                                         "zero_optimization.overlap_comm=true", "gradient_accumulation_steps=2",
                                         "zero_optimization.reduce_bucket_size=3000"};
  std::vector<std::string> two = base, one = base;
  two.push_back("train_micro_batch_size_per_gpu=1");
  one.push_back("train_micro_batch_size_per_gpu=2");
  const std::vector<TrainResult> local = train_over(Link::LOCAL, 2, two);
  const std::vector<TrainResult> single = train_over(Link::NONE, 1, one);
  const auto& got = local[0].losses;
  const auto& want = single[0].losses;
  REQUIRE(got.size() == 4);
  REQUIRE(want.size() == got.size());
  CHECK(want.back() < want.front());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i + 1 << ": 2 device-local ranks " << got[i] << " vs 1 rank " << want[i]);
    CHECK(std::isfinite(got[i]));
    CHECK(std::fabs(got[i] - want[i]) <= 1e-4 * std::fabs(want[i]) + 1e-6);
  }
  if (!test::enough_gpus(2)) return;
  // The same reductions in the same rank order with fp32 accumulation: NCCL's bits.
  const std::vector<TrainResult> nccl = train_over(Link::NCCL, 2, two);
  CHECK(nccl[0].losses == got);
  CHECK(nccl[0].grad_norms == local[0].grad_norms);
}
