// ZeroGather: stage 3's per-layer gathers with prefetch and release, and the bucketed
// all-gathers of owned shards into the model's buffers.
#include "train/zero_gather.h"

#include "train/zero_comm.h"
#include "train/zero_engine.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dtrain::train {

void ZeroGather::configure(DType model_dtype, bool tied) {
  mdt_ = model_dtype;
  tied_ = tied;
}

std::vector<const ZeroShard*> ZeroGather::shards() const {
  std::vector<const ZeroShard*> v;
  for (const auto& s : slots_) v.push_back(&s);
  return v;
}

// ----------------------------------------------------------------------------
// Stage 3 parameters: a sharded buffer is gathered (in the compute dtype) into a
// working buffer just before its layer runs and released after; the next layers'
// gathers are issued ahead within prefetch_bucket_size / max_live_parameters.
void ZeroGather::issue(ZeroSlot& s) {
  if (s.gathered) return;
  s.gathered = true;
  const size_t W = static_cast<size_t>(place_.world);
  s.work = device::DeviceBuffer(dev_, W * s.s * dtype_size(mdt_));
  work_.add(static_cast<ptrdiff_t>(s.work.bytes()));
  const DType t = opts_.compute_dtype;
  ZeroSlot* sp = &s;
  s.gather_ticket = coll_.submit([this, sp, t, W] {
    ZeroSlot& g = *sp;
    char* work = static_cast<char*>(g.work.get());
    if (t == mdt_) {  // on the wire in the model's dtype: straight into the working buffer
      char* mine = work + static_cast<size_t>(place_.rank) * g.s * dtype_size(t);
      // offload_param: the shard comes from host memory, asynchronously (the host copy is
      // rewritten only by the update, after the gathers of the step are done).
      if (g.off_param && g.owned() && g.host_shard_dtype(mdt_) == t)
        dev_.copy_h2d_async(mine, g.host_shard(), g.owned() * dtype_size(t));
      else offload_.shard_to_device(mine, t, g);
      coll_.all_gather(work, g.s, t);
    } else {  // fp32 model (CPU) under mixed precision: the wire is 16-bit
      device::DeviceBuffer wire(dev_, W * g.s * dtype_size(t));
      work_.add(static_cast<ptrdiff_t>(wire.bytes()));
      char* w = static_cast<char*>(wire.get());
      offload_.shard_to_device(w + static_cast<size_t>(place_.rank) * g.s * dtype_size(t), t, g);
      coll_.all_gather(w, g.s, t);
      dev_.cast(work, mdt_, w, t, g.n);
      work_.add(-static_cast<ptrdiff_t>(wire.bytes()));
      wire.reset();
    }
    if (g.ready) dev_.event_record(*g.ready, coll_.stream());
  });
}

void ZeroGather::wait(ZeroSlot& s) {
  coll_.wait(s.gather_ticket);
  if (s.ready) dev_.stream_wait(nullptr, *s.ready);
  s.pb->data = s.work.get();
}

void ZeroGather::release(ZeroSlot& s) {
  if (!s.gathered) return;
  coll_.wait(s.gather_ticket);
  if (s.ready) dev_.stream_wait(nullptr, *s.ready);  // freed on the compute stream after the gather
  s.gathered = false;
  s.pb->data = nullptr;
  work_.add(-static_cast<ptrdiff_t>(s.work.bytes()));
  s.work.reset();
}

void ZeroGather::release_all() {
  for (auto& s : slots_)
    if (s.sharded && s.gathered) release(s);
}

// The hook body for layer `layer` in direction dir (+1 forward, -1 backward): the window
// of layers to hold (zero_prefetch_window, the rule the plans replay), what falls out of
// it released, the current layer's gathers (and the kept embeddings') waited for and the
// layers ahead issued.
void ZeroGather::visit(int layer, int dir) {
  const int L = static_cast<int>(layer_slots_.size()) - 2;
  auto idx = [](int l) { return static_cast<size_t>(l + 1); };
  const ZeroWindow w = zero_prefetch_window(zero_layer_sharded(shards(), layer_slots_), layer, dir, tied_,
                                            opts_.prefetch_bucket_size, opts_.max_live_parameters);
  for (auto& s : slots_)
    if (s.sharded && s.gathered && !w.keep[idx(s.layer)]) release(s);
  std::vector<ZeroSlot*> now;
  for (int l : w.now) {
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) {
        issue(slots_[i]);
        now.push_back(&slots_[i]);
      }
  }
  for (int l : w.ahead)
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) issue(slots_[i]);
  for (ZeroSlot* s : now) wait(*s);
  if (dir > 0 && layer == L) coll_.wait_all();  // nothing in flight on a thread once forward returns
}

// The model's resident copies of the trainable buffers after an update at stages 1-3:
// the owned shards all-gathered in the compute dtype (stage 0's AdamW wrote them).
// (zero_post_update_gathers: the rule the memory and cluster plans count.)
void ZeroGather::resident_refresh() {
  groups_into_model(zero_post_update_gathers(shards(), opts_.stage, opts_.allgather_bucket_size), opts_.compute_dtype);
}

// Bucketed all-gather of the masters of `list` (slots with a master, stages >= 1) into
// the model's full buffers, on the wire as `t`.
void ZeroGather::into_model(const std::vector<size_t>& list, DType t) {
  groups_into_model(zero_gather_groups(shards(), list, opts_.allgather_bucket_size), t);
}

// Each group through a working buffer of its own (world x seg elements of t).
void ZeroGather::groups_into_model(const std::vector<ZeroGatherGroup>& groups, DType t) {
  const size_t W = static_cast<size_t>(place_.world), es = dtype_size(t);
  for (const ZeroGatherGroup& g : groups) {
    coll_.wait(coll_.submit([&] {
      device::DeviceBuffer buf(dev_, W * g.seg * es);
      work_.add(static_cast<ptrdiff_t>(buf.bytes()));
      char* b = static_cast<char*>(buf.get());
      char* mine = b + static_cast<size_t>(place_.rank) * g.seg * es;
      for (size_t j = 0; j < g.slots.size(); ++j) {
        ZeroSlot& s = slots_[g.slots[j]];
        // The owned shard's values: the master, or the model's own range where it is the master.
        offload_.shard_to_device(mine + g.offs[j] * es, t, s);
      }
      coll_.all_gather(b, g.seg, t);
      for (size_t q = 0; q < W; ++q)
        for (size_t j = 0; j < g.slots.size(); ++j) {
          ZeroSlot& s = slots_[g.slots[j]];
          const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
          if (e > a) dev_.cast(zero_at(s.pb->data, a, mdt_), mdt_, b + (q * g.seg + g.offs[j]) * es, t, e - a);
        }
      work_.add(-static_cast<ptrdiff_t>(buf.bytes()));
      buf.reset();
    }));
  }
}

}  // namespace dtrain::train
