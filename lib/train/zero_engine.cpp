// ZeroEngine, the thin engine over its parts: construction as a sequence of named steps
// (options, the data-parallel group, the slots with their shards and state, the buckets,
// compression, the model's storage handed over), teardown, materialized parameters and
// memory accounting. Its parts: the layout (zero_layout.h), the collectives
// (zero_comm.h), compression (zero_compression.h); the step is in zero_step.cpp, the
// per-layer hooks in zero_hooks.cpp, offload in zero_offload.cpp, checkpoint views in
// zero_checkpoint_view.cpp.
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/log.h"
#include "core/dtype.h"
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
    : ZeroEngine(model, comm::ProcessGroups::world_only(comm), opts, fp32_source, deferred) {}

ZeroEngine::ZeroEngine(model::Model& model, const comm::ProcessGroups& groups, const ZeroOptions& opts,
                       const model::Model* fp32_source, const model::BufferFill& deferred)
    : model_(model), dev_(&model.device()), opts_(opts), coll_(model.device()),
      compress_(model.device(), opts_, coll_, slots_, buckets_),
      offload_(model.device(), opts_, coll_, slots_, buckets_),
      gather_(model.device(), opts_, place_, coll_, work_, offload_, slots_, layer_slots_),
      grads_(model.device(), opts_, place_, coll_, work_, compress_, offload_, slots_, buckets_),
      views_(offload_, compress_, slots_), steps_(model.device()), deferred_(static_cast<bool>(deferred)) {
  options_check();
  coll_.attach(groups, model_.on_host(), opts_.single_rank_comm, opts_.overlap_comm);
  job_comm_ = groups.world;
  place_ = ZeroPlacement{opts_.stage, coll_.rank(), coll_.world(), opts_.param_persistence_threshold};
  sources_check(fp32_source);
  slots_build(fp32_source, deferred);
  steps_.allocate();
  buckets_plan();
  compress_.plan(work_);
  size_t most = 0;  // the 16-bit wire's largest collective
  for (const auto& b : buckets_)
    most = std::max(most, (opts_.stage == 0 ? 1 : static_cast<size_t>(place_.world)) * b.seg);
  coll_.wire_set(opts_.grad_wire, most, work_);
  hooks_install();
  storage_hand_over();
}

void ZeroEngine::options_check() {
  DT_ENFORCE(config::zero_stage_valid(opts_.stage), ConfigError, "zero_optimization.stage {} is not 0, 1, 2 or 3",
             opts_.stage);
  DT_ENFORCE(opts_.reduce_bucket_size > 0 && opts_.allgather_bucket_size > 0, ConfigError,
             "zero_optimization.reduce_bucket_size and allgather_bucket_size must be > 0");
  mdt_ = model_.dtype();
  mixed_ = opts_.compute_dtype != DType::F32;
  DT_ENFORCE(mdt_ == DType::F32 || mdt_ == opts_.compute_dtype, ConfigError,
             "the model computes in {} but the engine's compute dtype is {}; build the model in the compute dtype",
             dtype_name(mdt_), dtype_name(opts_.compute_dtype));
}

// Where the masters start from (the model, fp32_source or the deferred fill) and what
// offload can do with this model.
void ZeroEngine::sources_check(const model::Model* fp32_source) {
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
  offload_.configure(model_.on_host(), mdt_);
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
}

// One slot per model buffer (base buffers, then adapters): its shard, its starting values
// (the fp32 source, a deferred buffer staged one at a time, or the model's own) and state.
void ZeroEngine::slots_build(const model::Model* fp32_source, const model::BufferFill& deferred) {
  const auto& mc = model_.config();
  tied_ = mc.tie_embeddings;
  n_layer_ = mc.n_layer;
  layer_slots_.resize(static_cast<size_t>(n_layer_) + 2);
  gather_.configure(mdt_, tied_);
  views_.configure(model_.on_host(), mdt_);
  const bool lora = model_.lora_on();
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
    DT_CHECK(s.pb->layout.layer >= -1 && s.pb->layout.layer <= n_layer_);
    static_cast<ZeroShard&>(s) =
        place_.place(s.pb->size, s.pb->layout.layer, lora ? i >= model_.params().size() : true);
    if (!src.empty())
      DT_ENFORCE_EQ(src[i]->size, s.n, UsageError, "ZeroEngine: fp32 source buffer {} size", s.pb->layout.name);
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
    slot_state_init(s, i, fp32);
  }
}

// A slot's master (apart from the model's buffer where it needs one), AdamW's moments and
// gradient shard, on the device or (offload) on the host.
void ZeroEngine::slot_state_init(Slot& s, size_t index, const float* fp32) {
  // A frozen buffer of a 16-bit model keeps no fp32 master: its compute copy is its value.
  s.own_master = s.sharded || (mixed_ && (s.trainable || mdt_ == DType::F32));
  s.sdt = (!s.trainable && mdt_ != DType::F32) ? mdt_ : DType::F32;
  s.off = offload_.on() && s.trainable;
  s.off_param = offload_.on_param() && s.sharded;
  if (s.off || s.off_param) {
    s.own_master = true;  // on the host
    offload_.slot_init(s, fp32);
  } else if (s.own_master) {
    s.master = device::DeviceBuffer(*dev_, s.owned() * dtype_size(s.sdt));
    if (s.owned()) {
      if (fp32 != nullptr) offload_.device_from_host(s.master.get(), s.sdt, fp32 + s.lo, s.owned());
      else dev_->cast(s.master.get(), s.sdt, zero_at(s.pb->data, s.lo, mdt_), mdt_, s.owned());
    }
  }
  if (s.trainable && !s.off) {
    s.m = device::DeviceBuffer(*dev_, s.owned() * sizeof(float));
    s.v = device::DeviceBuffer(*dev_, s.owned() * sizeof(float));
    if (opts_.stage >= 2) s.gshard = device::DeviceBuffer(*dev_, s.owned() * sizeof(float));
  }
  if (s.sharded) {
    sharded_.push_back(index);
    if (coll_.stream_ordered()) s.ready = dev_->event_create();
  } else if (mixed_ && mdt_ == DType::F32) {
    dev_->round_to(static_cast<float*>(s.pb->data), s.n, opts_.compute_dtype);
  }
  layer_slots_[static_cast<size_t>(s.layer + 1)].push_back(index);
}

void ZeroEngine::buckets_plan() {
  std::vector<ZeroShard*> shards;
  for (auto& s : slots_) shards.push_back(&s);
  std::vector<ZeroBucketPlan> plan = zero_buckets_plan(shards, layer_slots_, opts_.stage, opts_.reduce_bucket_size);
  buckets_.clear();
  buckets_.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) static_cast<ZeroBucketPlan&>(buckets_[i]) = std::move(plan[i]);
  if (offload_.on() && opts_.stage >= 2)
    for (auto& b : buckets_) b.landed_ev = dev_->event_create();
}

// Last, so a constructor that throws leaves the model whole. Slot i is the model's
// buffer i (base buffers, then adapters). From here on the gradient shards (stages
// 2-3) and master shards (stage 3) are the only copies: the model frees its full
// arrays, and the hooks lend it working buffers while a layer runs.
void ZeroEngine::storage_hand_over() {
  if (opts_.stage >= 2) model_.storage_release(true, sharded_);
  // A deferred model has no gradient arrays; below stage 2 the engine uses the model's.
  else if (deferred_) model_.storage_restore(true, {});
}

ZeroEngine::~ZeroEngine() {
  model_.set_hooks({});
  coll_.stop();     // joins the communication thread
  offload_.stop();  // and the offload worker
  try {
    coll_.join();
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
        if (s.owned()) offload_.shard_to_device(zero_at(s.pb->data, s.lo, mdt_), mdt_, s);
      }
    dev_->synchronize();
  } catch (const std::exception& e) {
    log_warn("zero engine teardown: {}", e.what());
  }
}

// ----------------------------------------------------------------------------
void ZeroEngine::params_materialize() {
  if (materialized_) return;
  coll_.wait_all();
  gather_.release_all();
  coll_.join();
  if (opts_.stage == 0) {
    for (auto& s : slots_)
      if (s.own_master) dev_->cast(s.pb->data, mdt_, s.master.get(), s.sdt, s.n);
  } else {
    model_.storage_restore(false, sharded_);  // the model's own storage takes the full values
    std::vector<size_t> list;
    // The same list on every rank (a rank may own nothing of a small buffer).
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].own_master) list.push_back(i);
    gather_.into_model(list, DType::F32);
    coll_.join();
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
  coll_.wait_all();
  coll_.join();
  const size_t W = static_cast<size_t>(place_.world);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    DT_ENFORCE_EQ(dst[i]->size, s.n, UsageError, "masters_to_host: size of buffer {}", s.pb->layout.name);
    float* out = dst[i]->host_f32();
    if (!s.own_master) {  // resident without a master: the compute copy is the value
      offload_.host_from_device(out, s.pb->data, mdt_, s.n);
    } else if (opts_.stage == 0 || coll_.comm() == nullptr) {
      offload_.shard_to_host(out, s);
    } else {
      device::DeviceBuffer full(*dev_, W * s.s * sizeof(float));
      coll_.wait(coll_.submit([&] {
        offload_.shard_to_device(full.as<float>() + static_cast<size_t>(place_.rank) * s.s, DType::F32, s);
        coll_.all_gather(full.get(), s.s, DType::F32);
      }));
      coll_.join();
      offload_.host_from_device(out, full.get(), DType::F32, s.n);
    }
  }
}

// ----------------------------------------------------------------------------
ZeroEngine::CommTimes ZeroEngine::comm_times_take() {
  const ZeroCommQueue::Times t = coll_.times_take();
  return {t.busy_s, t.exposed_s};
}

ZeroMemory ZeroEngine::memory() const {
  ZeroMemory r;
  // What the model must hold for training: full parameters of the resident buffers
  // (all while materialized), full gradients below stage 2. Its own bookkeeping says
  // what it does hold; the difference is idle. A master shard counts as a parameter
  // where it is the buffer's only copy between uses (stage 3 without mixed precision,
  // frozen stage-3 shards) and as optimizer state beside a compute copy.
  const size_t W = static_cast<size_t>(place_.world), msz = dtype_size(mdt_);
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
  r.work_peak_bytes = work_.peak();
  return r;
}

std::string ZeroEngine::memory_report() const {
  const ZeroMemory m = memory();
  auto mib = [](size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::string s =
      fmt::format("zero: stage {} on {} rank(s), {} compute on {}, overlap_comm {}\n", opts_.stage, place_.world,
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
  if (offload_.on())
    s += fmt::format(
        "zero: offload_optimizer{}: host {:.2f} MiB (theory {:.2f}), {:.2f} MiB of it pinned; AdamW on the host {}\n",
        offload_.on_param() ? " + offload_param" : "", mib(m.host_bytes), mib(m.theory_host), mib(m.host_pinned_bytes),
        offload_.eager() ? "bucket by bucket during the backward"
                         : "after the backward (clipping or fp16 needs the whole gradient)");
  s += fmt::format("zero: transient peak {:.2f} MiB; model-owned storage left idle {:.2f} MiB\n",
                   mib(m.work_peak_bytes), mib(m.model_idle_bytes));
  return s;
}

}  // namespace dtrain::train
