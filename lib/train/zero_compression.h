// The ZeRO engine's gradient compression on its stage 0-1 buckets, each bucket's
// reduction in place of the plain allreduce: top-k with error feedback (zero_topk.cpp)
// and PowerSGD (zero_powersgd.cpp), with the per-rank state a checkpoint saves.
#pragma once

#include "device/device.h"
#include "train/zero_fwd.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::train {

class ZeroCompression {
 public:
  /// The engine's options, slots and (planned) buckets, borrowed for its lifetime.
  ZeroCompression(device::Device& dev, const ZeroOptions& opts, ZeroCollectives& coll, std::vector<ZeroSlot>& slots,
                  const std::vector<ZeroBucket>& buckets)
      : dev_(dev), opts_(opts), coll_(coll), slots_(slots), buckets_(buckets) {}

  /// Checks the compression options against the stage and wire (ConfigError) and, with a
  /// group, makes the state: top-k's residuals and scratch, PowerSGD's plan.
  void plan(ZeroWorkMeter& work);
  /// Top-k is on: it reduces every bucket (in its own buffers).
  bool topk() const { return !residual_.empty(); }
  /// PowerSGD reduces this step's buckets (after its start step).
  bool powersgd_active(int64_t step_count) const;
  /// Bucket `index`'s reduction (from a communication task).
  void topk_reduce(size_t index);
  void powersgd_reduce(size_t index);
  /// After an overflow (a skipped step): the inf/NaN gradients went into the top-k
  /// residuals and PowerSGD's errors and Q, and would poison every later step; they start
  /// over (residuals and errors zero, Q from its seed), on every rank alike.
  void reset();
  /// The state saved per rank (ZeroCheckpointView::rank_state), in its order.
  std::vector<device::DeviceBuffer*> rank_state();

 private:
  size_t bucket_full(const ZeroBucket& b) const;
  size_t topk_k(size_t full) const;
  void topk_plan(ZeroWorkMeter& work);
  void powersgd_plan(ZeroWorkMeter& work);
  void powersgd_q_init();

  device::Device& dev_;
  const ZeroOptions& opts_;
  ZeroCollectives& coll_;
  std::vector<ZeroSlot>& slots_;
  const std::vector<ZeroBucket>& buckets_;
  // top-k: each bucket's residual (its full length: what was not sent yet), and scratch
  // for the dense sum (the largest bucket), this rank's k values then k int32 indices,
  // and every rank's.
  std::vector<device::DeviceBuffer> residual_;
  device::DeviceBuffer topk_dense_, topk_mine_, topk_all_;
  // PowerSGD: per bucket, its matrices (a 2-D view of a tensor, n x m, compressed at rank
  // r) and its plain ranges (1-D tensors and matrices that compression would not shrink).
  struct PsgdMatrix {
    size_t slot = 0, off = 0;  // the tensor in its slot's buffer
    size_t n = 0, m = 0, r = 0;
    size_t p_off = 0, q_off = 0, err_off = 0;  // in the bucket's P scratch, psgd_q_, psgd_err_
  };
  struct PsgdBucket {
    std::vector<PsgdMatrix> mats;
    std::vector<std::array<size_t, 3>> plain;  // slot, offset, count
    size_t p_len = 0, plain_len = 0;
    size_t q_begin = 0, q_len = 0;  // its matrices' Q factors, contiguous in psgd_q_
  };
  std::vector<PsgdBucket> psgd_;
  // Q (warm-started, kept between steps) and the error (per rank) of every matrix; scratch
  // for a bucket's P factors and its plain values.
  device::DeviceBuffer psgd_q_, psgd_err_, psgd_p_, psgd_plain_;
};

}  // namespace dtrain::train
