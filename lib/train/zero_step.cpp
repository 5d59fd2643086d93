// ZeroEngine's step: gradients zeroed, the stage 0/1 bucket reduction (at step time, or
// overlapped in the last micro-batch's backward through zero_hooks.cpp), the norm, clip
// and overflow decision agreed on the device, AdamW over every owned tensor, the
// post-step all-gathers, and the one read-back.
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/dtype.h"
#include "ops/step_scale.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

namespace dtrain::train {

// ----------------------------------------------------------------------------
void ZeroEngine::before_step() {
  coll_.wait_all();
  coll_.join();
  step_.grads_reduced = false;
  offload_.step_begin();
  for (auto& s : slots_) {
    if (!s.trainable) continue;
    if (opts_.stage >= 2) {
      if (!s.off) dev_->zero(s.gshard.get(), s.gshard.bytes());
    } else if (s.pb->grad) dev_->zero(s.pb->grad, s.n * sizeof(float));
  }
}

void ZeroEngine::step_prepare(float lr) {
  step_.lr = lr;
  float v[3];
  ops::adamw_step_values(v, lr, opts_.adamw.weight_decay, opts_.adamw.beta1, opts_.adamw.beta2, step_.next_step());
  dev_->copy_h2d(step_buf_.at(offsetof(ZeroStepStats, scale)) + 2, v, sizeof v);
}

void ZeroEngine::step_issue(float loss_scale) {
  DT_ENFORCE(!weights_.materialized(), UsageError,
             "ZeroEngine::step_issue() after weights().materialize(); call weights().restore() first");
  DT_ENFORCE_GT(loss_scale, 0.0f, UsageError, "ZeroEngine::step_issue loss_scale");
  coll_.wait_all();
  if (opts_.stage <= 1 && !step_.grads_reduced) grads_.reduce_step(step_.results.step_count);
  coll_.join();  // the reduced gradients are complete
  if (offload_.on()) offload_.grads_collect();
  step_decide(loss_scale);
  if (offload_.on())
    offload_.step_issue(loss_scale, step_buf_.at(offsetof(ZeroStepStats, scale)), step_.lr, step_.next_step());
  adamw_issue();
  // A skipped step gathers the unchanged masters: the copies the model already holds.
  gather_.resident_refresh();
  gather_.release_all();
  coll_.join();  // the next forward reads the gathered copies
}

float* ZeroEngine::grad_shard(Slot& s) { return opts_.stage >= 2 ? s.gshard.as<float>() : s.pb->grad + s.lo; }

void ZeroEngine::step_decide(float loss_scale) {
  // Everything is decided on the device and read back once, after the update is issued:
  // the local sum of squares, its sum over the ranks (on the device communicator), the
  // clip scale and the overflow skip that AdamW reads from device memory.
  double* sq = reinterpret_cast<double*>(step_buf_.at(offsetof(ZeroStepStats, sq)));
  dev_->zero(sq, sizeof(double));
  if (offload_.on()) {  // the host's gradient shards: their sum of squares goes up as the start
    double h = 0.0;
    for (auto& s : slots_)
      if (s.off && s.owned()) device::cpu().norm_sq_accumulate(&h, s.hgrad.as<float>(), s.owned());
    dev_->copy_h2d(sq, &h, sizeof h);
  }
  // Every device shard in one call (CUDA: two launches for all of them, not two each).
  std::vector<const float*> g;
  std::vector<size_t> n;
  for (auto& s : slots_)
    if (s.trainable && s.owned() && !s.off) {
      g.push_back(grad_shard(s));
      n.push_back(s.owned());
    }
  dev_->norm_sq_accumulate_multi(sq, g.data(), n.data(), g.size());
  // The step's loss sum (the loss slots' means times step_targets' counts) rides on the
  // norm's collective as red[3]: no host allreduce for the log.
  float* const red4 = step_buf_.at(offsetof(ZeroStepStats, red));
  const bool loss = step_buf_.targets_set() && step_buf_.losses_n() > 0;
  if (loss)
    dev_->loss_sum(reinterpret_cast<double*>(step_buf_.at(offsetof(ZeroStepStats, loss))), red4 + 3, step_buf_.losses(),
                   step_buf_.counts(), static_cast<int>(step_buf_.losses_n()));
  float* red = nullptr;
  if (opts_.stage >= 1 && coll_.comm() != nullptr) {
    // Each rank holds a shard: sum the (hi, lo, overflow) triples so every rank takes the
    // same decision.
    red = red4;
    dev_->norm_sq_pack(red, sq);
    const size_t n = loss ? 4 : 3;
    coll_.wait(coll_.submit([this, red, n] { coll_.allreduce(red, n, DType::F32, comm::ReduceOp::SUM); }));
    coll_.join();  // the scale below reads the sum
  } else if (loss && coll_.comm() != nullptr) {
    coll_.wait(coll_.submit([this, red4] { coll_.allreduce(red4 + 3, 1, DType::F32, comm::ReduceOp::SUM); }));
    coll_.join();
  }
  float* scale = step_buf_.at(offsetof(ZeroStepStats, scale));
  dev_->step_scale(scale, sq, red, loss_scale, opts_.gradient_clipping);
}

void ZeroEngine::adamw_issue() {
  const int64_t step = step_.next_step();  // counted only if the update is applied
  const float* scale = step_buf_.at(offsetof(ZeroStepStats, scale));
  // Every owned tensor in one table: CUDA updates them in a few launches, not one each.
  std::vector<ops::AdamWTensor> update;
  for (auto& s : slots_) {
    if (!s.trainable || !s.owned() || s.off) continue;
    float* p = offload_.master_f32(s);
    const float* g = grad_shard(s);
    // Stage 0 under mixed precision: AdamW writes the compute copy in the same pass.
    const bool copy = opts_.stage == 0 && mixed_ && !s.sharded;
    for (const auto& t : s.pb->layout.tensors) {
      const size_t a = std::max(t.offset, s.lo), e = std::min(t.offset + t.numel(), s.hi);
      if (a >= e) continue;
      const size_t o = a - s.lo;
      ops::AdamWTensor x;
      x.param = p + o;
      x.grad = g + o;
      x.m = s.m.as<float>() + o;
      x.v = s.v.as<float>() + o;
      x.copy = copy ? zero_at(s.pb->data, a, mdt_) : nullptr;
      x.n = e - a;
      x.decay = t.decay;
      update.push_back(x);
    }
  }
  if (!update.empty()) dev_->adamw_multi(update.data(), update.size(), opts_.adamw, step_.lr, step, scale, mdt_);
  if (mdt_ == DType::F32)
    for (const auto& x : update)
      if (x.copy != nullptr) dev_->round_to(static_cast<float*>(x.copy), x.n, opts_.compute_dtype);
}

bool ZeroEngine::step_finish(float loss_scale) {
  const bool targets = step_buf_.targets_set();
  ZeroStepResults& r = step_.results;
  const ZeroStepStats st = step_buf_.read_back(r.losses);
  // One rank: the double sum as the host summed it; several: the fp32 sum over the ranks.
  r.loss_sum =
      !targets || step_buf_.losses_n() == 0 ? 0.0 : (coll_.comm() != nullptr && place_.world > 1 ? st.red[3] : st.loss);
  r.target_count = targets ? st.count : 0.0;
  r.grad_norm = std::sqrt(st.sq) / static_cast<double>(loss_scale);
  if (!std::isfinite(st.sq)) {
    compress_.reset();
    return false;
  }
  ++r.step_count;
  return true;
}

const float* ZeroEngine::targets_count() const { return step_buf_.at(offsetof(ZeroStepStats, count)); }

float* ZeroEngine::loss_slots(size_t n) { return step_buf_.loss_slots(n); }

void ZeroEngine::step_targets(const int64_t* counts, size_t n) {
  DT_ENFORCE_EQ(n, step_buf_.losses_n(), UsageError,
                "ZeroEngine::step_targets needs one count per loss slot (loss_slots first)");
  step_buf_.targets_upload(counts, n);
}

// Every rank, each step, before the backward that reads targets_count(): the sum over the
// ranks on the device communicator, ordered like the norm's reduction.
void ZeroEngine::targets_reduce() {
  if (coll_.comm() == nullptr || place_.world <= 1) return;
  float* c = step_buf_.at(offsetof(ZeroStepStats, count));
  coll_.wait(coll_.submit([this, c] { coll_.allreduce(c, 1, DType::F32, comm::ReduceOp::SUM); }));
  coll_.join();  // the backward reads the sum
}

// ----------------------------------------------------------------------------
float* ZeroStepBuffer::loss_slots(size_t n) {
  if (n > cap_) {
    buf_ = device::DeviceBuffer(dev_, sizeof(ZeroStepStats) + 2 * n * sizeof(float));
    cap_ = n;
  }
  n_ = n;
  return losses();
}

void ZeroStepBuffer::targets_upload(const int64_t* counts, size_t n) {
  static_assert(offsetof(ZeroStepStats, count) + sizeof(float) == sizeof(ZeroStepStats), "count precedes the counts");
  // One upload: the total, then each slot's count (exact in fp32 below 2^24).
  std::vector<float> v(n + 1);
  double total = 0.0;
  for (size_t a = 0; a < n; ++a) {
    v[a + 1] = static_cast<float>(counts[a]);
    total += static_cast<double>(counts[a]);
  }
  v[0] = static_cast<float>(total);
  dev_.copy_h2d(at(offsetof(ZeroStepStats, count)), v.data(), v.size() * sizeof(float));
  targets_set_ = true;
}

// The agreed sum of squares and the losses the model left in the loss slots.
ZeroStepStats ZeroStepBuffer::read_back(std::vector<float>& losses) {
  const size_t at_losses = sizeof(ZeroStepStats) + cap_ * sizeof(float);
  std::vector<char> host(at_losses + n_ * sizeof(float));
  dev_.copy_d2h(host.data(), buf_.get(), host.size());
  ZeroStepStats st;
  std::memcpy(&st, host.data(), sizeof st);
  losses.resize(n_);
  if (n_) std::memcpy(losses.data(), host.data() + at_losses, n_ * sizeof(float));
  targets_set_ = false;
  return st;
}

}  // namespace dtrain::train
