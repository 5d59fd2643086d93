// The ZeRO engine's gradient buckets: at stages 0/1 each bucket allreduced (stage 0) or
// reduce-scattered into the owned range (stage 1) at step time or, overlapped, as soon as
// the last micro-batch's backward completes it (through compression where it is on); at
// stages 2/3 each layer's gradient in a working buffer while its backward runs, packed
// into its bucket, and each full bucket reduce-scattered into the gradient shards (or,
// offloaded, landed on the host).
#pragma once

#include "device/device.h"
#include "train/zero_fwd.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::train {

class ZeroGradBuckets {
 public:
  /// The engine's parts and state, borrowed for its lifetime.
  ZeroGradBuckets(device::Device& dev, const ZeroOptions& opts, const ZeroPlacement& place, ZeroCollectives& coll,
                  ZeroWorkMeter& work, ZeroCompression& compress, ZeroOffload& offload, std::vector<ZeroSlot>& slots,
                  std::vector<ZeroBucket>& buckets)
      : dev_(dev), opts_(opts), place_(place), coll_(coll), work_(work), compress_(compress), offload_(offload),
        slots_(slots), buckets_(buckets) {}

  /// Stages 0/1 at step time: every bucket in order, through one scratch buffer.
  /// step_count: the applied updates (PowerSGD starts after some).
  void reduce_step(int64_t step_count);
  /// Stages 0/1 overlapped: bucket `index` is complete, its collective issued now with a
  /// buffer of its own that the task frees.
  void reduce_async(size_t index, int64_t step_count);

  /// What a landing on the host (offload) does: update the bucket at once (eager, last
  /// micro-batch) with this lr and AdamW step.
  struct Landing {
    bool update = false;
    float lr = 0.0f;
    int64_t step = 0;
  };
  /// Stages 2/3, before its layer's backward: a working gradient for slot s.
  void attach(ZeroSlot& s);
  /// Stages 2/3, after its layer's backward: s's gradient packed into its bucket; a full
  /// bucket is reduce-scattered. True when it issued its bucket.
  bool pack(ZeroSlot& s, const Landing& landing);

 private:
  bool inplace(const ZeroBucket& b) const;
  size_t bucket_len(const ZeroBucket& b) const;
  void bucket_pack(const ZeroBucket& b, float* buf);
  void collective(const ZeroBucket& b, float* buf, int64_t step_count);
  void flush(size_t index, const Landing& landing);

  device::Device& dev_;
  const ZeroOptions& opts_;
  const ZeroPlacement& place_;
  ZeroCollectives& coll_;
  ZeroWorkMeter& work_;
  ZeroCompression& compress_;
  ZeroOffload& offload_;
  std::vector<ZeroSlot>& slots_;
  std::vector<ZeroBucket>& buckets_;
};

}  // namespace dtrain::train
