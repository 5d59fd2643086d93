// The ZeRO layout's arithmetic on its own: shard ranges at every stage (the last rank's
// short or empty shard), stage 3's resident buffers, gradient buckets in backward order,
// all-gather groups, stage 3's prefetch window, and a plan's copy of the layout with its
// replay of stage 3's gathers (the memory and cluster plans).
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
  CHECK(fwd.now == std::vector<int>{0});
  // Backward over a tied head also holds the embeddings, counted against the live cap.
  const ZeroWindow bwd = zero_prefetch_window(elems, 2, -1, true, 100, 5 + 4 + 4);
  CHECK(bwd.ahead == std::vector<int>{1});
  CHECK(bwd.keep == std::vector<char>{1, 0, 1, 1, 0});
  CHECK(bwd.now == std::vector<int>{2, -1});  // the kept embeddings are waited for too
  // Untied, the embeddings are waited for when only the window holds them (layer 0's backward).
  const ZeroWindow last = zero_prefetch_window(elems, 0, -1, false, 100, 100);
  CHECK(last.ahead == std::vector<int>{-1});
  CHECK(last.now == std::vector<int>{0, -1});
  // A layer larger than the prefetch bucket stops the window: nothing ahead.
  CHECK(zero_prefetch_window(elems, 0, +1, false, 3, 100).ahead.empty());
}

TEST_CASE("zero layout: a plan's layout places, buckets and groups as the engine's rules do") {
  // Stage 3 on 2 ranks, persistence threshold 4; layers -1..2: buffers 0 (embeddings, 4),
  // 1 (layer 0, 3: resident), 2 (layer 0, 8), 3 (layer 1, 5, frozen), 4 (head, 2: resident).
  ZeroLayout layout(ZeroPlacement{3, 0, 2, 4}, 2);
  CHECK(layout.add(4, -1, true) == 0);
  layout.add(3, 0, true);
  layout.add(8, 0, true);
  layout.add(5, 1, false);
  CHECK(layout.add(2, 2, true) == 4);
  CHECK(layout.layer_slots == std::vector<std::vector<size_t>>{{0}, {1, 2}, {3}, {4}});
  CHECK(layout.shards[2].s == 4);
  CHECK(layout.layer_sharded() == std::vector<size_t>{4, 8, 5, 0});
  CHECK(zero_resident_trainable(layout.view()) == std::vector<size_t>{1, 4});
  const auto b = layout.buckets(12);
  REQUIRE(b.size() == 2);
  CHECK(b[0].slots == std::vector<size_t>{4, 1});  // backward order: head, then layer 0
  CHECK(b[1].slots == std::vector<size_t>{2, 0});  // 3 + 8 would not fit with the first
  CHECK(b[1].seg == 4 + 2);
  CHECK(layout.shards[0].bucket == 1);
  CHECK(layout.shards[3].bucket == SIZE_MAX);  // frozen
}

TEST_CASE("zero layout: the gather replay releases what leaves the window and gathers each layer once") {
  // Layers -1..2, tied: the forward, then the backward with each layer released after it.
  ZeroGatherReplay r({5, 4, 4, 4}, true, 8, 100);
  auto v = r.visit(-1, +1);
  CHECK(v.released.empty());
  REQUIRE(v.issued.size() == 3);  // -1 now, 0 and 1 ahead
  CHECK(v.issued[0].layer == -1);
  CHECK(!v.issued[0].early);
  CHECK(v.issued[1].layer == 0);
  CHECK(v.issued[1].early);
  CHECK(v.issued[2].layer == 1);
  v = r.visit(0, +1);
  CHECK(v.released == std::vector<int>{-1});
  REQUIRE(v.issued.size() == 1);  // 0 and 1 are held; 2 comes ahead
  CHECK(v.issued[0].layer == 2);
  CHECK(v.issued[0].early);
  r.visit(1, +1);
  v = r.visit(2, +1);  // the tied head holds the embeddings: gathered now, waited for
  REQUIRE(v.issued.size() == 1);
  CHECK(v.issued[0].layer == -1);
  CHECK(!v.issued[0].early);
  CHECK(v.released == std::vector<int>{1});
  v = r.visit(2, -1);
  REQUIRE(v.issued.size() == 2);  // 1 and 0 ahead again; 2 and the embeddings are still held
  CHECK(v.issued[0].layer == 1);
  CHECK(v.issued[1].layer == 0);
  CHECK(v.issued[1].early);
  CHECK(r.release(2));
  CHECK(!r.release(2));
  CHECK(!r.gathered(2));
  CHECK(r.gathered(-1));
}
