// Top-k gradient compression with error feedback on the ZeRO engine's stage 0-1 gradient
// buckets (communication.compression topk; Deep Gradient Compression, Lin et al. 2018).
#include "train/zero_compression.h"

#include "train/zero_comm.h"
#include "train/zero_engine.h"
#include "train/zero_slot.h"

#include "core/check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dtrain::train {

// The options' checks in the order the engine made them, then the state (with a group).
void ZeroCompression::plan(ZeroWorkMeter& work) {
  DT_ENFORCE(opts_.grad_wire == DType::F32 || opts_.grad_wire == DType::BF16 || opts_.grad_wire == DType::F16,
             ConfigError, "communication.compression: unknown gradient wire dtype");
  // PowerSGD and top-k keep per-rank state of the whole gradient: stages 0-1 only.
  auto sparse_method_check = [&](const char* method) {
    DT_ENFORCE(opts_.stage <= 1, ConfigError,
               "communication.compression: {} needs zero_optimization.stage 0 or 1, but the stage is {}", method,
               opts_.stage);
  };
  if (opts_.topk_ratio != 0.0) {
    DT_ENFORCE(opts_.topk_ratio > 0.0 && opts_.topk_ratio <= 1.0, ConfigError,
               "communication.topk.ratio {} is not in (0, 1]", opts_.topk_ratio);
    sparse_method_check("topk");
    DT_ENFORCE(opts_.grad_wire == DType::F32, ConfigError,
               "communication.compression: topk and a 16-bit wire are exclusive");
    if (coll_.comm() != nullptr) topk_plan(work);
  }
  if (opts_.powersgd_rank != 0) {
    DT_ENFORCE(opts_.powersgd_rank > 0, ConfigError, "communication.powersgd.rank {} must be at least 1",
               opts_.powersgd_rank);
    sparse_method_check("powersgd");
    DT_ENFORCE(opts_.grad_wire == DType::F32 && opts_.topk_ratio == 0.0, ConfigError,
               "communication.compression: powersgd, topk and a 16-bit wire are exclusive");
    if (coll_.comm() != nullptr) powersgd_plan(work);
  }
}

// The same on every rank, so the residuals keep the same lengths: one per bucket.
void ZeroCompression::topk_plan(ZeroWorkMeter& work) {
  size_t most = 0;
  for (const auto& b : buckets_) {
    const size_t n = bucket_full(b);
    DT_ENFORCE(n < (size_t{1} << 31), ConfigError,
               "communication.compression topk: a gradient bucket of {} elements does not fit int32 indices; "
               "lower zero_optimization.reduce_bucket_size",
               n);
    residual_.emplace_back(dev_, n * sizeof(float));
    dev_.zero(residual_.back().get(), n * sizeof(float));
    most = std::max(most, n);
  }
  const size_t k = topk_k(most), W = static_cast<size_t>(coll_.world());
  topk_dense_ = device::DeviceBuffer(dev_, most * sizeof(float));
  topk_mine_ = device::DeviceBuffer(dev_, 2 * k * sizeof(float));
  topk_all_ = device::DeviceBuffer(dev_, W * 2 * k * sizeof(float));
  work.add(static_cast<ptrdiff_t>(topk_dense_.bytes() + topk_mine_.bytes() + topk_all_.bytes()));
}

// Top-k with error feedback (Deep Gradient Compression, Lin et al. 2018): the bucket's
// gradients are added to its residual, the k = ceil(ratio n) largest |residual| are sent
// and zeroed there (the residual keeps the rest), and every rank sums all ranks' pairs
// into a dense buffer in rank order, so all ranks hold the same average. Indices are
// gathered, never summed. The pairs travel as fp32 words: an all-gather copies bits.
size_t ZeroCompression::bucket_full(const ZeroBucket& b) const {
  size_t n = 0;
  for (size_t i : b.slots) n += slots_[i].n;
  return n;
}

size_t ZeroCompression::topk_k(size_t full) const {
  const auto k = static_cast<size_t>(std::ceil(opts_.topk_ratio * static_cast<double>(full)));
  return std::min(full, std::max<size_t>(1, k));
}

void ZeroCompression::topk_reduce(size_t index) {
  const ZeroBucket& b = buckets_[index];
  const size_t n = bucket_full(b), k = topk_k(n), W = static_cast<size_t>(coll_.world());
  float* res = residual_[index].as<float>();
  size_t off = 0;
  for (size_t i : b.slots) {
    dev_.add(res + off, slots_[i].pb->grad, slots_[i].n);
    off += slots_[i].n;
  }
  float* mine = topk_mine_.as<float>();
  dev_.topk_select(res, n, k, mine, reinterpret_cast<int32_t*>(mine + k));
  float* all = topk_all_.as<float>();
  coll_.comm()->all_gather(mine, all, 2 * k, DType::F32);
  float* dense = topk_dense_.as<float>();
  dev_.zero(dense, n * sizeof(float));
  for (size_t r = 0; r < W; ++r)
    dev_.sparse_add(dense, all + r * 2 * k, reinterpret_cast<const int32_t*>(all + r * 2 * k + k), k);
  dev_.scale(dense, n, 1.0f / static_cast<float>(coll_.world()));
  off = 0;
  for (size_t i : b.slots) {
    dev_.copy_d2d(slots_[i].pb->grad, dense + off, slots_[i].n * sizeof(float));
    off += slots_[i].n;
  }
}

}  // namespace dtrain::train
