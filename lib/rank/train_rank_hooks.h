// Test-only faults a rank injects into its own training: a stall (a rank stuck in a step
// while its heartbeat goes on) and a per-step delay (a straggler, or a job paced so a test
// can act between checkpoints). Production passes none; the worker's test seam reads them
// from DTRAIN_TEST_* (a multi-process test sets those on the launcher, which forwards them).
#pragma once

#include "rank/rank_context.h"

#include <cstdint>
#include <optional>

namespace dtrain::rank {

struct TrainRankHooks {
  int64_t stall_before_step = 0;  // stop before this training step in round 0 (0: never)
  std::optional<int> stall_rank;  // only this rank stalls (unset: every rank)
  std::optional<int> slow_ms;     // sleep this long after every training step (unset: never)
  std::optional<int> slow_rank;   // only this rank sleeps (unset: every rank)
};

/// The hooks from DTRAIN_TEST_STALL_AT_STEP / _STALL_RANK / _SLOW_RANK / _SLOW_MS (core's env
/// table: test hooks), the one place they are read; empty when none is set.
TrainRankHooks train_rank_hooks_from_env();

/// Runs the hooks for ctx's rank after training step done_step: stalls (at most 10 minutes)
/// before step stall_before_step, sleeps slow_ms (at most 10 s) after every step but the first.
void train_rank_hooks_after_step(const TrainRankHooks& hooks, const RankContext& ctx, int64_t done_step);

}  // namespace dtrain::rank
