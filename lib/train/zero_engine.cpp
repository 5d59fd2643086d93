// ZeroEngine, the thin engine over its parts: construction as a sequence of named steps
// (options, the data-parallel group, the slots with their shards and state, the buckets,
// compression, the model's storage handed over) and teardown. Its parts: the layout
// (zero_layout.h), the collectives (zero_comm.h), compression (zero_compression.h), the
// full weights (zero_weights.h) and the reports (zero_report.h); the step is in
// zero_step.cpp, the per-layer hooks in zero_hooks.cpp, offload in zero_offload.cpp,
// checkpoint views in zero_checkpoint_view.cpp.
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <vector>

namespace dtrain::train {

// ----------------------------------------------------------------------------
ZeroEngine::ZeroEngine(model::Model& model, comm::Communicator* comm, const ZeroOptions& opts,
                       const model::Model* fp32_source, const model::BufferFill& deferred)
    : ZeroEngine(model, comm::ProcessGroups::world_only(comm), opts, fp32_source, deferred) {}

ZeroEngine::ZeroEngine(model::Model& model, const comm::ProcessGroups& groups, const ZeroOptions& opts,
                       const model::Model* fp32_source, const model::BufferFill& deferred)
    : model_(model), dev_(&model.device()), opts_(opts), coll_(model.device()), deferred_(static_cast<bool>(deferred)),
      compress_(model.device(), opts_, coll_, slots_, buckets_),
      offload_(model.device(), opts_, coll_, slots_, buckets_),
      gather_(model.device(), opts_, place_, coll_, work_, offload_, slots_, layer_slots_),
      grads_(model.device(), opts_, place_, coll_, work_, compress_, offload_, slots_, buckets_),
      views_(model.device(), opts_, coll_, gather_, offload_, compress_, slots_),
      weights_(model, opts_, place_, coll_, gather_, offload_, slots_, sharded_),
      report_(model, opts_, place_, coll_, work_, offload_, weights_, slots_), step_buf_(model.device()) {
  options_check();
  coll_.attach(groups, model_.on_host(), opts_.single_rank_comm, opts_.overlap_comm);
  job_comm_ = groups.world;
  place_ = ZeroPlacement{opts_.stage, coll_.rank(), coll_.world(), opts_.param_persistence_threshold};
  sources_check(fp32_source);
  slots_build(fp32_source, deferred);
  step_buf_.allocate();
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
    const bool partial = !weights_.materialized();
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

}  // namespace dtrain::train
