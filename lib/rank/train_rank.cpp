// One rank's training (train_rank.h): the device and its collectives, the heartbeat's
// step progress, the resource monitor and the elastic stop request around train_run.
#include "rank/train_rank.h"

#include "comm/activity.h"
#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "device/device.h"
#include "launch/membership.h"
#include "launch/rank_device.h"
#include "launch/rank_watch.h"
#include "launch/run_dir.h"
#include "monitor/monitor.h"
#include "tensorboard/event_writer.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

namespace dtrain::rank {

namespace {

// The config as this rank trains it: the batch resolved for the world, activation
// checkpointing left to the plan chosen, and (CPU) the batch checked against this node's memory.
config::TrainConfig rank_config_resolve(config::TrainConfig cfg, const RankContext& ctx, device::Kind kind) {
  config::config_resolve_batch(cfg, ctx.world_size);
  // activation_checkpointing left to the plan: the fewest layers recompute that let this
  // rank fit its GPU, or its share of this node's memory (the gradients are the same either
  // way, so ranks on other machines may choose otherwise).
  const double capacity = kind == device::Kind::CUDA ? static_cast<double>(device::cuda_memory_bytes())
                                                     : static_cast<double>(config::config_host_memory_bytes()) /
                                                           std::max(1, ctx.local_world_size);
  train::RecomputeChoice choice;
  cfg = train::recompute_resolve(std::move(cfg), ctx.world_size, capacity, &choice);
  if (choice.planned && ctx.rank == 0) log_info("activation checkpointing (the memory plan): {}", choice.why);
  // Before anything is allocated: this node's CPU ranks share its memory (a CUDA rank's
  // activations are on its GPU, which the launcher cannot see).
  if (kind == device::Kind::CPU) config::config_check_host_batch_memory(cfg, ctx.local_world_size, false);
  return cfg;
}

// The resource monitor's options for this rank (min_free_memory_bytes: checked against
// this node's memory before anything started).
monitor::MonitorOptions rank_monitor_options(const RankContext& ctx, const config::TrainConfig& cfg,
                                             int64_t min_free_memory_bytes, bool gpu,
                                             comm::ActivityCommunicator* comm) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  monitor::MonitorOptions mo;
  mo.interval_s = cfg.monitor.interval;
  mo.run_dir = ctx.run_dir;
  mo.max_mode = launch::run_dir_mode_parse(cfg.training.run_dir_mode);
  mo.origin = {.rank = ctx.rank,
               .local_rank = ctx.local_rank,
               .node = ctx.node_rank,
               .round = ctx.round,
               .host = host,
               .job_id = ctx.job_id};
  mo.limits.min_free_memory_bytes = min_free_memory_bytes;
  mo.limits.node_checks = ctx.local_rank == 0;  // one rank per node watches the node's memory
  mo.gpu = gpu;
  mo.gpu_index = monitor::nvml_index_of(ctx.local_rank, env_get("CUDA_VISIBLE_DEVICES"));
  mo.nvml_library = cfg.monitor.nvml_library;
  if (comm) mo.collective_seconds = [comm] { return comm->collective_seconds(); };
  // Each rank's scalars are a TensorBoard run of their own beside rank 0's training scalars.
  if (cfg.tensorboard.enabled && !ctx.run_dir.empty())
    mo.tensorboard_dir = (std::filesystem::path(tensorboard::log_dir(ctx.run_dir, cfg.tensorboard.output_path,
                                                                     cfg.tensorboard.job_name)) /
                          "resources" / fmt::format("rank{}", ctx.rank))
                             .string();
  return mo;
}

}  // namespace

int train_rank(RankContext& ctx, rendezvous::Heartbeat& hb, config::TrainConfig cfg_in, device::Kind kind,
               bool launcher_lines, const TrainRankHooks& hooks) {
  const config::TrainConfig cfg = rank_config_resolve(std::move(cfg_in), ctx, kind);
  // The monitor's memory threshold against this node's memory (the launcher's host may
  // be another machine), before anything starts.
  const int64_t min_free_memory_bytes =
      cfg.monitor.enabled ? config::config_min_free_memory_bytes(cfg, config::config_host_memory_bytes()) : 0;
  // The launcher's step timeout watches the last completed step and whether this rank
  // waits in a collective (so it can tell the rank that is stuck from the peers waiting
  // for it); the heartbeat thread publishes both.
  std::mutex progress_mu;
  std::atomic<int64_t> last_step{-1};
  std::unique_ptr<comm::ActivityCommunicator> comm;
  auto publish = [&] {
    std::lock_guard<std::mutex> lock(progress_mu);  // the last caller publishes the latest state
    const int64_t step = last_step.load();
    if (step >= 0) hb.progress(launch::rank_progress_value(step, comm && comm->in_collective()));
  };
  // The backend follows the device. Local rank i opens device i of this node's
  // CUDA_VISIBLE_DEVICES.
  std::unique_ptr<device::Device> device;
  if (kind == device::Kind::CUDA) {
    device = device::cuda_create(ctx.local_rank);
    // The GEMM algorithms timed on the first step are remembered next to the run: a
    // resumed or restarted round finds them chosen ($DTRAIN_GEMM_ALGO_CACHE overrides).
    if (!ctx.run_dir.empty())
      device::cuda_gemm_algo_cache_default((std::filesystem::path(ctx.run_dir) / "gemm_algos.txt").string());
  }
  if (ctx.world_size > 1)
    comm = std::make_unique<comm::ActivityCommunicator>(
        rank_comm_create(ctx, device ? comm::Backend::NCCL : comm::Backend::GLOO), publish);
  log_debug("rank {}: device {}, collectives {}", ctx.rank,
            device ? fmt::format("cuda:{}", ctx.local_rank) : std::string("cpu"),
            launch::rank_backend_name(device::kind_name(kind), ctx.world_size));
  train::TrainerEnv env;
  env.device = device.get();
  env.rank = ctx.rank;
  env.world_size = ctx.world_size;
  env.run_dir = ctx.run_dir;
  env.comm = comm.get();
  env.progress_records = launcher_lines;
  env.on_step = [&](int64_t step) {
    last_step = step;
    publish();
    train_rank_hooks_after_step(hooks, ctx, step);
  };
  // An elastic launcher that wants to regrow the job asks (store key) for a stop at the
  // next checkpoint; rank 0 answers for all and records the step it stopped at.
  env.stop_after_save = [&](int64_t step) {
    if (ctx.rank != 0 || !ctx.round_store) return false;
    try {
      if (!ctx.round_store->check({launch::kElasticGrowKey})) return false;
      ctx.round_store->set(launch::kElasticStoppedKey, std::to_string(step));
      return true;
    } catch (const Error& e) {
      log_warn("rank 0 could not ask the store whether to stop for a membership change: {}", e.what());
      return false;
    }
  };
  env.on_steps_done = [&] {
    std::lock_guard<std::mutex> lock(progress_mu);
    last_step = -1;  // no more steps: later collectives (the final barriers) publish nothing
    hb.progress(launch::kRankStepsDone);
  };
  // The resource monitor samples from a thread of its own until training returns.
  auto resource_monitor = monitor::monitor_start(
      rank_monitor_options(ctx, cfg, min_free_memory_bytes, device != nullptr, comm.get()), cfg.monitor.enabled);
  train::train_run(cfg, env);
  resource_monitor.reset();
  if (comm) comm->barrier();
  comm.reset();  // NCCL's communicator goes before the device it runs on
  return 0;
}

}  // namespace dtrain::rank
