// ZeRO layout arithmetic: shard ranges, gradient buckets, all-gather groups, prefetch window;
// a plan's copy of the layout and its replay of stage 3's gathers.
#include "train/zero_layout.h"

#include "core/check.h"

#include <algorithm>
#include <utility>

namespace dtrain::train {

ZeroShard ZeroPlacement::place(size_t n, int layer, bool trainable) const {
  ZeroShard s;
  s.layer = layer;
  s.trainable = trainable;
  s.n = n;
  if (stage == 0) {
    s.s = n;
    s.lo = 0;
    s.hi = n;
  } else {
    s.s = shard_len(n);
    s.lo = std::min(static_cast<size_t>(rank) * s.s, n);
    s.hi = std::min(s.lo + s.s, n);
  }
  s.sharded = stage == 3 && n >= persistence_threshold;
  return s;
}

std::vector<ZeroBucketPlan> zero_buckets_plan(const std::vector<ZeroShard*>& shards,
                                              const std::vector<std::vector<size_t>>& layer_slots, int stage,
                                              size_t reduce_bucket_size) {
  std::vector<ZeroBucketPlan> buckets;
  const int n_layer = static_cast<int>(layer_slots.size()) - 2;
  for (int l = n_layer; l >= -1; --l) {
    for (size_t i : layer_slots[static_cast<size_t>(l + 1)]) {
      ZeroShard& s = *shards[i];
      if (!s.trainable) continue;
      size_t full = 0;
      if (!buckets.empty())
        for (size_t j : buckets.back().slots) full += shards[j]->n;
      if (buckets.empty() || full + s.n > reduce_bucket_size) buckets.emplace_back();
      ZeroBucketPlan& b = buckets.back();
      s.bucket = buckets.size() - 1;
      s.bucket_off = b.seg;
      b.slots.push_back(i);
      b.offs.push_back(b.seg);
      b.seg += stage == 0 ? s.n : s.s;
      b.done_layer = l;
    }
  }
  return buckets;
}

std::vector<ZeroGatherGroup> zero_gather_groups(const std::vector<const ZeroShard*>& shards,
                                                const std::vector<size_t>& list, size_t cap) {
  std::vector<ZeroGatherGroup> groups;
  size_t k = 0;
  while (k < list.size()) {
    ZeroGatherGroup g;
    size_t full = 0;
    while (k < list.size() && (g.slots.empty() || full + shards[list[k]]->n <= cap)) {
      g.slots.push_back(list[k]);
      g.offs.push_back(g.seg);
      g.seg += shards[list[k]]->s;
      full += shards[list[k]]->n;
      ++k;
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

ZeroWindow zero_prefetch_window(const std::vector<size_t>& sharded_elems, int layer, int dir, bool tied,
                                size_t prefetch_bucket_size, size_t max_live_parameters) {
  const int L = static_cast<int>(sharded_elems.size()) - 2;
  auto idx = [](int l) { return static_cast<size_t>(l + 1); };
  ZeroWindow w;
  w.keep.assign(static_cast<size_t>(L) + 2, 0);
  w.keep[idx(layer)] = 1;
  // The tied head reads the embeddings in forward and backward.
  if (tied && ((dir > 0 && layer == L) || dir < 0)) w.keep[idx(-1)] = 1;
  // The layers ahead held gathered: as many as fit in prefetch_bucket_size elements in
  // all (gathered already or not: DeepSpeed's fixed prefetch bucket), and with the current
  // layer within max_live_parameters. Counting only the layers still to gather let the
  // window grow by a bucket at every layer (most of a 201M model gathered at once).
  size_t held = 0;
  for (int l = -1; l <= L; ++l)
    if (w.keep[idx(l)]) held += sharded_elems[idx(l)];
  size_t window = 0;
  for (int l = layer + dir; l >= -1 && l <= L; l += dir) {
    const size_t need = sharded_elems[idx(l)];
    if (window + need > prefetch_bucket_size || held + window + need > max_live_parameters) break;
    window += need;
    w.keep[idx(l)] = 1;
    w.ahead.push_back(l);
  }
  // The current layer is waited for, and the embeddings whenever they are kept (also when
  // only the window holds them: the backward of layer 0).
  w.now.push_back(layer);
  if (layer != -1 && w.keep[idx(-1)]) w.now.push_back(-1);
  return w;
}

std::vector<size_t> zero_layer_sharded(const std::vector<const ZeroShard*>& shards,
                                       const std::vector<std::vector<size_t>>& layer_slots) {
  std::vector<size_t> elems(layer_slots.size(), 0);
  for (size_t li = 0; li < layer_slots.size(); ++li)
    for (size_t i : layer_slots[li])
      if (shards[i]->sharded) elems[li] += shards[i]->n;
  return elems;
}

std::vector<size_t> zero_resident_trainable(const std::vector<const ZeroShard*>& shards) {
  std::vector<size_t> list;
  for (size_t i = 0; i < shards.size(); ++i)
    if (shards[i]->trainable && !shards[i]->sharded) list.push_back(i);
  return list;
}

std::vector<ZeroGatherGroup> zero_post_update_gathers(const std::vector<const ZeroShard*>& shards, int stage,
                                                      size_t allgather_bucket_size) {
  if (stage == 0) return {};
  return zero_gather_groups(shards, zero_resident_trainable(shards), allgather_bucket_size);
}

// ----------------------------------------------------------------------------
// A plan's layout and its replay of stage 3's gathers.

size_t ZeroLayout::add(size_t n, int layer, bool trainable) {
  DT_CHECK(layer >= -1 && static_cast<size_t>(layer + 1) < layer_slots.size());
  shards.push_back(place.place(n, layer, trainable));
  layer_slots[static_cast<size_t>(layer + 1)].push_back(shards.size() - 1);
  return shards.size() - 1;
}

std::vector<const ZeroShard*> ZeroLayout::view() const {
  std::vector<const ZeroShard*> v;
  for (const ZeroShard& s : shards) v.push_back(&s);
  return v;
}

std::vector<ZeroBucketPlan> ZeroLayout::buckets(size_t reduce_bucket_size) {
  std::vector<ZeroShard*> v;
  for (ZeroShard& s : shards) v.push_back(&s);
  return zero_buckets_plan(v, layer_slots, place.stage, reduce_bucket_size);
}

ZeroGatherReplay::ZeroGatherReplay(std::vector<size_t> sharded_elems, bool tied, size_t prefetch_bucket_size,
                                   size_t max_live_parameters)
    : elems_(std::move(sharded_elems)), gathered_(elems_.size(), 0), tied_(tied), prefetch_(prefetch_bucket_size),
      live_(max_live_parameters) {}

ZeroGatherReplay::Visit ZeroGatherReplay::visit(int layer, int dir) {
  const ZeroWindow w = zero_prefetch_window(elems_, layer, dir, tied_, prefetch_, live_);
  Visit v;
  for (size_t li = 0; li < gathered_.size(); ++li)
    if (gathered_[li] && !w.keep[li]) {
      gathered_[li] = 0;
      v.released.push_back(static_cast<int>(li) - 1);
    }
  auto issue = [&](int l, bool early) {
    char& g = gathered_[static_cast<size_t>(l + 1)];
    if (g) return;
    g = 1;
    v.issued.push_back({l, early});
  };
  for (int l : w.now) issue(l, false);
  for (int l : w.ahead) issue(l, true);
  return v;
}

bool ZeroGatherReplay::release(int layer) {
  char& g = gathered_[static_cast<size_t>(layer + 1)];
  const bool was = g != 0;
  g = 0;
  return was;
}

}  // namespace dtrain::train
