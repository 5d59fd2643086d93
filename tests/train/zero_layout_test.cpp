// The ZeRO layout's arithmetic on its own: shard ranges at every stage (the last rank's
// short or empty shard), stage 3's resident buffers, gradient buckets in backward order,
// all-gather groups and stage 3's prefetch window.
#include "train/zero_layout.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

using namespace dtrain::train;

TEST_CASE("zero layout: shard ranges cover each buffer once over the ranks, stage 0 owns all") {
  for (int stage : {0, 1, 2, 3})
    for (int world : {1, 2, 3, 4})
      for (size_t n : {size_t{1}, size_t{5}, size_t{8}, size_t{10}}) {
        CAPTURE(stage);
        CAPTURE(world);
        CAPTURE(n);
        size_t covered = 0;
        for (int rank = 0; rank < world; ++rank) {
          const ZeroShard s = ZeroPlacement{stage, rank, world, 6}.place(n, 2, true);
          CHECK(s.n == n);
          CHECK(s.layer == 2);
          CHECK(s.sharded == (stage == 3 && n >= 6));
          if (stage == 0) {
            CHECK(s.lo == 0);
            CHECK(s.hi == n);
            continue;
          }
          CHECK(s.s == (n + static_cast<size_t>(world) - 1) / static_cast<size_t>(world));
          CHECK(s.lo == std::min(static_cast<size_t>(rank) * s.s, n));
          covered += s.owned();
        }
        if (stage > 0) CHECK(covered == n);
      }
}

TEST_CASE("zero layout: buckets in backward order, trainable buffers only, within the bucket size") {
  // Layers -1..1 (n_layer 1): buffer 0 (embeddings, 4), 1 (layer 0, 3), 2 (layer 0, frozen,
  // 9), 3 (layer 1, 2), 4 (head, 6).
  std::vector<ZeroShard> shards = {ZeroPlacement{1, 0, 2}.place(4, -1, true), ZeroPlacement{1, 0, 2}.place(3, 0, true),
                                   ZeroPlacement{1, 0, 2}.place(9, 0, false), ZeroPlacement{1, 0, 2}.place(2, 1, true),
                                   ZeroPlacement{1, 0, 2}.place(6, 2, true)};
  std::vector<ZeroShard*> ptrs;
  for (auto& s : shards) ptrs.push_back(&s);
  const std::vector<std::vector<size_t>> layer_slots = {{0}, {1, 2}, {3}, {4}};
  const auto b = zero_buckets_plan(ptrs, layer_slots, 1, 8);
  REQUIRE(b.size() == 2);
  CHECK(b[0].slots == std::vector<size_t>{4, 3});  // 6 + 2 = 8 fits
  CHECK(b[0].offs == std::vector<size_t>{0, 3});   // shard lengths 3 and 1
  CHECK(b[0].seg == 4);
  CHECK(b[0].done_layer == 1);
  CHECK(b[1].slots == std::vector<size_t>{1, 0});  // the frozen buffer is skipped
  CHECK(b[1].seg == 2 + 2);
  CHECK(b[1].done_layer == -1);
  CHECK(shards[0].bucket == 1);
  CHECK(shards[0].bucket_off == 2);
  CHECK(shards[2].bucket == SIZE_MAX);
  // Stage 0 packs whole buffers.
  const auto b0 = zero_buckets_plan(ptrs, layer_slots, 0, 100);
  REQUIRE(b0.size() == 1);
  CHECK(b0[0].seg == 6 + 2 + 3 + 4);
}

TEST_CASE("zero layout: all-gather groups stay within the cap, one buffer at least") {
  std::vector<ZeroShard> shards = {ZeroPlacement{1, 0, 2}.place(4, 0, true), ZeroPlacement{1, 0, 2}.place(10, 0, true),
                                   ZeroPlacement{1, 0, 2}.place(3, 0, true), ZeroPlacement{1, 0, 2}.place(3, 0, true)};
  std::vector<const ZeroShard*> ptrs;
  for (const auto& s : shards) ptrs.push_back(&s);
  const auto g = zero_gather_groups(ptrs, {0, 1, 2, 3}, 6);
  REQUIRE(g.size() == 3);
  CHECK(g[0].slots == std::vector<size_t>{0});
  CHECK(g[1].slots == std::vector<size_t>{1});  // larger than the cap: alone
  CHECK(g[2].slots == std::vector<size_t>{2, 3});
  CHECK(g[2].offs == std::vector<size_t>{0, 2});
  CHECK(g[2].seg == 4);
}

TEST_CASE("zero layout: the prefetch window holds what fits in the prefetch and live budgets") {
  // Layers -1..3, sharded elements per layer.
  const std::vector<size_t> elems = {5, 4, 4, 4, 2};
  const ZeroWindow fwd = zero_prefetch_window(elems, 0, +1, false, 8, 100);
  CHECK(fwd.ahead == std::vector<int>{1, 2});
  CHECK(fwd.keep == std::vector<char>{0, 1, 1, 1, 0});
  // Backward over a tied head also holds the embeddings, counted against the live cap.
  const ZeroWindow bwd = zero_prefetch_window(elems, 2, -1, true, 100, 5 + 4 + 4);
  CHECK(bwd.ahead == std::vector<int>{1});
  CHECK(bwd.keep == std::vector<char>{1, 0, 1, 1, 0});
}
