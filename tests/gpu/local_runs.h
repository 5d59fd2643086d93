// Test-only: train_run of train_runs::kTiny on `world` ranks as threads, over the
// device-local communicator (every rank on device 0), over NCCL (rank r on device r) or
// alone (no communicator), for the suites of many ranks on one card (zero_local_test,
// ranks_local_test).
#pragma once

#include "comm/local_comm.h"
#include "comm/nccl_comm.h"
#include "config/train_config.h"
#include "device/device.h"
#include "train/trainer.h"

#include "gpu/train_runs.h"
#include "rank_threads.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace local_runs {

using namespace dtrain;
using namespace dtrain::train;

enum class Link { NONE, LOCAL, NCCL };

// Every rank's result; every rank's losses must agree. delay_us: local_group_delay's
// switch (LOCAL only).
std::vector<TrainResult> train_over(Link link, int world, const std::vector<std::string>& sets, int delay_us = 0) {
  std::vector<TrainResult> res(static_cast<size_t>(world));
  std::shared_ptr<comm::LocalGroup> group;
  if (link == Link::LOCAL) {
    comm::LocalOptions o;
    o.timeout = std::chrono::milliseconds(120000);
    group = comm::local_group_create(world, 0, o);
    comm::local_group_delay(*group, delay_us);
  }
  gloo::rendezvous::HashStore store;
  const std::vector<std::string> errors = dtrain::test::run_threads(world, [&](int r) {
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
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  for (int r = 1; r < world; ++r) CHECK(res[static_cast<size_t>(r)].losses == res[0].losses);
  return res;
}

}  // namespace local_runs
