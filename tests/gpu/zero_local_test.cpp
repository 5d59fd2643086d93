// The trainer's ZeRO engine at stage 2 with overlap_comm (buckets reduced on the
// communicator's stream during the backward) on two ranks as threads sharing one CUDA
// device over the device-local communicator: the same per-step losses as the same two ranks
// on two devices over NCCL, and as one rank with the whole batch.
#include "comm/local_comm.h"
#include "comm/nccl_comm.h"
#include "config/train_config.h"
#include "device/device.h"
#include "train/trainer.h"

#include "gpu/gpu_skip.h"
#include "gpu/train_runs.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

namespace {

enum class Link { NONE, LOCAL, NCCL };

// train_run on `world` ranks (threads): over the device-local communicator all on device 0,
// or over NCCL with rank r on device r. Returns every rank's result.
std::vector<TrainResult> train_over(Link link, int world, const std::vector<std::string>& sets) {
  std::vector<TrainResult> res(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::shared_ptr<comm::LocalGroup> group;
  if (link == Link::LOCAL) {
    comm::LocalOptions o;
    o.timeout = std::chrono::milliseconds(120000);
    group = comm::local_group_create(world, 0, o);
  }
  gloo::rendezvous::HashStore store;
  auto body = [&](int r) {
    try {
      config::TrainConfig cfg = config::config_load_string(train_runs::kTiny, "tiny.yaml", sets).cfg;
      config::config_resolve_batch(cfg, world);
      TrainerEnv env;
      env.print = false;
      env.rank = r;
      env.world_size = world;
      auto dev = device::cuda_create(link == Link::NCCL ? r : 0);
      env.device = dev.get();
      std::unique_ptr<comm::Communicator> comm;
      if (link == Link::LOCAL) {
        comm = comm::comm_create_local(group, r);
      } else if (link == Link::NCCL) {
        comm::NcclOptions o;
        o.timeout = std::chrono::milliseconds(120000);
        comm = comm::comm_create_nccl(store, r, world, r, o);
      }
      env.comm = comm.get();
      res[static_cast<size_t>(r)] = train_run(cfg, env);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  for (int r = 1; r < world; ++r) CHECK(res[static_cast<size_t>(r)].losses == res[0].losses);
  return res;
}

}  // namespace

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
