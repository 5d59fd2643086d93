// Top-k gradient compression with error feedback on the ZeRO engine's stage 0-1 gradient
// buckets (communication.compression topk; Deep Gradient Compression, Lin et al. 2018).
#include "train/zero_engine.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dtrain::train {

// Top-k with error feedback (Deep Gradient Compression, Lin et al. 2018): the bucket's
// gradients are added to its residual, the k = ceil(ratio n) largest |residual| are sent
// and zeroed there (the residual keeps the rest), and every rank sums all ranks' pairs
// into a dense buffer in rank order, so all ranks hold the same average. Indices are
// gathered, never summed. The pairs travel as fp32 words: an all-gather copies bits.
size_t ZeroEngine::bucket_full(const Bucket& b) const {
  size_t n = 0;
  for (size_t i : b.slots) n += slots_[i].n;
  return n;
}

size_t ZeroEngine::topk_k(size_t full) const {
  const auto k = static_cast<size_t>(std::ceil(opts_.topk_ratio * static_cast<double>(full)));
  return std::min(full, std::max<size_t>(1, k));
}

void ZeroEngine::topk_reduce(size_t index) {
  const Bucket& b = buckets_[index];
  const size_t n = bucket_full(b), k = topk_k(n), W = static_cast<size_t>(world_);
  float* res = residual_[index].as<float>();
  size_t off = 0;
  for (size_t i : b.slots) {
    dev_->add(res + off, slots_[i].pb->grad, slots_[i].n);
    off += slots_[i].n;
  }
  float* mine = topk_mine_.as<float>();
  dev_->topk_select(res, n, k, mine, reinterpret_cast<int32_t*>(mine + k));
  float* all = topk_all_.as<float>();
  comm_->all_gather(mine, all, 2 * k, DType::F32);
  float* dense = topk_dense_.as<float>();
  dev_->zero(dense, n * sizeof(float));
  for (size_t r = 0; r < W; ++r)
    dev_->sparse_add(dense, all + r * 2 * k, reinterpret_cast<const int32_t*>(all + r * 2 * k + k), k);
  dev_->scale(dense, n, 1.0f / static_cast<float>(world_));
  off = 0;
  for (size_t i : b.slots) {
    dev_->copy_d2d(slots_[i].pb->grad, dense + off, slots_[i].n * sizeof(float));
    off += slots_[i].n;
  }
}

}  // namespace dtrain::train
