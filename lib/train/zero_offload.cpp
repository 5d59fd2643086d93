// ZeroEngine's ZeRO-Offload (Ren et al., 2021; DeepSpeed's offload_optimizer and
// offload_param): for a model on a GPU, the fp32 masters, AdamW's moments and the reduced
// gradient shard of every trainable buffer live in host memory and AdamW runs on the host
// (the CPU device's threads); the updated shard goes back to the device in the compute
// dtype. At stages 2-3 each bucket's reduced shard is copied to the host on the
// communication stream as soon as its reduce-scatter is done, and a host worker thread
// waits for it, accumulates it and -- when nothing about the update waits for the whole
// gradient (no clipping, no fp16 loss scaling) -- updates that bucket at once, while the
// device computes the backward of the buckets after it. With offload_param the sharded
// buffers' compute-dtype shards stay on the host and each gather copies its shard in.
#include "train/zero_offload.h"

#include "train/zero_comm.h"
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/dtype.h"
#include "ops/optim.h"
#include "ops/parallel.h"
#include "ops/step_scale.h"
#include "train/zero_queue.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace dtrain::train {

namespace {
// fp32 -> t (RNE for 16-bit, as the device's cast and AdamW's copy) into host memory,
// across the CPU's pool (a model's shard is up to billions of elements).
void off_store(void* dst, DType t, const float* src, size_t n) {
  ops::parallel_for(n, n, [&](size_t b, size_t e) {
    if (t == DType::F32) std::memcpy(static_cast<float*>(dst) + b, src + b, (e - b) * sizeof(float));
    else
      for (size_t i = b; i < e; ++i) dtype_store(dst, i, t, src[i]);
  });
}
void off_load(float* dst, const void* src, DType t, size_t n) {
  if (t == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = dtype_load(src, i, t);
}
}  // namespace

ZeroOffload::ZeroOffload(device::Device& dev, const ZeroOptions& opts, ZeroCollectives& coll,
                         std::vector<ZeroSlot>& slots, std::vector<ZeroBucket>& buckets)
    : dev_(dev), opts_(opts), coll_(coll), slots_(slots), buckets_(buckets) {}

ZeroOffload::~ZeroOffload() = default;

void ZeroOffload::configure(bool model_on_host, DType model_dtype) {
  mdt_ = model_dtype;
  // On a CPU model the state is in host memory already: offload changes nothing there.
  on_ = opts_.offload_optimizer && !model_on_host;
  on_param_ = on_ && opts_.offload_param;
  // The update can start bucket by bucket during the backward only when nothing about it
  // waits for the whole gradient: no clipping (global norm) and no fp16 loss scaling (the
  // overflow skip). Stage 1 reduces its gradients after the backward anyway.
  eager_ = on_ && opts_.stage >= 2 && opts_.gradient_clipping == 0.0f && opts_.compute_dtype != DType::F16;
  if (on_) host_q_ = std::make_unique<ZeroCommQueue>(true);
}

void ZeroOffload::stop() { host_q_.reset(); }

void ZeroOffload::step_begin() {
  if (!on_) return;
  host_q_->wait_all();
  eager_applied_ = false;
  eager_poisoned_ = false;
  step_t0_ = std::chrono::steady_clock::now();
  // Each bucket's first landing (stages 2-3) or stage 1's copy overwrites the host gradient.
  for (auto& b : buckets_) b.landed = false;
  std::lock_guard<std::mutex> lk(trace_mu_);
  trace_.clear();
}

// ----------------------------------------------------------------------------
float* ZeroOffload::master_f32(ZeroSlot& s) {
  DT_CHECK(s.sdt == DType::F32);
  if (s.own_master) return s.master.as<float>();
  DT_CHECK(mdt_ == DType::F32);
  return zero_fat(s.pb->data, s.lo);
}

void ZeroOffload::host_from_device(float* dst, const void* src, DType t, size_t n) {
  if (!n) return;
  if (t == DType::F32) {
    dev_.copy_d2h(dst, src, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> raw(n);
  dev_.copy_d2h(raw.data(), src, n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) dst[i] = dtype_load(raw.data(), i, t);
}

// Through the device's own copy: the source may be a plan's host stand-in (fake storage).
void ZeroOffload::device_from_host(void* dst, DType t, const float* src, size_t n) {
  dev_.copy_h2d_cast(dst, t, src, n);
}

// ----------------------------------------------------------------------------
// Host storage for an offloaded slot and its starting values: fp32 (a host copy of the
// whole buffer) when the caller has it, else the model's own (device) values.
void ZeroOffload::slot_init(ZeroSlot& s, const float* fp32) {
  device::Device& d = dev_;
  const size_t k = s.owned();
  std::vector<float> start(k);
  if (fp32 != nullptr) std::copy(fp32 + s.lo, fp32 + s.hi, start.begin());
  else if (k) host_from_device(start.data(), zero_at(s.pb->data, s.lo, mdt_), mdt_, k);
  if (s.off) {
    const bool pin = opts_.offload_pin_memory;
    s.hmaster = device::HostBuffer(d, k * sizeof(float), pin);
    s.hm = device::HostBuffer(d, k * sizeof(float), pin);
    s.hv = device::HostBuffer(d, k * sizeof(float), pin);
    s.hgrad = device::HostBuffer(d, k * sizeof(float), pin);
    if (opts_.stage >= 2) s.hland = device::HostBuffer(d, k * sizeof(float), pin);
    if (mdt_ != DType::F32) s.hcopy = device::HostBuffer(d, k * dtype_size(mdt_), pin);
    if (k) std::memcpy(s.hmaster.get(), start.data(), k * sizeof(float));
  } else {  // a frozen sharded buffer under offload_param: its value, in its shard dtype
    s.hcopy = device::HostBuffer(d, k * dtype_size(s.sdt), opts_.offload_param_pin_memory);
  }
  if (s.hcopy.get()) off_store(s.hcopy.get(), s.host_shard_dtype(mdt_), start.data(), k);
  if (s.sharded && !s.off_param) {
    s.dshard = device::DeviceBuffer(d, k * dtype_size(mdt_));
    device_from_host(s.dshard.get(), mdt_, start.data(), k);
  }
}

void ZeroOffload::shard_to_device(void* dst, DType t, ZeroSlot& s) {
  const size_t k = s.owned();
  if (!k) return;
  if (!s.off && !s.off_param) {
    if (s.own_master) dev_.cast(dst, t, s.master.get(), s.sdt, k);
    else dev_.cast(dst, t, zero_at(s.pb->data, s.lo, mdt_), mdt_, k);
    return;
  }
  // The device's own compute copy where it has one, else the host's.
  if (t == mdt_ && s.dshard.get()) return dev_.copy_d2d(dst, s.dshard.get(), k * dtype_size(t));
  if (t == mdt_ && !s.sharded) return dev_.copy_d2d(dst, zero_at(s.pb->data, s.lo, mdt_), k * dtype_size(t));
  const DType hd = s.host_shard_dtype(mdt_);
  if (t == hd) return dev_.copy_h2d(dst, s.host_shard(), k * dtype_size(t));
  if (t == DType::F32 && s.hmaster.get()) return dev_.copy_h2d(dst, s.hmaster.get(), k * sizeof(float));
  std::vector<float> f(k);
  shard_to_host(f.data(), s);
  device_from_host(dst, t, f.data(), k);
}

void ZeroOffload::shard_to_host(float* dst, ZeroSlot& s) {
  const size_t k = s.owned();
  if (!k) return;
  if (s.off) std::memcpy(dst, s.hmaster.get(), k * sizeof(float));
  else if (s.off_param) off_load(dst, s.hcopy.get(), s.sdt, k);
  else if (s.own_master) host_from_device(dst, s.master.get(), s.sdt, k);
  else host_from_device(dst, zero_at(s.pb->data, s.lo, mdt_), mdt_, k);
}

// After a checkpoint load wrote the host master (or a resident buffer's full values): the
// compute-dtype copies derived from it (the host's 16-bit copy, the device shard).
void ZeroOffload::shard_from_host(ZeroSlot& s, const float* src) {
  const size_t k = s.owned();
  if (!k) return;
  if (s.off && src != s.hmaster.as<float>()) std::memcpy(s.hmaster.get(), src, k * sizeof(float));
  if (s.hcopy.get()) off_store(s.hcopy.get(), s.host_shard_dtype(mdt_), src, k);
  if (s.dshard.get()) device_from_host(s.dshard.get(), mdt_, src, k);
}

double ZeroOffload::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0_).count();
}

void ZeroOffload::trace_add(const char* what, int index, double t0, double t1) {
  std::lock_guard<std::mutex> lk(trace_mu_);
  trace_.push_back(OffloadTraceEntry{what, index, t0, t1});
}

std::vector<OffloadTraceEntry> ZeroOffload::trace() const {
  std::lock_guard<std::mutex> lk(trace_mu_);
  return trace_;
}

// Stages 2-3, in the bucket's communication task after its reduce-scatter: this rank's
// reduced segment (device memory at `mine`) goes to the slots' landing buffers on the
// current stream, and the host worker takes it from there once it has arrived.
// The step's first micro-batch lands straight in the host gradient (no zeroing, no add: one
// pass over host memory less per step); later ones land beside it and are added.
void ZeroOffload::land(size_t index, const float* mine, bool update, float lr, int64_t step) {
  ZeroBucket& b = buckets_[index];
  if (b.host_ticket) host_q_->wait(b.host_ticket);  // the worker is done with the last landing
  const bool add = b.landed;
  b.landed = true;
  for (size_t k = 0; k < b.slots.size(); ++k) {
    ZeroSlot& s = slots_[b.slots[k]];
    void* dst = add ? s.hland.get() : s.hgrad.get();
    if (s.owned()) dev_.copy_d2h_async(dst, mine + b.offs[k], s.owned() * sizeof(float));
  }
  dev_.event_record(*b.landed_ev, coll_.stream_ordered() ? coll_.stream() : nullptr);
  b.host_ticket = host_q_->submit([this, index, update, add, lr, step] {
    ZeroBucket& bk = buckets_[index];
    dev_.event_synchronize(*bk.landed_ev);
    const double t = now();
    trace_add("landed", static_cast<int>(index), t, t);
    if (add)
      for (size_t i : bk.slots) {
        ZeroSlot& s = slots_[i];
        if (s.owned()) device::cpu().add(s.hgrad.as<float>(), s.hland.as<float>(), s.owned());
      }
    if (update) bucket_update(index, lr, step);
  });
}

std::vector<ops::AdamWTensor> ZeroOffload::tensors(const std::vector<size_t>& list) {
  std::vector<ops::AdamWTensor> out;
  for (size_t i : list) {
    ZeroSlot& s = slots_[i];
    if (!s.off || !s.owned()) continue;
    for (const auto& t : s.pb->layout.tensors) {
      const size_t a = std::max(t.offset, s.lo), e = std::min(t.offset + t.numel(), s.hi);
      if (a >= e) continue;
      const size_t o = a - s.lo;
      ops::AdamWTensor x;
      x.param = s.hmaster.as<float>() + o;
      x.grad = s.hgrad.as<float>() + o;
      x.m = s.hm.as<float>() + o;
      x.v = s.hv.as<float>() + o;
      x.copy = s.hcopy.get() ? zero_at(s.hcopy.get(), o, mdt_) : nullptr;
      x.n = e - a;
      x.decay = t.decay;
      out.push_back(x);
    }
  }
  return out;
}

// The host worker, during the backward of the last micro-batch: bucket `index`'s update,
// unless a gradient so far was inf/NaN (then this rank updates nothing more, and the
// step, agreed over the ranks in step_issue, stops the run: part of it is applied).
void ZeroOffload::bucket_update(size_t index, float lr, int64_t step) {
  if (eager_poisoned_) return;
  const ZeroBucket& b = buckets_[index];
  double sq = 0.0;
  for (size_t i : b.slots) {
    const ZeroSlot& s = slots_[i];
    if (s.owned()) sq += ops::grad_norm_sq(s.hgrad.as<float>(), s.owned());
  }
  if (!ops::step_finite(sq)) {
    eager_poisoned_ = true;
    return;
  }
  const std::vector<ops::AdamWTensor> update = tensors(b.slots);
  const float scale[5] = {1.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // no loss scaling, no clipping
  const double t0 = now();
  device::cpu().adamw_multi(update.data(), update.size(), opts_.adamw, lr, step, scale, mdt_);
  trace_add("adamw", static_cast<int>(index), t0, now());
  eager_applied_ = true;
}

// The updated shards back to the device, asynchronously on the compute stream (the host
// copy is next written by the next step's update, after the forward that reads them):
// into the model's buffer where it is resident, into the device shard at stage 3, and
// nowhere under offload_param (the gathers copy from the host).
void ZeroOffload::copy_back(const std::vector<size_t>& list) {
  for (size_t i : list) {
    ZeroSlot& s = slots_[i];
    if (!s.off || !s.owned() || s.off_param) continue;
    void* dst = s.sharded ? s.dshard.get() : zero_at(s.pb->data, s.lo, mdt_);
    dev_.copy_h2d_async(dst, s.host_shard(), s.owned() * dtype_size(mdt_));
  }
}

// step_issue's start, once the gradients are reduced.
void ZeroOffload::grads_collect() {
  // Every gradient shard on the host: stage 1's from the model's reduced gradient,
  // stages 2-3's landed bucket by bucket during the backward (the worker added them).
  if (opts_.stage == 1) {
    for (auto& s : slots_)
      if (s.off && s.owned()) dev_.copy_d2h_async(s.hgrad.get(), s.pb->grad + s.lo, s.owned() * sizeof(float));
    dev_.synchronize();
  }
  host_q_->wait_all();
  // A bucket no backward reached this step has no gradient: zero, not the last step's.
  if (opts_.stage >= 2)
    for (auto& b : buckets_)
      if (!b.landed)
        for (size_t i : b.slots) device::cpu().zero(slots_[i].hgrad.get(), slots_[i].hgrad.bytes());
}

// step_issue's offloaded part, after the gradients are reduced and the device holds the
// agreed clip scale and skip flag in `scale` (device memory): the host update (or, when
// the worker already applied it bucket by bucket, its check) and the copies back.
void ZeroOffload::step_issue(float loss_scale, const float* scale_dev, float lr, int64_t step) {
  float hs[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  dev_.copy_d2h(hs, scale_dev, 2 * sizeof(float));  // waits for the device: the decision
  if (eager_) {
    DT_ENFORCE(loss_scale == 1.0f, UsageError,
               "ZeroEngine: the offloaded update ran during the backward without loss scaling, but step_issue got "
               "loss_scale {}",
               loss_scale);
    if (hs[1] != 0.0f)
      DT_THROW(TrainError,
               "step {}: a gradient is inf/NaN, but with zero_optimization.offload_optimizer, gradient_clipping 0 "
               "and no fp16 loss scaling the host AdamW updates each bucket during the backward, so the step cannot "
               "be skipped; resume from the last checkpoint with gradient_clipping set (the update then waits for "
               "the whole gradient) or a lower learning rate",
               step);
    DT_ENFORCE(eager_applied_, UsageError,
               "ZeroEngine: the offloaded update did not run during the backward; mark the step's last micro-batch "
               "with set_last_micro_batch(true) before its backward");
  } else {
    // Bucket by bucket, each bucket's copy back overlapping the next one's update.
    const double t0 = now();
    for (const auto& b : buckets_) {
      const std::vector<ops::AdamWTensor> update = tensors(b.slots);
      device::cpu().adamw_multi(update.data(), update.size(), opts_.adamw, lr, step, hs, mdt_);
      if (hs[1] == 0.0f) copy_back(b.slots);
    }
    trace_add("adamw", -1, t0, now());
    return;
  }
  for (const auto& b : buckets_) copy_back(b.slots);
}

}  // namespace dtrain::train
