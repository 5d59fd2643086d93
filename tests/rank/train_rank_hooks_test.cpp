// The worker's test seam: DTRAIN_TEST_* read into TrainRankHooks (empty when unset, as in
// production), the hooks the multi-process tests (hung_rank, straggler, elastic, monitor) set.
#include "rank/train_rank_hooks.h"

#include <doctest/doctest.h>

#include <cstdlib>

using namespace dtrain::rank;

namespace {
void unset_hooks() {
  for (const char* n :
       {"DTRAIN_TEST_STALL_AT_STEP", "DTRAIN_TEST_STALL_RANK", "DTRAIN_TEST_SLOW_RANK", "DTRAIN_TEST_SLOW_MS"})
    ::unsetenv(n);
}
}  // namespace

TEST_CASE("no DTRAIN_TEST_* variable: no hook") {
  unset_hooks();
  const TrainRankHooks h = train_rank_hooks_from_env();
  CHECK(h.stall_before_step == 0);
  CHECK(!h.stall_rank);
  CHECK(!h.slow_ms);
  CHECK(!h.slow_rank);
  RankContext ctx;
  train_rank_hooks_after_step(h, ctx, 5);  // returns at once
}

TEST_CASE("DTRAIN_TEST_* read into the hooks") {
  unset_hooks();
  ::setenv("DTRAIN_TEST_STALL_AT_STEP", "8", 1);
  ::setenv("DTRAIN_TEST_STALL_RANK", "1", 1);
  ::setenv("DTRAIN_TEST_SLOW_RANK", "all", 1);
  ::setenv("DTRAIN_TEST_SLOW_MS", "300", 1);
  TrainRankHooks h = train_rank_hooks_from_env();
  CHECK(h.stall_before_step == 8);
  CHECK(h.stall_rank == 1);
  CHECK(h.slow_ms == 300);
  CHECK(!h.slow_rank);  // every rank
  ::setenv("DTRAIN_TEST_SLOW_RANK", "2", 1);
  ::unsetenv("DTRAIN_TEST_STALL_RANK");
  h = train_rank_hooks_from_env();
  CHECK(!h.stall_rank);
  CHECK(h.slow_rank == 2);
  // A slow rank without its milliseconds is no hook.
  ::unsetenv("DTRAIN_TEST_SLOW_MS");
  CHECK(!train_rank_hooks_from_env().slow_ms);
  unset_hooks();
}
