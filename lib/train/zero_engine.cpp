// ZeroEngine: slots (one per model buffer, zero_slot.h) with their shard ranges, masters
// and AdamW state; bucket plans; stream order and collectives; the step (reduce, norm,
// AdamW, gather); materialized parameters, checkpoint views and memory accounting. The
// per-layer stage-2/3 hooks are in zero_hooks.cpp, top-k and PowerSGD compression in
// zero_topk.cpp and zero_powersgd.cpp.
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/log.h"
#include "core/dtype.h"
#include "ops/step_scale.h"
#include "train/zero_queue.h"
#include "train/zero_slot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <cstddef>
#include <cstring>
#include <limits>

namespace dtrain::train {

// ----------------------------------------------------------------------------
ZeroEngine::ZeroEngine(model::Model& model, comm::Communicator* comm, const ZeroOptions& opts,
                       const model::Model* fp32_source, const model::BufferFill& deferred)
    : model_(model), dev_(&model.device()), comm_(comm), opts_(opts), deferred_(static_cast<bool>(deferred)) {
  DT_ENFORCE(config::zero_stage_valid(opts_.stage), ConfigError, "zero_optimization.stage {} is not 0, 1, 2 or 3",
             opts_.stage);
  DT_ENFORCE(opts_.reduce_bucket_size > 0 && opts_.allgather_bucket_size > 0, ConfigError,
             "zero_optimization.reduce_bucket_size and allgather_bucket_size must be > 0");
  mdt_ = model_.dtype();
  mixed_ = opts_.compute_dtype != DType::F32;
  DT_ENFORCE(mdt_ == DType::F32 || mdt_ == opts_.compute_dtype, ConfigError,
             "the model computes in {} but the engine's compute dtype is {}; build the model in the compute dtype",
             dtype_name(mdt_), dtype_name(opts_.compute_dtype));
  if (comm_ != nullptr && (comm_->size() > 1 || opts_.single_rank_comm)) {
    rank_ = comm_->rank();
    world_ = comm_->size();
    DT_ENFORCE(comm_->on_device() == !model_.on_host(), UsageError,
               "the model is on {} but the {} communicator's buffers live {}: use NCCL with a CUDA model and Gloo "
               "with a CPU model",
               dev_->name(), comm::backend_name(comm_->backend()), comm_->on_device() ? "on a GPU" : "in host memory");
    comm_stream_ = comm_->collective_stream();
    stream_ordered_ = comm_stream_ != nullptr;
  } else {
    comm_ = nullptr;
  }
  if (stream_ordered_) {
    ev_compute_ = dev_->event_create();
    ev_comm_ = dev_->event_create();
  }
  if (fp32_source != nullptr) {
    DT_ENFORCE(fp32_source->on_host() && fp32_source->dtype() == DType::F32, UsageError,
               "ZeroEngine: the fp32 source must be a host fp32 model");
    DT_ENFORCE(fp32_source->params().size() == model_.params().size() &&
                   fp32_source->lora_params().size() == model_.lora_params().size(),
               UsageError, "ZeroEngine: the fp32 source has other buffers than the model (LoRA on one only?)");
  }
  DT_ENFORCE(mdt_ == DType::F32 || fp32_source != nullptr || deferred_, UsageError,
             "ZeroEngine: a {} model needs the fp32 weights its masters start from (fp32_source)", dtype_name(mdt_));
  DT_ENFORCE(!opts_.offload_optimizer || opts_.stage >= 1, ConfigError,
             "zero_optimization.offload_optimizer needs stage 1, 2 or 3 (the stage is {})", opts_.stage);
  DT_ENFORCE(!opts_.offload_param || (opts_.stage == 3 && opts_.offload_optimizer), ConfigError,
             "zero_optimization.offload_param needs stage 3 and offload_optimizer (the stage is {})", opts_.stage);
  // On a CPU model the state is in host memory already: offload changes nothing there.
  off_ = opts_.offload_optimizer && !model_.on_host();
  off_param_ = off_ && opts_.offload_param;
  // The update can start bucket by bucket during the backward only when nothing about it
  // waits for the whole gradient: no clipping (global norm) and no fp16 loss scaling (the
  // overflow skip). Stage 1 reduces its gradients after the backward anyway.
  eager_ = off_ && opts_.stage >= 2 && opts_.gradient_clipping == 0.0f && opts_.compute_dtype != DType::F16;
  if (off_) host_q_ = std::make_unique<ZeroCommQueue>(true);
  const auto& mc = model_.config();
  tied_ = mc.tie_embeddings;
  n_layer_ = mc.n_layer;
  layer_slots_.resize(static_cast<size_t>(n_layer_) + 2);
  const bool lora = model_.lora_on();
  if (deferred_) {
    DT_ENFORCE(fp32_source == nullptr, UsageError, "ZeroEngine: a deferred model takes its values from the fill alone");
    for (size_t i = 0; i < model_.params().size(); ++i)
      DT_ENFORCE(model_.param_released(i), UsageError,
                 "ZeroEngine: a deferred fill needs a model built with deferred storage (base buffer {} is allocated)",
                 i);
  } else {
    DT_ENFORCE(!model_.storage_released(), UsageError,
               "ZeroEngine needs a model that owns all its storage; another engine released part of it (destroy "
               "that engine first)");
  }
  std::vector<model::ParamBuffer*> all;
  for (auto& pb : model_.params()) all.push_back(&pb);
  for (auto& pb : model_.lora_params()) all.push_back(&pb);
  std::vector<const model::ParamBuffer*> src;
  if (fp32_source != nullptr) {
    for (const auto& pb : fp32_source->params()) src.push_back(&pb);
    for (const auto& pb : fp32_source->lora_params()) src.push_back(&pb);
  }
  slots_.resize(all.size());
  std::vector<float> staged;  // a deferred base buffer's fp32 values: one buffer at a time
  for (size_t i = 0; i < all.size(); ++i) {
    Slot& s = slots_[i];
    const bool fill = deferred_ && i < model_.params().size();
    s.pb = all[i];
    s.layer = s.pb->layout.layer;
    DT_CHECK(s.layer >= -1 && s.layer <= n_layer_);
    s.trainable = lora ? i >= model_.params().size() : true;
    s.n = s.pb->size;
    if (!src.empty())
      DT_ENFORCE_EQ(src[i]->size, s.n, UsageError, "ZeroEngine: fp32 source buffer {} size", s.pb->layout.name);
    if (opts_.stage == 0) {
      s.s = s.n;
      s.lo = 0;
      s.hi = s.n;
    } else {
      s.s = shard_of(s.n);
      s.lo = std::min(static_cast<size_t>(rank_) * s.s, s.n);
      s.hi = std::min(s.lo + s.s, s.n);
    }
    s.sharded = opts_.stage == 3 && s.n >= opts_.param_persistence_threshold;
    const float* fp32 = !src.empty() ? src[i]->host_f32() : nullptr;
    if (fill) {
      staged.resize(s.n);
      deferred(i, staged.data());
      fp32 = staged.data();
      // A resident buffer gets its storage (and values) back; a sharded one never has any.
      if (!s.sharded) {
        model_.storage_restore(false, {i});
        model_.buffer_from_host(i, staged.data());
      }
    }
    // A frozen buffer of a 16-bit model keeps no fp32 master: its compute copy is its value.
    s.own_master = s.sharded || (mixed_ && (s.trainable || mdt_ == DType::F32));
    s.sdt = (!s.trainable && mdt_ != DType::F32) ? mdt_ : DType::F32;
    s.off = off_ && s.trainable;
    s.off_param = off_param_ && s.sharded;
    if (s.off || s.off_param) {
      s.own_master = true;  // on the host
      offload_slot_init(s, fp32);
    } else if (s.own_master) {
      s.master = device::DeviceBuffer(*dev_, s.owned() * dtype_size(s.sdt));
      if (s.owned()) {
        if (fp32 != nullptr) device_from_host(s.master.get(), s.sdt, fp32 + s.lo, s.owned());
        else dev_->cast(s.master.get(), s.sdt, zero_at(s.pb->data, s.lo, mdt_), mdt_, s.owned());
      }
    }
    if (s.trainable && !s.off) {
      s.m = device::DeviceBuffer(*dev_, s.owned() * sizeof(float));
      s.v = device::DeviceBuffer(*dev_, s.owned() * sizeof(float));
      if (opts_.stage >= 2) s.gshard = device::DeviceBuffer(*dev_, s.owned() * sizeof(float));
    }
    if (s.sharded) {
      sharded_.push_back(i);
      if (stream_ordered_) s.ready = dev_->event_create();
    } else if (mixed_ && mdt_ == DType::F32) {
      dev_->round_to(static_cast<float*>(s.pb->data), s.n, opts_.compute_dtype);
    }
    layer_slots_[static_cast<size_t>(s.layer + 1)].push_back(i);
  }
  stats_ = device::DeviceBuffer(*dev_, sizeof(StepStats));
  plan_buckets();
  if (off_ && opts_.stage >= 2)
    for (auto& b : buckets_) b.landed_ev = dev_->event_create();
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
    if (comm_ != nullptr) {
      size_t most = 0;
      for (const auto& b : buckets_) {
        const size_t n = bucket_full(b);
        DT_ENFORCE(n < (size_t{1} << 31), ConfigError,
                   "communication.compression topk: a gradient bucket of {} elements does not fit int32 indices; "
                   "lower zero_optimization.reduce_bucket_size",
                   n);
        residual_.emplace_back(*dev_, n * sizeof(float));
        dev_->zero(residual_.back().get(), n * sizeof(float));
        most = std::max(most, n);
      }
      const size_t k = topk_k(most), W = static_cast<size_t>(world_);
      topk_dense_ = device::DeviceBuffer(*dev_, most * sizeof(float));
      topk_mine_ = device::DeviceBuffer(*dev_, 2 * k * sizeof(float));
      topk_all_ = device::DeviceBuffer(*dev_, W * 2 * k * sizeof(float));
      work_add(static_cast<ptrdiff_t>(topk_dense_.bytes() + topk_mine_.bytes() + topk_all_.bytes()));
    }
  }
  if (opts_.powersgd_rank != 0) {
    DT_ENFORCE(opts_.powersgd_rank > 0, ConfigError, "communication.powersgd.rank {} must be at least 1",
               opts_.powersgd_rank);
    sparse_method_check("powersgd");
    DT_ENFORCE(opts_.grad_wire == DType::F32 && opts_.topk_ratio == 0.0, ConfigError,
               "communication.compression: powersgd, topk and a 16-bit wire are exclusive");
    if (comm_ != nullptr) powersgd_plan();
  }
  if (comm_ != nullptr && opts_.grad_wire != DType::F32) {
    size_t most = 0;
    for (const auto& b : buckets_) most = std::max(most, (opts_.stage == 0 ? 1 : static_cast<size_t>(world_)) * b.seg);
    wire_ = device::DeviceBuffer(*dev_, most * dtype_size(opts_.grad_wire));
    work_add(static_cast<ptrdiff_t>(wire_.bytes()));
  }
  // Stream-ordered collectives overlap by themselves; a thread is for blocking ones.
  queue_ = std::make_unique<ZeroCommQueue>(opts_.overlap_comm && comm_ != nullptr && !stream_ordered_);
  hooks_install();
  // Last, so a constructor that throws leaves the model whole. Slot i is the model's
  // buffer i (base buffers, then adapters). From here on the gradient shards (stages
  // 2-3) and master shards (stage 3) are the only copies: the model frees its full
  // arrays, and the hooks lend it working buffers while a layer runs.
  if (opts_.stage >= 2) model_.storage_release(true, sharded_);
  // A deferred model has no gradient arrays; below stage 2 the engine uses the model's.
  else if (deferred_) model_.storage_restore(true, {});
  staged = {};
}

ZeroEngine::~ZeroEngine() {
  model_.set_hooks({});
  queue_.reset();   // joins the communication thread
  host_q_.reset();  // and the offload worker
  try {
    comm_join();
    for (auto& s : slots_)
      if (s.ready && s.gathered) dev_->stream_wait(nullptr, *s.ready);
    // The model gets whole storage back (no pointer into the working buffers freed with
    // the slots). Materialized, it already holds the full weights; otherwise a
    // collective here could hang (other ranks may be unwinding), so a sharded buffer
    // keeps only this rank's shard of the masters, zeros elsewhere.
    if (deferred_) {
      // Never the full model: the sharded buffers are released (their pointers nulled,
      // none left into the working buffers freed with the slots).
      model_.storage_release(true, sharded_);
      dev_->synchronize();
      return;
    }
    const bool partial = !materialized_;
    model_.storage_restore();
    if (partial)
      for (size_t i : sharded_) {
        Slot& s = slots_[i];
        if (s.owned()) shard_to_device(zero_at(s.pb->data, s.lo, mdt_), mdt_, s);
      }
    dev_->synchronize();
  } catch (const std::exception& e) {
    log_warn("zero engine teardown: {}", e.what());
  }
}

// Gradient buckets in backward order (layers n_layer .. -1): consecutive trainable
// buffers grouped while their full sizes stay within reduce_bucket_size.
void ZeroEngine::plan_buckets() {
  buckets_.clear();
  for (int l = n_layer_; l >= -1; --l) {
    for (size_t i : layer_slots_[static_cast<size_t>(l + 1)]) {
      Slot& s = slots_[i];
      if (!s.trainable) continue;
      size_t full = 0;
      if (!buckets_.empty())
        for (size_t j : buckets_.back().slots) full += slots_[j].n;
      if (buckets_.empty() || full + s.n > opts_.reduce_bucket_size) buckets_.emplace_back();
      Bucket& b = buckets_.back();
      s.bucket = buckets_.size() - 1;
      s.bucket_off = b.seg;
      b.slots.push_back(i);
      b.offs.push_back(b.seg);
      b.seg += opts_.stage == 0 ? s.n : s.s;
      b.done_layer = l;
    }
  }
}

void ZeroEngine::work_add(ptrdiff_t bytes) {
  std::lock_guard<std::mutex> lk(work_mu_);
  work_bytes_ = static_cast<size_t>(static_cast<ptrdiff_t>(work_bytes_) + bytes);
  work_peak_ = std::max(work_peak_, work_bytes_);
}

float* ZeroEngine::master_f32(Slot& s) {
  DT_CHECK(s.sdt == DType::F32);
  if (s.own_master) return s.master.as<float>();
  DT_CHECK(mdt_ == DType::F32);
  return zero_fat(s.pb->data, s.lo);
}

void ZeroEngine::host_from_device(float* dst, const void* src, DType t, size_t n) {
  if (!n) return;
  if (t == DType::F32) {
    dev_->copy_d2h(dst, src, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> raw(n);
  dev_->copy_d2h(raw.data(), src, n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) dst[i] = dtype_load(raw.data(), i, t);
}

void ZeroEngine::device_from_host(void* dst, DType t, const float* src, size_t n) {
  if (!n) return;
  if (t == DType::F32) {
    dev_->copy_h2d(dst, src, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> raw(n);
  for (size_t i = 0; i < n; ++i) dtype_store(raw.data(), i, t, src[i]);
  dev_->copy_h2d(dst, raw.data(), n * sizeof(uint16_t));
}

// ----------------------------------------------------------------------------
// Stream order. With NCCL the collectives and the ops that consume their results run on
// the communicator's stream, after the compute work issued before them (an event); the
// compute stream waits for that stream only where it reads what they wrote (comm_join,
// or a stage-3 layer's own event), so backward keeps running while buckets reduce.
void ZeroEngine::on_comm(const std::function<void()>& f) {
  if (!stream_ordered_) {
    f();
    return;
  }
  dev_->event_record(*ev_compute_, nullptr);
  dev_->stream_wait(comm_stream_, *ev_compute_);
  comm_unjoined_ = true;
  void* prev = dev_->use_stream(comm_stream_);
  try {
    f();
  } catch (...) {
    dev_->use_stream(prev);
    throw;
  }
  dev_->use_stream(prev);
}

uint64_t ZeroEngine::comm_submit(std::function<void()> f) {
  return queue_->submit([this, f = std::move(f)] { on_comm(f); });
}

// Only after work was issued there since the last join: a step recorded in a CUDA graph
// may not wait on the communicator's stream before its own work brought that stream into
// the recording (CUDA refuses a dependency on work outside the capture).
void ZeroEngine::comm_join() {
  if (!stream_ordered_ || !comm_unjoined_) return;
  comm_unjoined_ = false;
  dev_->event_record(*ev_comm_, comm_stream_);
  dev_->stream_wait(nullptr, *ev_comm_);
}

// Collectives: called from queued tasks only, so one thread drives the communicator.
void ZeroEngine::coll_allreduce(void* buf, size_t n, DType t, comm::ReduceOp op) {
  if (comm_ != nullptr && n > 0) comm_->allreduce(buf, buf, n, t, op);
}

void ZeroEngine::coll_reduce_scatter(void* buf, size_t shard, DType t) {
  if (comm_ == nullptr || shard == 0) return;
  char* b = static_cast<char*>(buf);
  comm_->reduce_scatter(b, b + static_cast<size_t>(rank_) * shard * dtype_size(t), shard, t, comm::ReduceOp::AVG);
}

void ZeroEngine::coll_all_gather(void* buf, size_t shard, DType t) {
  if (comm_ == nullptr || shard == 0) return;
  char* b = static_cast<char*>(buf);
  comm_->all_gather(b + static_cast<size_t>(rank_) * shard * dtype_size(t), b, shard, t);
}

// The 16-bit wire divides by the world size before it rounds (PyTorch's fp16_compress_hook
// divides too: an fp16 sum of W gradients can overflow where their mean does not), sums
// in 16 bits (Gloo adds pairs in fp32 and rounds each partial sum; NCCL likewise) and
// widens this rank's result back into the fp32 gradient.
void ZeroEngine::grad_reduce(float* buf, size_t n, bool scatter) {
  if (comm_ == nullptr || n == 0) return;
  const size_t W = static_cast<size_t>(world_), seg = scatter ? n / W : n;
  const DType w = opts_.grad_wire;
  if (w == DType::F32) {
    if (scatter) coll_reduce_scatter(buf, seg, DType::F32);
    else coll_allreduce(buf, n, DType::F32, comm::ReduceOp::AVG);
    return;
  }
  DT_CHECK(wire_.bytes() >= n * dtype_size(w));
  dev_->scale(buf, n, 1.0f / static_cast<float>(world_));
  dev_->cast(wire_.get(), w, buf, DType::F32, n);
  const size_t mine = scatter ? static_cast<size_t>(rank_) * seg : 0;
  if (scatter) comm_->reduce_scatter(wire_.get(), zero_at(wire_.get(), mine, w), seg, w, comm::ReduceOp::SUM);
  else comm_->allreduce(wire_.get(), wire_.get(), n, w, comm::ReduceOp::SUM);
  dev_->cast(buf + mine, DType::F32, zero_at(wire_.get(), mine, w), w, seg);
}

// ----------------------------------------------------------------------------
void ZeroEngine::before_step() {
  queue_->wait_all();
  comm_join();
  grads_reduced_ = false;
  if (off_) {
    host_q_->wait_all();
    eager_applied_ = false;
    eager_poisoned_ = false;
    step_t0_ = std::chrono::steady_clock::now();
    // Each bucket's first landing (stages 2-3) or stage 1's copy overwrites the host gradient.
    for (auto& b : buckets_) b.landed = false;
    std::lock_guard<std::mutex> lk(trace_mu_);
    trace_.clear();
  }
  for (auto& s : slots_) {
    if (!s.trainable) continue;
    if (opts_.stage >= 2) {
      if (!s.off) dev_->zero(s.gshard.get(), s.gshard.bytes());
    } else if (s.pb->grad) dev_->zero(s.pb->grad, s.n * sizeof(float));
  }
}

// Stage 0: allreduce (AVG) per bucket; stage 1: reduce-scatter (AVG) per bucket into
// the owned range of the model's full gradient buffer. A single-slot stage-0 bucket is
// reduced in place; otherwise the bucket is packed into `buf` (stage 0: the slots one
// after the other; stage 1: rank-major, W segments) and unpacked after the collective.
// Packing, collective and unpacking run together on the communication side.
bool ZeroEngine::bucket_inplace(const Bucket& b) const { return opts_.stage == 0 && b.slots.size() == 1; }

size_t ZeroEngine::bucket_len(const Bucket& b) const {
  if (!residual_.empty()) return 0;  // top-k works in its own buffers
  return bucket_inplace(b) ? 0 : (opts_.stage == 0 ? 1 : static_cast<size_t>(world_)) * b.seg;
}

void ZeroEngine::bucket_pack(const Bucket& b, float* buf) {
  const size_t W = static_cast<size_t>(world_);
  if (opts_.stage == 0) {
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const Slot& s = slots_[b.slots[k]];
      dev_->copy_d2d(buf + b.offs[k], s.pb->grad, s.n * sizeof(float));
    }
    return;
  }
  dev_->zero(buf, W * b.seg * sizeof(float));
  for (size_t k = 0; k < b.slots.size(); ++k) {
    const Slot& s = slots_[b.slots[k]];
    for (size_t q = 0; q < W; ++q) {
      const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
      if (e > a) dev_->copy_d2d(buf + q * b.seg + b.offs[k], s.pb->grad + a, (e - a) * sizeof(float));
    }
  }
}

// The compute side no longer writes these slots' gradients (the bucket is complete).
void ZeroEngine::bucket_collective(const Bucket& b, float* buf) {
  if (!residual_.empty()) {
    topk_reduce(static_cast<size_t>(&b - buckets_.data()));
    return;
  }
  if (powersgd_active()) {
    powersgd_reduce(static_cast<size_t>(&b - buckets_.data()));
    return;
  }
  if (bucket_inplace(b)) {
    grad_reduce(slots_[b.slots[0]].pb->grad, b.seg, false);
    return;
  }
  bucket_pack(b, buf);
  if (opts_.stage == 0) {
    grad_reduce(buf, b.seg, false);
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const Slot& s = slots_[b.slots[k]];
      dev_->copy_d2d(s.pb->grad, buf + b.offs[k], s.n * sizeof(float));
    }
    return;
  }
  grad_reduce(buf, static_cast<size_t>(world_) * b.seg, true);
  const float* mine = buf + static_cast<size_t>(rank_) * b.seg;
  for (size_t k = 0; k < b.slots.size(); ++k) {
    const Slot& s = slots_[b.slots[k]];
    if (s.owned()) dev_->copy_d2d(s.pb->grad + s.lo, mine + b.offs[k], s.owned() * sizeof(float));
  }
}

void ZeroEngine::bucket_reduce(const Bucket& b, float* scratch) {
  queue_->wait(comm_submit([this, &b, scratch] { bucket_collective(b, scratch); }));
}

// overlap_comm, stages 0/1, last micro-batch: bucket `index` is complete, so its
// collective is issued now (communication thread or stream) with a bucket buffer of its
// own that the task frees; after_layer_backward(-1) waits for all of them.
void ZeroEngine::bucket_reduce_async(size_t index) {
  const Bucket& b = buckets_[index];
  const size_t len = bucket_len(b);
  auto buf = std::make_shared<device::DeviceBuffer>(*dev_, len * sizeof(float));
  if (len) work_add(static_cast<ptrdiff_t>(len * sizeof(float)));
  comm_submit([this, buf, index] {
    bucket_collective(buckets_[index], buf->as<float>());
    const size_t bytes = buf->bytes();
    buf->reset();  // on the communication stream, after the collective
    if (bytes) work_add(-static_cast<ptrdiff_t>(bytes));
  });
}

void ZeroEngine::grads_reduce_step() {
  if (comm_ == nullptr) return;
  size_t most = 0;
  for (const auto& b : buckets_) most = std::max(most, bucket_len(b));
  device::DeviceBuffer scratch(*dev_, most * sizeof(float));
  work_add(static_cast<ptrdiff_t>(most * sizeof(float)));
  for (const auto& b : buckets_) bucket_reduce(b, scratch.as<float>());
  comm_join();  // before the scratch is freed on the compute stream
  scratch.reset();
  work_add(-static_cast<ptrdiff_t>(most * sizeof(float)));
}

void ZeroEngine::step_prepare(float lr) {
  lr_ = lr;
  float v[3];
  ops::adamw_step_values(v, lr, opts_.adamw.weight_decay, opts_.adamw.beta1, opts_.adamw.beta2, step_count_ + 1);
  dev_->copy_h2d(stats_.as<char>() + offsetof(StepStats, scale) + 2 * sizeof(float), v, sizeof v);
}

void ZeroEngine::step_issue(float loss_scale) {
  DT_ENFORCE(!materialized_, UsageError,
             "ZeroEngine::step_issue() after params_materialize(); call params_restore() first");
  DT_ENFORCE_GT(loss_scale, 0.0f, UsageError, "ZeroEngine::step_issue loss_scale");
  queue_->wait_all();
  if (opts_.stage <= 1 && !grads_reduced_) grads_reduce_step();
  comm_join();  // the reduced gradients are complete
  if (off_) {
    // Every gradient shard on the host: stage 1's from the model's reduced gradient,
    // stages 2-3's landed bucket by bucket during the backward (the worker added them).
    if (opts_.stage == 1) {
      for (auto& s : slots_)
        if (s.off && s.owned()) dev_->copy_d2h_async(s.hgrad.get(), s.pb->grad + s.lo, s.owned() * sizeof(float));
      dev_->synchronize();
    }
    host_q_->wait_all();
    // A bucket no backward reached this step has no gradient: zero, not the last step's.
    if (opts_.stage >= 2)
      for (auto& b : buckets_)
        if (!b.landed)
          for (size_t i : b.slots) device::cpu().zero(slots_[i].hgrad.get(), slots_[i].hgrad.bytes());
  }

  auto grad_of = [&](Slot& s) -> float* { return opts_.stage >= 2 ? s.gshard.as<float>() : s.pb->grad + s.lo; };
  // Everything is decided on the device and read back once, after the update is issued:
  // the local sum of squares, its sum over the ranks (on the device communicator), the
  // clip scale and the overflow skip that AdamW reads from device memory.
  char* stats = stats_.as<char>();
  double* sq = reinterpret_cast<double*>(stats + offsetof(StepStats, sq));
  dev_->zero(sq, sizeof(double));
  if (off_) {  // the host's gradient shards: their sum of squares goes up as the start
    double h = 0.0;
    for (auto& s : slots_)
      if (s.off && s.owned()) device::cpu().norm_sq_accumulate(&h, s.hgrad.as<float>(), s.owned());
    dev_->copy_h2d(sq, &h, sizeof h);
  }
  for (auto& s : slots_)
    if (s.trainable && s.owned() && !s.off) dev_->norm_sq_accumulate(sq, grad_of(s), s.owned());
  // The step's loss sum (the loss slots' means times step_targets' counts) rides on the
  // norm's collective as red[3]: no host allreduce for the log.
  float* const red4 = reinterpret_cast<float*>(stats + offsetof(StepStats, red));
  const bool loss = targets_set_ && losses_n_ > 0;
  if (loss)
    dev_->loss_sum(reinterpret_cast<double*>(stats + offsetof(StepStats, loss)), red4 + 3, counts_dev() + losses_cap_,
                   counts_dev(), static_cast<int>(losses_n_));
  float* red = nullptr;
  if (opts_.stage >= 1 && comm_ != nullptr) {
    // Each rank holds a shard: sum the (hi, lo, overflow) triples so every rank takes the
    // same decision.
    red = red4;
    dev_->norm_sq_pack(red, sq);
    const size_t n = loss ? 4 : 3;
    queue_->wait(comm_submit([this, red, n] { coll_allreduce(red, n, DType::F32, comm::ReduceOp::SUM); }));
    comm_join();  // the scale below reads the sum
  } else if (loss && comm_ != nullptr) {
    queue_->wait(comm_submit([this, red4] { coll_allreduce(red4 + 3, 1, DType::F32, comm::ReduceOp::SUM); }));
    comm_join();
  }
  float* scale = reinterpret_cast<float*>(stats + offsetof(StepStats, scale));
  dev_->step_scale(scale, sq, red, loss_scale, opts_.gradient_clipping);

  const int64_t step = step_count_ + 1;  // counted only if the update is applied
  if (off_) offload_step_issue(loss_scale);
  // Every owned tensor in one table: CUDA updates them in a few launches, not one each.
  std::vector<ops::AdamWTensor> update;
  for (auto& s : slots_) {
    if (!s.trainable || !s.owned() || s.off) continue;
    float* p = master_f32(s);
    const float* g = grad_of(s);
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
  if (!update.empty()) dev_->adamw_multi(update.data(), update.size(), opts_.adamw, lr_, step, scale, mdt_);
  if (mdt_ == DType::F32)
    for (const auto& x : update)
      if (x.copy != nullptr) dev_->round_to(static_cast<float*>(x.copy), x.n, opts_.compute_dtype);
  // A skipped step gathers the unchanged masters: the copies the model already holds.
  params_gather_resident();
  release_all_gathered();
  comm_join();  // the next forward reads the gathered copies
}

bool ZeroEngine::step_finish(float loss_scale) {
  // The step's one read-back (the agreed sum of squares and the losses the model left in
  // the loss slots).
  const char* stats = stats_.as<char>();
  const size_t at_losses = sizeof(StepStats) + losses_cap_ * sizeof(float);
  std::vector<char> host(at_losses + losses_n_ * sizeof(float));
  dev_->copy_d2h(host.data(), stats, host.size());
  StepStats st;
  std::memcpy(&st, host.data(), sizeof st);
  losses_.resize(losses_n_);
  if (losses_n_) std::memcpy(losses_.data(), host.data() + at_losses, losses_n_ * sizeof(float));
  // One rank: the double sum as the host summed it; several: the fp32 sum over the ranks.
  step_loss_ = !targets_set_ || losses_n_ == 0 ? 0.0 : (comm_ != nullptr && world_ > 1 ? st.red[3] : st.loss);
  step_count_total_ = targets_set_ ? st.count : 0.0;
  targets_set_ = false;
  last_norm_ = std::sqrt(st.sq) / static_cast<double>(loss_scale);
  if (!std::isfinite(st.sq)) {
    compression_reset();
    return false;
  }
  ++step_count_;
  return true;
}

float* ZeroEngine::loss_slots(size_t n) {
  if (n > losses_cap_) {
    stats_ = device::DeviceBuffer(*dev_, sizeof(StepStats) + 2 * n * sizeof(float));
    losses_cap_ = n;
  }
  losses_n_ = n;
  return counts_dev() + losses_cap_;
}

void ZeroEngine::step_targets(const int64_t* counts, size_t n) {
  DT_ENFORCE_EQ(n, losses_n_, UsageError, "ZeroEngine::step_targets needs one count per loss slot (loss_slots first)");
  static_assert(offsetof(StepStats, count) + sizeof(float) == sizeof(StepStats), "count precedes the counts");
  // One upload: the total, then each slot's count (exact in fp32 below 2^24).
  std::vector<float> v(n + 1);
  double total = 0.0;
  for (size_t a = 0; a < n; ++a) {
    v[a + 1] = static_cast<float>(counts[a]);
    total += static_cast<double>(counts[a]);
  }
  v[0] = static_cast<float>(total);
  dev_->copy_h2d(stats_.as<char>() + offsetof(StepStats, count), v.data(), v.size() * sizeof(float));
  targets_set_ = true;
}

// Every rank, each step, before the backward that reads targets_count(): the sum over the
// ranks on the device communicator, ordered like the norm's reduction.
void ZeroEngine::targets_reduce() {
  if (comm_ == nullptr || world_ <= 1) return;
  float* c = stats_.as<float>() + offsetof(StepStats, count) / sizeof(float);
  queue_->wait(comm_submit([this, c] { coll_allreduce(c, 1, DType::F32, comm::ReduceOp::SUM); }));
  comm_join();  // the backward reads the sum
}

// The model's resident copies of the trainable buffers after an update at stages 1-3:
// the owned shards all-gathered in the compute dtype (stage 0's AdamW wrote them).
void ZeroEngine::params_gather_resident() {
  if (opts_.stage == 0) return;
  std::vector<size_t> list;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].trainable && !slots_[i].sharded) list.push_back(i);
  gather_into_model(list, opts_.compute_dtype);
}

// Bucketed all-gather of the masters of `list` (slots with a master, stages >= 1) into
// the model's full buffers, on the wire as `t`.
void ZeroEngine::gather_into_model(const std::vector<size_t>& list, DType t) {
  const size_t W = static_cast<size_t>(world_), es = dtype_size(t);
  size_t k = 0;
  while (k < list.size()) {
    std::vector<size_t> group;
    std::vector<size_t> offs;
    size_t seg = 0, full = 0;
    while (k < list.size() && (group.empty() || full + slots_[list[k]].n <= opts_.allgather_bucket_size)) {
      group.push_back(list[k]);
      offs.push_back(seg);
      seg += slots_[list[k]].s;
      full += slots_[list[k]].n;
      ++k;
    }
    queue_->wait(comm_submit([&, seg] {
      device::DeviceBuffer buf(*dev_, W * seg * es);
      work_add(static_cast<ptrdiff_t>(buf.bytes()));
      char* b = static_cast<char*>(buf.get());
      char* mine = b + static_cast<size_t>(rank_) * seg * es;
      for (size_t j = 0; j < group.size(); ++j) {
        Slot& s = slots_[group[j]];
        // The owned shard's values: the master, or the model's own range where it is the master.
        shard_to_device(mine + offs[j] * es, t, s);
      }
      coll_all_gather(b, seg, t);
      for (size_t q = 0; q < W; ++q)
        for (size_t j = 0; j < group.size(); ++j) {
          Slot& s = slots_[group[j]];
          const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
          if (e > a) dev_->cast(zero_at(s.pb->data, a, mdt_), mdt_, b + (q * seg + offs[j]) * es, t, e - a);
        }
      work_add(-static_cast<ptrdiff_t>(buf.bytes()));
      buf.reset();
    }));
  }
}

// ----------------------------------------------------------------------------
void ZeroEngine::params_materialize() {
  if (materialized_) return;
  queue_->wait_all();
  release_all_gathered();
  comm_join();
  if (opts_.stage == 0) {
    for (auto& s : slots_)
      if (s.own_master) dev_->cast(s.pb->data, mdt_, s.master.get(), s.sdt, s.n);
  } else {
    model_.storage_restore(false, sharded_);  // the model's own storage takes the full values
    std::vector<size_t> list;
    // The same list on every rank (a rank may own nothing of a small buffer).
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].own_master) list.push_back(i);
    gather_into_model(list, DType::F32);
    comm_join();
  }
  materialized_ = true;
}

void ZeroEngine::params_restore() {
  if (!materialized_) return;
  model_.storage_release(false, sharded_);
  if (mixed_ && mdt_ == DType::F32)
    for (auto& s : slots_)
      if (!s.sharded) dev_->round_to(static_cast<float*>(s.pb->data), s.n, opts_.compute_dtype);
  materialized_ = false;
}

void ZeroEngine::masters_to_host(model::Model& host) {
  DT_ENFORCE(host.on_host() && host.dtype() == DType::F32, UsageError, "masters_to_host: a host fp32 model");
  std::vector<model::ParamBuffer*> dst;
  for (auto& pb : host.params()) dst.push_back(&pb);
  for (auto& pb : host.lora_params()) dst.push_back(&pb);
  DT_ENFORCE_EQ(dst.size(), slots_.size(), UsageError, "masters_to_host: buffer count (LoRA on one model only?)");
  queue_->wait_all();
  comm_join();
  const size_t W = static_cast<size_t>(world_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    DT_ENFORCE_EQ(dst[i]->size, s.n, UsageError, "masters_to_host: size of buffer {}", s.pb->layout.name);
    float* out = dst[i]->host_f32();
    if (!s.own_master) {  // resident without a master: the compute copy is the value
      host_from_device(out, s.pb->data, mdt_, s.n);
    } else if (opts_.stage == 0 || comm_ == nullptr) {
      shard_to_host(out, s);
    } else {
      device::DeviceBuffer full(*dev_, W * s.s * sizeof(float));
      queue_->wait(comm_submit([&] {
        shard_to_device(full.as<float>() + static_cast<size_t>(rank_) * s.s, DType::F32, s);
        coll_all_gather(full.get(), s.s, DType::F32);
      }));
      comm_join();
      host_from_device(out, full.get(), DType::F32, s.n);
    }
  }
}

// ----------------------------------------------------------------------------
ZeroEngine::CommTimes ZeroEngine::comm_times_take() {
  if (!queue_) return {};
  ZeroCommQueue::Times t = queue_->times();
  queue_->times_reset();
  return {t.busy_s, t.exposed_s};
}

ZeroMemory ZeroEngine::memory() const {
  ZeroMemory r;
  // What the model must hold for training: full parameters of the resident buffers
  // (all while materialized), full gradients below stage 2. Its own bookkeeping says
  // what it does hold; the difference is idle. A master shard counts as a parameter
  // where it is the buffer's only copy between uses (stage 3 without mixed precision,
  // frozen stage-3 shards) and as optimizer state beside a compute copy.
  const size_t W = static_cast<size_t>(world_), msz = dtype_size(mdt_);
  const int st = opts_.stage;
  const size_t K = mixed_ ? 12 : 8;
  size_t want_param = 0, want_grad = 0;
  for (const auto& s : slots_) {
    if (!s.sharded || materialized_) want_param += s.n * msz;
    const bool master_is_param = s.sharded && (!mixed_ || !s.trainable);
    (master_is_param ? r.param_bytes : r.optim_bytes) += s.master.bytes();
    if (s.trainable) {
      r.optim_bytes += s.m.bytes() + s.v.bytes();
      r.grad_bytes += s.gshard.bytes();
      if (st < 2) want_grad += s.n * sizeof(float);
    }
    // Theory, per buffer (n / W for a shard).
    const size_t n = s.n, nw = n / W, n1 = st == 0 ? n : nw;
    if (s.off || s.off_param) {
      // Host: master, m, v and the gradient shard (+ its landing buffer at stages 2-3, +
      // the 16-bit copy), or a frozen shard; device: the compute copy (resident, or the
      // stage-3 shard unless offload_param) and stage 1's full gradient.
      for (const device::HostBuffer* h : {&s.hmaster, &s.hm, &s.hv, &s.hgrad, &s.hland, &s.hcopy}) {
        r.host_bytes += h->bytes();
        if (h->pinned()) r.host_pinned_bytes += h->bytes();
      }
      r.param_bytes += s.dshard.bytes();
      if (s.off) {
        r.theory_host += (16 + (st >= 2 ? 4 : 0) + (mdt_ != DType::F32 ? 2 : 0)) * nw;
        if (st < 2) r.theory_grad += 4 * n;
      } else {
        r.theory_host += dtype_size(s.sdt) * nw;
      }
      if (!s.sharded) r.theory_param += msz * n;
      else if (!s.off_param) r.theory_param += msz * nw;
      continue;
    }
    if (!s.sharded) r.theory_param += msz * n;
    else r.theory_param += (s.trainable ? (mixed_ ? 0 : 4) : dtype_size(s.sdt)) * nw;
    if (s.trainable) {
      r.theory_grad += 4 * (st >= 2 ? nw : n);
      r.theory_optim += K * n1;
    } else if (mixed_ && mdt_ == DType::F32 && !s.sharded) {
      r.theory_optim += 4 * n1;  // the CPU's exact frozen masters
    }
  }
  const size_t have_param = model_.param_allocated_bytes(), have_grad = model_.grad_allocated_bytes();
  r.param_bytes += std::min(have_param, want_param);
  r.grad_bytes += std::min(have_grad, want_grad);
  r.model_idle_bytes = have_param - std::min(have_param, want_param) + have_grad - std::min(have_grad, want_grad);
  {
    std::lock_guard<std::mutex> lk(work_mu_);
    r.work_peak_bytes = work_peak_;
  }
  return r;
}

std::string ZeroEngine::memory_report() const {
  const ZeroMemory m = memory();
  auto mib = [](size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::string s = fmt::format("zero: stage {} on {} rank(s), {} compute on {}, overlap_comm {}\n", opts_.stage, world_,
                              dtype_name(opts_.compute_dtype), dev_->name(), opts_.overlap_comm ? "on" : "off");
  // The CPU device computes in fp32: its bf16/fp16 is the optimizer rounding the fp32
  // compute copy, which saves neither memory nor time. Say so rather than let the line
  // above suggest 2-byte GEMMs.
  if (opts_.compute_dtype != DType::F32 && dev_->kind() == device::Kind::CPU)
    s += fmt::format(
        "zero: {} on the CPU is fp32 compute on values rounded to {} (4-byte compute copies, fp32 "
        "GEMMs): no memory or time saved; 2-byte CPU GEMMs are not built\n",
        dtype_name(opts_.compute_dtype), dtype_name(opts_.compute_dtype));
  s += fmt::format(
      "zero: per rank  params {:.2f} MiB (theory {:.2f})  grads {:.2f} MiB (theory {:.2f})  "
      "optimizer {:.2f} MiB (theory {:.2f})  total {:.2f} MiB (theory {:.2f})\n",
      mib(m.param_bytes), mib(m.theory_param), mib(m.grad_bytes), mib(m.theory_grad), mib(m.optim_bytes),
      mib(m.theory_optim), mib(m.total()), mib(m.theory_total()));
  if (opts_.stage == 3) {
    size_t resident = 0;
    for (const auto& sl : slots_) resident += sl.sharded ? 0 : 1;
    if (resident)
      s += fmt::format(
          "zero: {} of {} parameter buffers are below stage3_param_persistence_threshold ({}) and stay "
          "resident (counted in params)\n",
          resident, slots_.size(), opts_.param_persistence_threshold);
  }
  if (off_)
    s += fmt::format(
        "zero: offload_optimizer{}: host {:.2f} MiB (theory {:.2f}), {:.2f} MiB of it pinned; AdamW on the host {}\n",
        off_param_ ? " + offload_param" : "", mib(m.host_bytes), mib(m.theory_host), mib(m.host_pinned_bytes),
        eager_ ? "bucket by bucket during the backward"
               : "after the backward (clipping or fp16 needs the whole gradient)");
  s += fmt::format("zero: transient peak {:.2f} MiB; model-owned storage left idle {:.2f} MiB\n",
                   mib(m.work_peak_bytes), mib(m.model_idle_bytes));
  return s;
}

}  // namespace dtrain::train
