// The ZeRO engine's layout, arithmetic only: the element range of each model buffer a
// rank owns (its shard) and whether stage 3 keeps it resident, the gradient buckets in
// backward order, the post-step all-gather groups and stage 3's prefetch window. No
// device and no communicator, so it is unit-tested on its own (zero_layout_test). The
// memory plan and lib/plan's cluster plan replay the engine through these same rules
// (ZeroLayout, ZeroGatherReplay), so the engine and both plans share one copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::train {

/// Where one model buffer's state lives on this rank.
struct ZeroShard {
  int layer = 0;  ///< -1 (embeddings) .. n_layer (final norm, head)
  bool trainable = false;
  bool sharded = false;                      ///< stage 3 and not persistent: the parameters are not resident
  size_t n = 0, s = 0;                       ///< the buffer's elements; the shard length (stage 0: n)
  size_t lo = 0, hi = 0;                     ///< the owned range [lo, hi)
  size_t bucket = SIZE_MAX, bucket_off = 0;  ///< its gradient bucket, its offset in the per-rank segment

  size_t owned() const { return hi - lo; }
};

/// One gradient bucket: consecutive trainable buffers in backward order.
struct ZeroBucketPlan {
  std::vector<size_t> slots;  ///< buffer indices
  std::vector<size_t> offs;   ///< offset of each slot in the per-rank segment
  size_t seg = 0;             ///< per-rank segment (stage 0: the whole packed length)
  int done_layer = 0;         ///< its gradients are complete after this layer's backward
};

/// The data-parallel placement: stage, this rank and the group's size.
struct ZeroPlacement {
  int stage = 0, rank = 0, world = 1;
  size_t persistence_threshold = 0;  ///< stage 3: buffers below it stay resident

  /// Elements of one rank's shard of n: ceil(n / world).
  size_t shard_len(size_t n) const { return (n + static_cast<size_t>(world) - 1) / static_cast<size_t>(world); }
  /// A buffer of n elements in `layer`: its owned range (stage 0: all of it) and residency.
  ZeroShard place(size_t n, int layer, bool trainable) const;
};

/// Gradient buckets in backward order (layers n_layer .. -1 of layer_slots, indexed layer
/// + 1): consecutive trainable buffers grouped while their full sizes stay within
/// reduce_bucket_size. Sets each bucketed shard's bucket and bucket_off.
std::vector<ZeroBucketPlan> zero_buckets_plan(const std::vector<ZeroShard*>& shards,
                                              const std::vector<std::vector<size_t>>& layer_slots, int stage,
                                              size_t reduce_bucket_size);

/// One post-step all-gather: its buffers (indices), the offset of each in the per-rank
/// segment (shard lengths) and the segment.
struct ZeroGatherGroup {
  std::vector<size_t> slots, offs;
  size_t seg = 0;
};
/// `list` cut into consecutive groups whose full sizes stay within cap (one buffer at
/// least each).
std::vector<ZeroGatherGroup> zero_gather_groups(const std::vector<const ZeroShard*>& shards,
                                                const std::vector<size_t>& list, size_t cap);

/// Stage 3's gathers around layer `layer` running in direction dir (+1 forward, -1
/// backward), the one rule the engine (ZeroGather::visit) runs and the memory and cluster
/// plans replay (ZeroGatherReplay): the layers to hold (keep, indexed layer + 1; every other
/// gathered layer is released), those gathered and waited for before the layer runs (now:
/// the layer, and the embeddings whenever they are kept), and those issued ahead (ahead, in
/// order). sharded_elems[l + 1]: the sharded elements of layer l (zero_layer_sharded).
struct ZeroWindow {
  std::vector<char> keep;
  std::vector<int> now;
  std::vector<int> ahead;
};
ZeroWindow zero_prefetch_window(const std::vector<size_t>& sharded_elems, int layer, int dir, bool tied,
                                size_t prefetch_bucket_size, size_t max_live_parameters);

/// The sharded elements of each layer (index layer + 1) of the buffers in layer_slots.
std::vector<size_t> zero_layer_sharded(const std::vector<const ZeroShard*>& shards,
                                       const std::vector<std::vector<size_t>>& layer_slots);

/// The buffers the model holds whole whose values an update changes: trainable and not
/// sharded, in slot order (ZeroGather::resident_refresh all-gathers them after each update at
/// stages 1-3).
std::vector<size_t> zero_resident_trainable(const std::vector<const ZeroShard*>& shards);

/// The all-gathers after each update (ZeroGather::resident_refresh), the one rule the engine
/// runs and the memory and cluster plans count: at stages 1-3 (on any number of ranks) the
/// buffers of zero_resident_trainable -- at stage 3 the trainable ones under
/// stage3_param_persistence_threshold -- in groups of at most allgather_bucket_size elements
/// (zero_gather_groups), each through a working buffer of world x seg elements in the
/// compute dtype; none at stage 0, where AdamW writes the model's buffers itself.
std::vector<ZeroGatherGroup> zero_post_update_gathers(const std::vector<const ZeroShard*>& shards, int stage,
                                                      size_t allgather_bucket_size);

// ----------------------------------------------------------------------------
// The layout as a plan builds it without an engine (train/memory_plan.cpp, lib/plan's
// cluster plan): the same rules over the model's buffers.

/// The model's buffers in the engine's slot order (base buffers, then the adapters), each
/// placed by `place` (a plan takes rank 0's: it needs lengths only), with each layer's.
struct ZeroLayout {
  ZeroPlacement place;
  std::vector<ZeroShard> shards;
  std::vector<std::vector<size_t>> layer_slots;  ///< index layer + 1: -1 .. n_layer

  ZeroLayout(const ZeroPlacement& p, int n_layer) : place(p), layer_slots(static_cast<size_t>(n_layer) + 2) {}
  /// A buffer of n elements in `layer` (-1 .. n_layer); returns its index.
  size_t add(size_t n, int layer, bool trainable);
  std::vector<const ZeroShard*> view() const;
  /// zero_buckets_plan over these buffers (sets their bucket fields).
  std::vector<ZeroBucketPlan> buckets(size_t reduce_bucket_size);
  std::vector<size_t> layer_sharded() const { return zero_layer_sharded(view(), layer_slots); }
};

/// Stage 3's gathers as a plan replays them: which layers are gathered, moved as the
/// engine moves them, by its visits (ZeroGather::visit over zero_prefetch_window) and by the
/// release of each layer after its backward. (The engine keeps this state in its slots.)
class ZeroGatherReplay {
 public:
  ZeroGatherReplay(std::vector<size_t> sharded_elems, bool tied, size_t prefetch_bucket_size,
                   size_t max_live_parameters);

  /// One gather issued: its layer, and whether ahead of its layer (prefetched) or waited for.
  struct Gather {
    int layer = 0;
    bool early = false;
  };
  /// What one visit changes, in the engine's order: the layers released (out of the window,
  /// in layer order), then the gathers issued (now, then ahead; a layer gathered already is
  /// not gathered again).
  struct Visit {
    std::vector<int> released;
    std::vector<Gather> issued;
  };
  Visit visit(int layer, int dir);
  /// Layer released after its backward; false when it was not gathered.
  bool release(int layer);
  bool gathered(int layer) const { return gathered_[static_cast<size_t>(layer + 1)] != 0; }

 private:
  std::vector<size_t> elems_;
  std::vector<char> gathered_;
  bool tied_;
  size_t prefetch_, live_;
};

}  // namespace dtrain::train
