// The ZeRO engine's layout, arithmetic only: the element range of each model buffer a
// rank owns (its shard) and whether stage 3 keeps it resident, the gradient buckets in
// backward order, the post-step all-gather groups and stage 3's prefetch window. No
// device and no communicator, so it is unit-tested on its own (zero_layout_test).
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
/// backward): the layers to hold (keep, indexed layer + 1) and those to prefetch (ahead,
/// in order). sharded_elems[l + 1]: the sharded elements of layer l.
struct ZeroWindow {
  std::vector<char> keep;
  std::vector<int> ahead;
};
ZeroWindow zero_prefetch_window(const std::vector<size_t>& sharded_elems, int layer, int dir, bool tied,
                                size_t prefetch_bucket_size, size_t max_live_parameters);

}  // namespace dtrain::train
