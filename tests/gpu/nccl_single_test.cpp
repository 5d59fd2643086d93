// NCCL at world size 1 (issue 49 item 3): a one-rank NCCL communicator kept for training
// (TrainerEnv::single_rank_comm) runs the ZeRO engine's communicator path on one card, its
// buckets reduced on NCCL's stream and ordered against the compute stream by events with
// overlap_comm on, and trains as the lone rank without a communicator does. The GPU check
// runs it on a real card, where NCCL refuses two ranks on one device.
#include "comm/activity.h"
#include "gpu/gpu_skip.h"
#include "gpu/local_runs.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

TEST_CASE("NCCL at world size 1 with overlap_comm and accumulation trains as the lone rank does") {
  test::GpuSetup setup;
#ifdef DTRAIN_CUDA_EMU
  const std::vector<int> stages = {2};  // the engine's NCCL subset: one stage keeps the suite short
#else
  const std::vector<int> stages = {1, 2, 3};
#endif
  for (int stage : stages) {
    CAPTURE(stage);
    const std::vector<std::string> sets = {"training.max_steps=4",
                                           "zero_optimization.stage=" + std::to_string(stage),
                                           "zero_optimization.overlap_comm=true",
                                           "gradient_accumulation_steps=2",
                                           "zero_optimization.reduce_bucket_size=3000",
                                           "train_micro_batch_size_per_gpu=1"};
    const std::vector<TrainResult> lone = local_runs::train_over(local_runs::Link::NONE, 1, sets);
    config::TrainConfig cfg = config::config_load_string(train_runs::kTiny, "tiny.yaml", sets).cfg;
    config::config_resolve_batch(cfg, 1);
    auto dev = device::cuda_create(0);
    gloo::rendezvous::HashStore store;
    comm::NcclOptions o;
    o.timeout = std::chrono::milliseconds(120000);
    // Wrapped as a rank wraps it (comm::ActivityCommunicator), counting the collectives entered.
    std::atomic<int> entered{0};
    comm::ActivityCommunicator* activity = nullptr;
    auto nccl = std::make_unique<comm::ActivityCommunicator>(comm::comm_create_nccl(store, 0, 1, 0, o), [&] {
      if (activity != nullptr && activity->in_collective()) ++entered;
    });
    activity = nccl.get();
    REQUIRE(nccl->size() == 1);
    REQUIRE(nccl->backend() == comm::Backend::NCCL);
    TrainerEnv env;
    env.print = false;
    env.device = dev.get();
    env.comm = nccl.get();
    env.single_rank_comm = true;
    const TrainResult kept = train_run(cfg, env);
    CHECK(entered.load() >= 4);  // every step's buckets and scalars went through NCCL
    const auto& got = kept.losses;
    const auto& want = lone[0].losses;
    REQUIRE(got.size() == 4);
    REQUIRE(want.size() == got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("step " << i + 1 << ": NCCL of one rank " << got[i] << " vs no communicator " << want[i]);
      CHECK(std::isfinite(got[i]));
      CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * std::fabs(want[i]) + 1e-7);
    }
    // Without the opt-in a communicator of size 1 is dropped: the lone path.
    const int before = entered.load();
    env.single_rank_comm = false;
    const TrainResult dropped = train_run(cfg, env);
    CHECK(entered.load() == before);
    CHECK(dropped.losses == want);
  }
}
