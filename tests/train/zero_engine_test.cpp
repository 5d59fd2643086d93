// ZeRO engine, fp32: stages 0-3 at world sizes 1-4 on a tiny GPT-2 and stages 1/3 at
// world sizes 2/3 on a tiny Llama give the single-rank stage-0 run's losses and final
// weights (bit-exact at world size 1), every rank ending with the same weights.
#include "zero_harness.h"

#include <doctest/doctest.h>

using namespace zero_test;
using dtrain::DType;

namespace {

RunSpec spec_for(bool llama, int stage, int world) {
  RunSpec s;
  s.llama = llama;
  s.world = world;
  s.opts.stage = stage;
  s.opts.param_persistence_threshold = 0;  // shard everything at stage 3
  s.opts.reduce_bucket_size = 10000;       // several buckets, some holding two buffers
  s.opts.allgather_bucket_size = 10000;
  s.opts.prefetch_bucket_size = 20000;
  return s;
}

void check_same(const RunResult& ref, const RunResult& got, double loss_tol, double w_tol) {
  REQUIRE_MESSAGE(ref.ok(), ref.error_text());
  REQUIRE_MESSAGE(got.ok(), got.error_text());
  const double dl = max_rel_diff(got.losses, ref.losses);
  const double dw = max_abs_diff(got.weights, ref.weights);
  INFO("max loss rel diff " << dl << ", max weight diff " << dw);
  CHECK(dl <= loss_tol);
  CHECK(dw <= w_tol);
  // Every rank ends with the same weights.
  for (size_t r = 1; r < got.rank_weights.size(); ++r) CHECK(got.rank_weights[r] == got.rank_weights[0]);
  // The run learned something (the check can fail).
  CHECK(got.losses.back() < got.losses.front() - 0.05);
}

}  // namespace

TEST_CASE("fp32 GPT-2: every stage at world sizes 1-4 matches the single-rank run") {
  const RunResult ref = train_run(spec_for(false, 0, 1));
  REQUIRE_MESSAGE(ref.ok(), ref.error_text());
  for (int stage : {0, 1, 2, 3})
    for (int world : {1, 2, 3, 4}) {
      if (stage == 0 && world == 1) continue;
      CAPTURE(stage);
      CAPTURE(world);
      check_same(ref, train_run(spec_for(false, stage, world)), 2e-5, 5e-5);
    }
}

TEST_CASE("fp32 Llama (GQA, untied): stages 1 and 3 at world sizes 2 and 3") {
  const RunResult ref = train_run(spec_for(true, 0, 1));
  for (int stage : {1, 3})
    for (int world : {2, 3}) {
      CAPTURE(stage);
      CAPTURE(world);
      check_same(ref, train_run(spec_for(true, stage, world)), 2e-5, 5e-5);
    }
}

TEST_CASE("data-parallel groups split from a world of 4: each group of 2 trains as a world of 2, bit for bit") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    RunSpec spec = spec_for(false, stage, 2);
    spec.steps = 4;
    const RunResult ref = train_run(spec);
    REQUIRE_MESSAGE(ref.ok(), ref.error_text());
    std::vector<std::vector<float>> weights(4);
    // Both groups run their collectives at the same time, over the same store.
    const auto errors = dtrain::test::run_gloo_ranks(4, [&](dtrain::comm::Communicator& world) {
      const int r = world.rank();
      std::unique_ptr<dtrain::comm::Communicator> dp = world.split(r / 2, r);
      RankTrainer t(spec, dtrain::comm::ProcessGroups{&world, dp.get()}, dp->rank());
      for (int s = 1; s <= spec.steps; ++s) t.step(s);
      weights[static_cast<size_t>(r)] = t.weights();
    });
    for (size_t r = 0; r < errors.size(); ++r) CHECK_MESSAGE(errors[r].empty(), "rank " << r << ": " << errors[r]);
    for (size_t r = 0; r < weights.size(); ++r) CHECK(weights[r] == ref.rank_weights[r % 2]);
  }
}
