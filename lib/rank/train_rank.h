// One rank's training over its context: the device and the collectives it implies, the
// heartbeat's step progress, the resource monitor and the elastic stop request around
// train::train_run. The worker (dtrain launch's ranks) and dtrain run both end here.
#pragma once

#include "config/train_config.h"
#include "device/kind.h"
#include "rank/rank_context.h"
#include "rank/train_rank_hooks.h"
#include "rendezvous/heartbeat.h"

namespace dtrain::rank {

/// Trains on `device` (on CUDA, local rank i opens CUDA device i) with NCCL on
/// CUDA and Gloo on the CPU when world_size > 1. launcher_lines (the worker): rank 0 prints
/// its progress as the record lines dtrain launch reads (report/progress_record.h). hooks:
/// test-only faults after each step (none in production). Returns 0.
int train_rank(RankContext& ctx, rendezvous::Heartbeat& hb, config::TrainConfig cfg, device::Kind device,
               bool launcher_lines = false, const TrainRankHooks& hooks = {});

}  // namespace dtrain::rank
