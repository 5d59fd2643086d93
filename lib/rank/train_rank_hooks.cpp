// The test seam's faults (tests/cli/hung_rank_test.cpp: the stall the launcher's
// fault_tolerance.step_timeout must catch; straggler_test.cpp, elastic_test.cpp and the
// monitor tests: the per-step delay) and the one reader of their DTRAIN_TEST_* variables.
#include "rank/train_rank_hooks.h"

#include "core/env.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace dtrain::rank {

TrainRankHooks train_rank_hooks_from_env() {
  TrainRankHooks h;
  const char* at = env_get("DTRAIN_TEST_STALL_AT_STEP");
  if (at && *at) h.stall_before_step = std::atoll(at);
  const char* only = env_get("DTRAIN_TEST_STALL_RANK");
  if (only && *only) h.stall_rank = std::atoi(only);
  const char* r = env_get("DTRAIN_TEST_SLOW_RANK");
  const char* ms = env_get("DTRAIN_TEST_SLOW_MS");
  if (r && *r && ms && *ms) {
    h.slow_ms = std::atoi(ms);
    if (std::string(r) != "all") h.slow_rank = std::atoi(r);
  }
  return h;
}

void train_rank_hooks_after_step(const TrainRankHooks& h, const RankContext& ctx, int64_t done_step) {
  if (h.stall_before_step != 0 && ctx.round == 0 && h.stall_before_step == done_step + 1 &&
      (!h.stall_rank || *h.stall_rank == ctx.rank)) {
    std::fprintf(stderr, "[dtrain] test: DTRAIN_TEST_STALL_AT_STEP: rank %d stalls before step %lld\n", ctx.rank,
                 static_cast<long long>(h.stall_before_step));
    std::fflush(stderr);
    for (int i = 0; i < 6000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (done_step > 0 && h.slow_ms && (!h.slow_rank || *h.slow_rank == ctx.rank))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::clamp(*h.slow_ms, 0, 10000)));
}

}  // namespace dtrain::rank
