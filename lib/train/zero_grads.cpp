// ZeroGradBuckets: the stage 0/1 bucket reductions (step time or overlapped) and the
// stage 2/3 per-layer packing and reduce-scatter of gradient buckets.
#include "train/zero_grads.h"

#include "train/zero_comm.h"
#include "train/zero_compression.h"
#include "train/zero_engine.h"
#include "train/zero_offload.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace dtrain::train {

// Stage 0: allreduce (AVG) per bucket; stage 1: reduce-scatter (AVG) per bucket into
// the owned range of the model's full gradient buffer. A single-slot stage-0 bucket is
// reduced in place; otherwise the bucket is packed into `buf` (stage 0: the slots one
// after the other; stage 1: rank-major, W segments) and unpacked after the collective.
// Packing, collective and unpacking run together on the communication side.
bool ZeroGradBuckets::inplace(const ZeroBucket& b) const { return opts_.stage == 0 && b.slots.size() == 1; }

size_t ZeroGradBuckets::bucket_len(const ZeroBucket& b) const {
  if (compress_.topk()) return 0;  // top-k works in its own buffers
  return inplace(b) ? 0 : (opts_.stage == 0 ? 1 : static_cast<size_t>(place_.world)) * b.seg;
}

void ZeroGradBuckets::bucket_pack(const ZeroBucket& b, float* buf) {
  const size_t W = static_cast<size_t>(place_.world);
  if (opts_.stage == 0) {
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const ZeroSlot& s = slots_[b.slots[k]];
      dev_.copy_d2d(buf + b.offs[k], s.pb->grad, s.n * sizeof(float));
    }
    return;
  }
  dev_.zero(buf, W * b.seg * sizeof(float));
  for (size_t k = 0; k < b.slots.size(); ++k) {
    const ZeroSlot& s = slots_[b.slots[k]];
    for (size_t q = 0; q < W; ++q) {
      const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
      if (e > a) dev_.copy_d2d(buf + q * b.seg + b.offs[k], s.pb->grad + a, (e - a) * sizeof(float));
    }
  }
}

// The compute side no longer writes these slots' gradients (the bucket is complete).
void ZeroGradBuckets::collective(const ZeroBucket& b, float* buf, int64_t step_count) {
  if (compress_.topk()) {
    compress_.topk_reduce(static_cast<size_t>(&b - buckets_.data()));
    return;
  }
  if (compress_.powersgd_active(step_count)) {
    compress_.powersgd_reduce(static_cast<size_t>(&b - buckets_.data()));
    return;
  }
  if (inplace(b)) {
    coll_.grad_reduce(slots_[b.slots[0]].pb->grad, b.seg, false);
    return;
  }
  bucket_pack(b, buf);
  if (opts_.stage == 0) {
    coll_.grad_reduce(buf, b.seg, false);
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const ZeroSlot& s = slots_[b.slots[k]];
      dev_.copy_d2d(s.pb->grad, buf + b.offs[k], s.n * sizeof(float));
    }
    return;
  }
  coll_.grad_reduce(buf, static_cast<size_t>(place_.world) * b.seg, true);
  const float* mine = buf + static_cast<size_t>(place_.rank) * b.seg;
  for (size_t k = 0; k < b.slots.size(); ++k) {
    const ZeroSlot& s = slots_[b.slots[k]];
    if (s.owned()) dev_.copy_d2d(s.pb->grad + s.lo, mine + b.offs[k], s.owned() * sizeof(float));
  }
}

// overlap_comm, stages 0/1, last micro-batch: bucket `index` is complete, so its
// collective is issued now (communication thread or stream) with a bucket buffer of its
// own that the task frees; after_layer_backward(-1) waits for all of them.
void ZeroGradBuckets::reduce_async(size_t index, int64_t step_count) {
  const ZeroBucket& b = buckets_[index];
  const size_t len = bucket_len(b);
  auto buf = std::make_shared<device::DeviceBuffer>(dev_, len * sizeof(float));
  if (len) work_.add(static_cast<ptrdiff_t>(len * sizeof(float)));
  coll_.submit([this, buf, index, step_count] {
    collective(buckets_[index], buf->as<float>(), step_count);
    const size_t bytes = buf->bytes();
    buf->reset();  // on the communication stream, after the collective
    if (bytes) work_.add(-static_cast<ptrdiff_t>(bytes));
  });
}

void ZeroGradBuckets::reduce_step(int64_t step_count) {
  if (coll_.comm() == nullptr) return;
  size_t most = 0;
  for (const auto& b : buckets_) most = std::max(most, bucket_len(b));
  device::DeviceBuffer scratch(dev_, most * sizeof(float));
  work_.add(static_cast<ptrdiff_t>(most * sizeof(float)));
  float* buf = scratch.as<float>();
  for (const auto& b : buckets_)
    coll_.wait(coll_.submit([this, &b, buf, step_count] { collective(b, buf, step_count); }));
  coll_.join();  // before the scratch is freed on the compute stream
  scratch.reset();
  work_.add(-static_cast<ptrdiff_t>(most * sizeof(float)));
}

// ----------------------------------------------------------------------------
// Stage 2/3 gradients: each layer's gradient lives in a working buffer from
// before_layer_backward to after_layer_backward, is packed rank-major into its bucket
// and the full bucket is reduce-scattered (AVG) and accumulated into the shards.
void ZeroGradBuckets::attach(ZeroSlot& s) {
  if (!s.trainable || s.wgrad.get() != nullptr) return;
  s.wgrad = device::DeviceBuffer(dev_, s.n * sizeof(float));
  work_.add(static_cast<ptrdiff_t>(s.n * sizeof(float)));
  s.pb->grad = s.wgrad.as<float>();
}

bool ZeroGradBuckets::pack(ZeroSlot& s, const Landing& landing) {
  ZeroBucket& b = buckets_[s.bucket];
  const size_t W = static_cast<size_t>(place_.world);
  if (!b.buf) {
    b.buf = std::make_shared<device::DeviceBuffer>(dev_, W * b.seg * sizeof(float));
    work_.add(static_cast<ptrdiff_t>(W * b.seg * sizeof(float)));
  }
  float* dst = b.buf->as<float>();
  for (size_t q = 0; q < W; ++q) {
    const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
    if (e > a) dev_.copy_d2d(dst + q * b.seg + s.bucket_off, s.wgrad.as<float>() + a, (e - a) * sizeof(float));
  }
  s.pb->grad = nullptr;
  s.wgrad.reset();
  work_.add(-static_cast<ptrdiff_t>(s.n * sizeof(float)));
  if (++b.packed != b.slots.size()) return false;
  flush(s.bucket, landing);
  return true;
}

void ZeroGradBuckets::flush(size_t index, const Landing& landing) {
  ZeroBucket& b = buckets_[index];
  std::shared_ptr<device::DeviceBuffer> buf = std::move(b.buf);
  b.buf.reset();
  b.packed = 0;
  coll_.submit([this, buf, index, landing] {
    const ZeroBucket& bk = buckets_[index];
    float* base = buf->as<float>();
    coll_.grad_reduce(base, static_cast<size_t>(place_.world) * bk.seg, true);
    const float* mine = base + static_cast<size_t>(place_.rank) * bk.seg;
    if (offload_.on()) {
      // To the host, where the gradient shards accumulate.
      offload_.land(index, mine, landing.update, landing.lr, landing.step);
    } else {
      for (size_t k = 0; k < bk.slots.size(); ++k) {
        ZeroSlot& s = slots_[bk.slots[k]];
        if (s.owned()) dev_.add(s.gshard.as<float>(), mine + bk.offs[k], s.owned());
      }
    }
    const size_t bytes = buf->bytes();
    buf->reset();  // on the communication stream, after its last use
    work_.add(-static_cast<ptrdiff_t>(bytes));
  });
}

}  // namespace dtrain::train
