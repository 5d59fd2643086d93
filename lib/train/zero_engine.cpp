// ZeroEngine: slots (one per model buffer) with their shard ranges, masters and AdamW
// state; bucket plans; the step (reduce, norm, AdamW, gather); the stage-2/3 hooks.
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/log.h"
#include "train/grad_clip.h"
#include "train/zero_queue.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dtrain::train {

namespace {

void round_inplace(float* x, size_t n, DType t) {
  if (t == DType::BF16)
    for (size_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
  else if (t == DType::F16)
    for (size_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

// Writes n fp32 values as `t` at dst (element offset 0).
void store_wire(void* dst, const float* src, size_t n, DType t) {
  if (t == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  if (t == DType::BF16)
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  else
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
}

void load_wire(float* dst, const void* src, size_t n, DType t) {
  if (t == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  if (t == DType::BF16)
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  else
    for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

}  // namespace

// ----------------------------------------------------------------------------
struct ZeroEngine::Slot {
  model::ParamBuffer* pb = nullptr;
  int layer = 0;
  bool trainable = false;
  bool sharded = false;  // stage 3 and not persistent: parameters not resident
  size_t n = 0, s = 0, lo = 0, hi = 0;
  Buffer<float> master, m, v, gshard;  // owned range [lo, hi)
  Buffer<float> work;                  // stage 3: gathered parameters (W * s)
  Buffer<float> wgrad;                 // stages 2/3: the layer's full gradient during backward
  bool gathered = false;  // issued, maybe in flight
  uint64_t gather_ticket = 0;
  size_t bucket = SIZE_MAX, bucket_off = 0;

  size_t owned() const { return hi - lo; }
  float* master_ptr() { return master.empty() ? pb->host_f32() + lo : master.data(); }
};

struct ZeroEngine::Bucket {
  std::vector<size_t> slots;
  std::vector<size_t> offs;  // offset of each slot in the per-rank segment
  size_t seg = 0;            // per-rank segment (stage 0: the whole packed length)
  std::shared_ptr<Buffer<float>> buf;
  size_t packed = 0;
  int done_layer = 0;  // its gradients are complete after this layer's backward
};

// ----------------------------------------------------------------------------
ZeroEngine::ZeroEngine(model::Model& model, comm::Communicator* comm, const ZeroOptions& opts)
    : model_(model), comm_(comm), opts_(opts) {
  DT_ENFORCE(model.on_host(), UsageError,
             "the ZeRO engine keeps its shards, masters and AdamW state in host memory; the model is on {}",
             model.device().name());
  DT_ENFORCE(opts_.stage >= 0 && opts_.stage <= 3, ConfigError, "zero_optimization.stage {} is not 0, 1, 2 or 3",
             opts_.stage);
  DT_ENFORCE(opts_.reduce_bucket_size > 0 && opts_.allgather_bucket_size > 0, ConfigError,
             "zero_optimization.reduce_bucket_size and allgather_bucket_size must be > 0");
  if (comm_ != nullptr && comm_->size() > 1) {
    rank_ = comm_->rank();
    world_ = comm_->size();
  } else {
    comm_ = nullptr;
  }
  const auto& mc = model_.config();
  tied_ = mc.tie_embeddings;
  n_layer_ = mc.n_layer;
  layer_slots_.resize(static_cast<size_t>(n_layer_) + 2);
  const bool mixed = opts_.compute_dtype != DType::F32;
  const bool lora = model_.lora_on();
  DT_ENFORCE(!model_.storage_released(), UsageError,
             "ZeroEngine needs a model that owns all its storage; another engine released part of it (destroy that "
             "engine first)");
  std::vector<model::ParamBuffer*> all;
  for (auto& pb : model_.params()) all.push_back(&pb);
  for (auto& pb : model_.lora_params()) all.push_back(&pb);
  slots_.resize(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    Slot& s = slots_[i];
    s.pb = all[i];
    s.layer = s.pb->layout.layer;
    DT_CHECK(s.layer >= -1 && s.layer <= n_layer_);
    s.trainable = lora ? i >= model_.params().size() : true;
    s.n = s.pb->size;
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
    if (mixed || s.sharded) {
      s.master.resize(s.owned());
      if (s.owned()) std::memcpy(s.master.data(), s.pb->host_f32() + s.lo, s.owned() * sizeof(float));
    }
    if (s.trainable) {
      s.m.resize(s.owned());
      s.v.resize(s.owned());
      if (opts_.stage >= 2) s.gshard.resize(s.owned());
    }
    if (s.sharded) sharded_.push_back(i);
    else if (mixed) round_inplace(s.pb->host_f32(), s.n, opts_.compute_dtype);
    layer_slots_[static_cast<size_t>(s.layer + 1)].push_back(i);
  }
  plan_buckets();
  queue_ = std::make_unique<ZeroCommQueue>(opts_.overlap_comm && comm_ != nullptr);
  hooks_install();
  // Last, so a constructor that throws leaves the model whole. Slot i is the model's
  // buffer i (base buffers, then adapters). From here on the gradient shards (stages
  // 2-3) and master shards (stage 3) are the only copies: the model frees its full
  // arrays, and the hooks lend it working buffers while a layer runs.
  if (opts_.stage >= 2) model_.storage_release(true, sharded_);
}

ZeroEngine::~ZeroEngine() {
  model_.set_hooks({});
  queue_.reset();  // joins the communication thread
  // The model gets whole storage back (no pointer into the working buffers freed with
  // the slots). Materialized, it already holds the full fp32 weights; otherwise a
  // collective here could hang (other ranks may be unwinding), so a sharded buffer
  // keeps only this rank's shard of the masters, zeros elsewhere.
  const bool partial = !materialized_;
  model_.storage_restore();
  if (partial)
    for (size_t i : sharded_) {
      Slot& s = slots_[i];
      if (s.owned()) std::memcpy(s.pb->host_f32() + s.lo, s.master.data(), s.owned() * sizeof(float));
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

void ZeroEngine::backward_hooks_install() { hooks_install(); }

void ZeroEngine::hooks_install() {
  model::ModelHooks h;
  if (opts_.stage == 3) h.before_layer_forward = [this](int l) { on_before_forward(l); };
  h.before_layer_backward = [this](int l) { on_before_backward(l); };
  h.after_layer_backward = [this](int l) { on_after_backward(l); };
  model_.set_hooks(std::move(h));
}

void ZeroEngine::work_add(ptrdiff_t bytes) {
  std::lock_guard<std::mutex> lk(work_mu_);
  work_bytes_ = static_cast<size_t>(static_cast<ptrdiff_t>(work_bytes_) + bytes);
  work_peak_ = std::max(work_peak_, work_bytes_);
}

// ----------------------------------------------------------------------------
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

// ----------------------------------------------------------------------------
void ZeroEngine::before_step() {
  queue_->wait_all();
  grads_reduced_ = false;
  for (auto& s : slots_) {
    if (!s.trainable) continue;
    if (opts_.stage >= 2) s.gshard.zero();
    else if (s.pb->grad) std::memset(s.pb->grad, 0, s.n * sizeof(float));
  }
}

// Stage 0: allreduce (AVG) per bucket; stage 1: reduce-scatter (AVG) per bucket into
// the owned range of the model's full gradient buffer. A single-slot stage-0 bucket is
// reduced in place; otherwise the bucket is packed into `buf` (stage 0: the slots one
// after the other; stage 1: rank-major, W segments) and unpacked after the collective.
bool ZeroEngine::bucket_inplace(const Bucket& b) const { return opts_.stage == 0 && b.slots.size() == 1; }

size_t ZeroEngine::bucket_len(const Bucket& b) const {
  return bucket_inplace(b) ? 0 : (opts_.stage == 0 ? 1 : static_cast<size_t>(world_)) * b.seg;
}

void ZeroEngine::bucket_pack(const Bucket& b, float* buf) const {
  const size_t W = static_cast<size_t>(world_);
  if (opts_.stage == 0) {
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const Slot& s = slots_[b.slots[k]];
      std::memcpy(buf + b.offs[k], s.pb->grad, s.n * sizeof(float));
    }
    return;
  }
  std::memset(buf, 0, W * b.seg * sizeof(float));
  for (size_t k = 0; k < b.slots.size(); ++k) {
    const Slot& s = slots_[b.slots[k]];
    for (size_t q = 0; q < W; ++q) {
      const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
      if (e > a) std::memcpy(buf + q * b.seg + b.offs[k], s.pb->grad + a, (e - a) * sizeof(float));
    }
  }
}

// Runs on whichever thread runs the collective: the compute thread no longer writes
// these slots' gradients (the bucket is complete).
void ZeroEngine::bucket_collective(const Bucket& b, float* buf) {
  if (bucket_inplace(b)) {
    coll_allreduce(slots_[b.slots[0]].pb->grad, b.seg, DType::F32, comm::ReduceOp::AVG);
    return;
  }
  if (opts_.stage == 0) {
    coll_allreduce(buf, b.seg, DType::F32, comm::ReduceOp::AVG);
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const Slot& s = slots_[b.slots[k]];
      std::memcpy(s.pb->grad, buf + b.offs[k], s.n * sizeof(float));
    }
    return;
  }
  coll_reduce_scatter(buf, b.seg, DType::F32);
  const float* mine = buf + static_cast<size_t>(rank_) * b.seg;
  for (size_t k = 0; k < b.slots.size(); ++k) {
    const Slot& s = slots_[b.slots[k]];
    if (s.owned()) std::memcpy(s.pb->grad + s.lo, mine + b.offs[k], s.owned() * sizeof(float));
  }
}

void ZeroEngine::bucket_reduce(const Bucket& b, float* scratch) {
  if (!bucket_inplace(b)) bucket_pack(b, scratch);
  queue_->wait(queue_->submit([&] { bucket_collective(b, scratch); }));
}

// overlap_comm, stages 0/1, last micro-batch: bucket `index` is complete, so its
// collective goes to the communication thread now, with a bucket buffer of its own that
// the task frees; after_layer_backward(-1) waits for all of them.
void ZeroEngine::bucket_reduce_async(size_t index) {
  const Bucket& b = buckets_[index];
  const size_t len = bucket_len(b);
  auto buf = std::make_shared<Buffer<float>>(len);
  if (len) {
    work_add(static_cast<ptrdiff_t>(len * sizeof(float)));
    bucket_pack(b, buf->data());
  }
  queue_->submit([this, buf, index] {
    bucket_collective(buckets_[index], buf->data());
    const size_t bytes = buf->size() * sizeof(float);
    buf->resize(0);
    if (bytes) work_add(-static_cast<ptrdiff_t>(bytes));
  });
}

void ZeroEngine::grads_reduce_step() {
  if (comm_ == nullptr) return;
  size_t most = 0;
  for (const auto& b : buckets_) most = std::max(most, bucket_len(b));
  Buffer<float> scratch(most);
  work_add(static_cast<ptrdiff_t>(most * sizeof(float)));
  for (const auto& b : buckets_) bucket_reduce(b, scratch.data());
  work_add(-static_cast<ptrdiff_t>(most * sizeof(float)));
}

bool ZeroEngine::step(float lr, float loss_scale) {
  DT_ENFORCE(!materialized_, UsageError, "ZeroEngine::step() after params_materialize(); call params_restore() first");
  DT_ENFORCE_GT(loss_scale, 0.0f, UsageError, "ZeroEngine::step loss_scale");
  queue_->wait_all();
  if (opts_.stage <= 1 && !grads_reduced_) grads_reduce_step();

  auto grad_of = [&](Slot& s) -> float* {
    return opts_.stage >= 2 ? s.gshard.data() : s.pb->grad + s.lo;
  };
  double sq = 0.0;
  for (auto& s : slots_)
    if (s.trainable && s.owned()) sq += grad_norm_sq(grad_of(s), s.owned());
  if (opts_.stage >= 1 && comm_ != nullptr) {
    // Sum of squares as a float pair (hi + lo keeps ~double precision through an fp32
    // SUM) plus the overflow flag, so every rank takes the same decision.
    const float hi = static_cast<float>(sq);
    float red[3] = {hi, static_cast<float>(sq - static_cast<double>(hi)), std::isfinite(sq) ? 0.0f : 1.0f};
    if (!std::isfinite(sq)) red[0] = red[1] = 0.0f;
    queue_->wait(queue_->submit([&] { coll_allreduce(red, 3, DType::F32, comm::ReduceOp::SUM); }));
    sq = red[2] != 0.0f ? std::numeric_limits<double>::infinity()
                        : static_cast<double>(red[0]) + static_cast<double>(red[1]);
  }
  last_norm_ = std::sqrt(sq) / static_cast<double>(loss_scale);
  if (!std::isfinite(sq)) return false;

  const float grad_scale = clip_coefficient(last_norm_, opts_.gradient_clipping) / loss_scale;
  ++step_count_;
  for (auto& s : slots_) {
    if (!s.trainable || !s.owned()) continue;
    float* p = s.master_ptr();
    const float* g = grad_of(s);
    for (const auto& t : s.pb->layout.tensors) {
      const size_t a = std::max(t.offset, s.lo), e = std::min(t.offset + t.numel(), s.hi);
      if (a >= e) continue;
      const size_t o = a - s.lo;
      adamw_step(p + o, g + o, s.m.data() + o, s.v.data() + o, e - a, opts_.adamw, lr, step_count_, t.decay,
                 grad_scale);
    }
  }
  params_gather_resident();
  release_all_gathered();
  return true;
}

// The model's resident copies of the trainable buffers after an update: stage 0 rounds
// its full master; stages 1-3 all-gather the owned shards in the compute dtype.
void ZeroEngine::params_gather_resident() {
  const DType t = opts_.compute_dtype;
  if (opts_.stage == 0) {
    if (t == DType::F32) return;
    for (auto& s : slots_)
      if (s.trainable) {
        float* d = s.pb->host_f32();
        for (size_t i = 0; i < s.n; ++i) d[i] = s.master[i];
        round_inplace(d, s.n, t);
      }
    return;
  }
  std::vector<size_t> list;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].trainable && !slots_[i].sharded) list.push_back(i);
  gather_into_model(list, t);
}

// Bucketed all-gather of the masters of `list` (resident slots, stages >= 1) into the
// model's full buffers, on the wire as `t`.
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
    Buffer<std::byte> buf(W * seg * es);
    work_add(static_cast<ptrdiff_t>(buf.size()));
    std::byte* mine = buf.data() + static_cast<size_t>(rank_) * seg * es;
    for (size_t j = 0; j < group.size(); ++j) {
      Slot& s = slots_[group[j]];
      if (s.owned()) store_wire(mine + offs[j] * es, s.master_ptr(), s.owned(), t);
    }
    queue_->wait(queue_->submit([&] { coll_all_gather(buf.data(), seg, t); }));
    for (size_t q = 0; q < W; ++q)
      for (size_t j = 0; j < group.size(); ++j) {
        Slot& s = slots_[group[j]];
        const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
        if (e > a) load_wire(s.pb->host_f32() + a, buf.data() + (q * seg + offs[j]) * es, e - a, t);
      }
    work_add(-static_cast<ptrdiff_t>(buf.size()));
  }
}

// ----------------------------------------------------------------------------
// Stage 2/3 gradients: each layer's gradient lives in a working buffer from
// before_layer_backward to after_layer_backward, is packed rank-major into its bucket
// and the full bucket is reduce-scattered (AVG) and accumulated into the shards.
void ZeroEngine::on_before_backward(int layer) {
  DT_ENFORCE(!materialized_, UsageError, "backward() after ZeroEngine::params_materialize(); call params_restore() first");
  DT_ENFORCE(!grads_reduced_, UsageError,
             "backward() after the step's last micro-batch already reduced the gradients (overlap_comm); call "
             "ZeroEngine::before_step() first, or set_last_micro_batch(false) for the earlier micro-batches");
  if (opts_.stage == 3) stage3_visit(layer, -1);
  if (opts_.stage < 2) return;
  auto attach = [&](Slot& s) {
    if (!s.trainable || !s.wgrad.empty()) return;
    s.wgrad.resize(s.n);
    work_add(static_cast<ptrdiff_t>(s.n * sizeof(float)));
    s.pb->grad = s.wgrad.data();
  };
  for (size_t i : layer_slots_[static_cast<size_t>(layer + 1)]) attach(slots_[i]);
  // The tied head writes the embeddings' gradient too.
  if (layer == n_layer_ && tied_)
    for (size_t i : layer_slots_[0]) attach(slots_[i]);
}

void ZeroEngine::on_after_backward(int layer) {
  backward_layer_ = layer;
  for (size_t i : layer_slots_[static_cast<size_t>(layer + 1)]) {
    Slot& s = slots_[i];
    if (!s.trainable) continue;
    if (opts_.compute_dtype == DType::F16) round_inplace(s.pb->grad, s.n, DType::F16);
    if (opts_.stage >= 2) grad_bucket_pack(s);
  }
  // Stages 0/1 reduce once per step: with a communication thread, during the last
  // micro-batch's backward, each bucket as soon as its gradients are complete (the same
  // buckets in the same order as the step-time path, so the results are identical).
  if (opts_.stage <= 1 && queue_->threaded() && last_micro_) {
    for (size_t bi = 0; bi < buckets_.size(); ++bi)
      if (buckets_[bi].done_layer == layer) {
        bucket_reduce_async(bi);
        if (layer > -1) ++issued_in_backward_;
      }
    if (layer == -1) grads_reduced_ = true;
  }
  if (opts_.stage == 3) {
    for (size_t i : layer_slots_[static_cast<size_t>(layer + 1)])
      if (slots_[i].sharded) gather_release(slots_[i]);
  }
  if (layer == -1) {
    if (opts_.stage == 3) release_all_gathered();
    queue_->wait_all();  // nothing in flight once backward returns
  }
}

void ZeroEngine::grad_bucket_pack(Slot& s) {
  Bucket& b = buckets_[s.bucket];
  const size_t W = static_cast<size_t>(world_);
  if (!b.buf) {
    b.buf = std::make_shared<Buffer<float>>(W * b.seg);
    work_add(static_cast<ptrdiff_t>(W * b.seg * sizeof(float)));
  }
  float* dst = b.buf->data();
  for (size_t q = 0; q < W; ++q) {
    const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
    if (e > a) std::memcpy(dst + q * b.seg + s.bucket_off, s.wgrad.data() + a, (e - a) * sizeof(float));
  }
  s.pb->grad = nullptr;
  s.wgrad = Buffer<float>();
  work_add(-static_cast<ptrdiff_t>(s.n * sizeof(float)));
  if (++b.packed == b.slots.size()) grad_bucket_flush(s.bucket);
}

void ZeroEngine::grad_bucket_flush(size_t index) {
  Bucket& b = buckets_[index];
  std::shared_ptr<Buffer<float>> buf = std::move(b.buf);
  b.buf.reset();
  b.packed = 0;
  if (queue_->threaded() && backward_layer_ > -1) ++issued_in_backward_;
  queue_->submit([this, buf, index] {
    const Bucket& bk = buckets_[index];
    coll_reduce_scatter(buf->data(), bk.seg, DType::F32);
    const float* mine = buf->data() + static_cast<size_t>(rank_) * bk.seg;
    for (size_t k = 0; k < bk.slots.size(); ++k) {
      Slot& s = slots_[bk.slots[k]];
      float* g = s.gshard.data();
      const float* src = mine + bk.offs[k];
      for (size_t i = 0; i < s.owned(); ++i) g[i] += src[i];
    }
    const size_t bytes = buf->size() * sizeof(float);
    buf->resize(0);
    work_add(-static_cast<ptrdiff_t>(bytes));
  });
}

// ----------------------------------------------------------------------------
// Stage 3 parameters: a sharded buffer is gathered (in the compute dtype) into a
// working buffer just before its layer runs and released after; the next layers'
// gathers are issued ahead within prefetch_bucket_size / max_live_parameters.
void ZeroEngine::gather_issue(Slot& s) {
  if (s.gathered) return;
  s.gathered = true;
  const size_t W = static_cast<size_t>(world_);
  s.work.resize(W * s.s);
  work_add(static_cast<ptrdiff_t>(s.work.size() * sizeof(float)));
  live_elems_ += s.n;
  const DType t = opts_.compute_dtype;
  Slot* sp = &s;
  s.gather_ticket = queue_->submit([this, sp, t, W] {
    Slot& g = *sp;
    if (t == DType::F32) {
      if (g.owned()) std::memcpy(g.work.data() + static_cast<size_t>(rank_) * g.s, g.master.data(), g.owned() * 4);
      coll_all_gather(g.work.data(), g.s, DType::F32);
      return;
    }
    Buffer<uint16_t> wire(W * g.s);
    work_add(static_cast<ptrdiff_t>(wire.size() * 2));
    if (g.owned()) store_wire(wire.data() + static_cast<size_t>(rank_) * g.s, g.master.data(), g.owned(), t);
    coll_all_gather(wire.data(), g.s, t);
    load_wire(g.work.data(), wire.data(), g.n, t);
    work_add(-static_cast<ptrdiff_t>(wire.size() * 2));
  });
}

void ZeroEngine::gather_wait(Slot& s) {
  queue_->wait(s.gather_ticket);
  s.pb->data = s.work.data();
}

void ZeroEngine::gather_release(Slot& s) {
  if (!s.gathered) return;
  queue_->wait(s.gather_ticket);
  s.gathered = false;
  s.pb->data = nullptr;
  work_add(-static_cast<ptrdiff_t>(s.work.size() * sizeof(float)));
  s.work = Buffer<float>();
  live_elems_ -= s.n;
}

void ZeroEngine::release_all_gathered() {
  for (auto& s : slots_)
    if (s.sharded && s.gathered) gather_release(s);
}

// The hook body for layer `layer` in direction dir (+1 forward, -1 backward).
void ZeroEngine::stage3_visit(int layer, int dir) {
  const int L = n_layer_;
  std::vector<char> keep(static_cast<size_t>(L) + 2, 0);
  auto idx = [](int l) { return static_cast<size_t>(l + 1); };
  keep[idx(layer)] = 1;
  // The tied head reads the embeddings in forward and backward.
  if (tied_ && ((dir > 0 && layer == L) || dir < 0)) keep[idx(-1)] = 1;
  std::vector<int> ahead;
  size_t budget = 0;
  for (int l = layer + dir; l >= -1 && l <= L; l += dir) {
    size_t need = 0;
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded && !slots_[i].gathered) need += slots_[i].n;
    if (budget + need > opts_.prefetch_bucket_size || live_elems_ + budget + need > opts_.max_live_parameters) break;
    budget += need;
    keep[idx(l)] = 1;
    ahead.push_back(l);
  }
  for (auto& s : slots_)
    if (s.sharded && s.gathered && !keep[idx(s.layer)]) gather_release(s);
  std::vector<Slot*> now;
  std::vector<int> current{layer};
  if (layer != -1 && keep[idx(-1)]) current.push_back(-1);
  for (int l : current) {
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) {
        gather_issue(slots_[i]);
        now.push_back(&slots_[i]);
      }
  }
  for (int l : ahead)
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) gather_issue(slots_[i]);
  for (Slot* s : now) gather_wait(*s);
  if (dir > 0 && layer == L) queue_->wait_all();  // nothing in flight once forward returns
}

// While materialized every buffer is resident: forward (evaluation) needs no gathering.
void ZeroEngine::on_before_forward(int layer) {
  if (!materialized_) stage3_visit(layer, +1);
}

// ----------------------------------------------------------------------------
void ZeroEngine::params_materialize() {
  if (materialized_) return;
  queue_->wait_all();
  release_all_gathered();
  const DType f32 = DType::F32;
  if (opts_.stage == 0) {
    for (auto& s : slots_)
      if (!s.master.empty()) std::memcpy(s.pb->host_f32(), s.master.data(), s.n * sizeof(float));
  } else {
    model_.storage_restore(false, sharded_);  // the model's own storage takes the full values
    std::vector<size_t> list;
    // The same list on every rank (a rank may own nothing of a small buffer).
    for (size_t i = 0; i < slots_.size(); ++i)
      if (opts_.compute_dtype != DType::F32 || slots_[i].sharded) list.push_back(i);
    gather_into_model(list, f32);
  }
  materialized_ = true;
}

void ZeroEngine::params_restore() {
  if (!materialized_) return;
  model_.storage_release(false, sharded_);
  if (opts_.compute_dtype != DType::F32)
    for (auto& s : slots_)
      if (!s.sharded) round_inplace(s.pb->host_f32(), s.n, opts_.compute_dtype);
  materialized_ = false;
}

ZeroCheckpointView ZeroEngine::checkpoint_view() {
  ZeroCheckpointView v;
  v.buffers = buffer_views();
  v.comm = comm_;
  v.rank = rank_;
  v.world = world_;
  v.stage = opts_.stage;
  v.compute_dtype = opts_.compute_dtype;
  v.step_count = step_count_;
  v.loaded = [this](int64_t step_count) {
    step_count_ = step_count;
    params_loaded();
  };
  return v;
}

std::vector<ZeroBufferView> ZeroEngine::buffer_views() {
  queue_->wait_all();
  std::vector<ZeroBufferView> out;
  for (auto& s : slots_) {
    ZeroBufferView v;
    v.buffer = s.pb;
    v.trainable = s.trainable;
    v.resident = !s.sharded;
    v.lo = s.lo;
    v.hi = s.hi;
    v.master = s.owned() ? s.master_ptr() : nullptr;
    v.m = s.trainable ? s.m.data() : nullptr;
    v.v = s.trainable ? s.v.data() : nullptr;
    out.push_back(v);
  }
  return out;
}

void ZeroEngine::params_loaded() {
  queue_->wait_all();
  release_all_gathered();
  for (auto& s : slots_) {
    if (s.sharded) continue;
    if (!s.master.empty() && s.owned()) std::memcpy(s.master.data(), s.pb->host_f32() + s.lo, s.owned() * sizeof(float));
    if (opts_.compute_dtype != DType::F32) round_inplace(s.pb->host_f32(), s.n, opts_.compute_dtype);
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
  size_t phi = 0, psi = 0;
  // What the model must hold for training: full parameters of the resident buffers
  // (all while materialized), full gradients below stage 2. Its own bookkeeping says
  // what it does hold; the difference is idle.
  size_t want_param = 0, want_grad = 0;
  for (const auto& s : slots_) {
    phi += s.n;
    if (s.trainable) psi += s.n;
    if (!s.sharded || materialized_) want_param += s.n * sizeof(float);
    r.param_bytes += s.master.size() * sizeof(float);
    if (s.trainable) {
      r.optim_bytes += (s.m.size() + s.v.size()) * sizeof(float);
      r.grad_bytes += s.gshard.size() * sizeof(float);
      if (opts_.stage < 2) want_grad += s.n * sizeof(float);
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
  const size_t W = static_cast<size_t>(world_);
  const size_t mp = opts_.compute_dtype != DType::F32 ? 1 : 0;
  const int st = opts_.stage;
  r.theory_param = st == 3 ? 4 * phi / W : 4 * phi + mp * 4 * phi / (st == 0 ? 1 : W);
  r.theory_grad = st >= 2 ? 4 * psi / W : 4 * psi;
  r.theory_optim = st == 0 ? 8 * psi : 8 * psi / W;
  return r;
}

std::string ZeroEngine::memory_report() const {
  const ZeroMemory m = memory();
  auto mib = [](size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::string s = fmt::format("zero: stage {} on {} rank(s), {} compute, overlap_comm {}\n", opts_.stage, world_,
                              dtype_name(opts_.compute_dtype), opts_.overlap_comm ? "on" : "off");
  s += fmt::format("zero: per rank  params {:.2f} MiB (theory {:.2f})  grads {:.2f} MiB (theory {:.2f})  "
                   "optimizer {:.2f} MiB (theory {:.2f})  total {:.2f} MiB (theory {:.2f})\n",
                   mib(m.param_bytes), mib(m.theory_param), mib(m.grad_bytes), mib(m.theory_grad), mib(m.optim_bytes),
                   mib(m.theory_optim), mib(m.total()), mib(m.theory_total()));
  if (opts_.stage == 3) {
    size_t resident = 0;
    for (const auto& sl : slots_) resident += sl.sharded ? 0 : 1;
    if (resident)
      s += fmt::format("zero: {} of {} parameter buffers are below stage3_param_persistence_threshold ({}) and stay "
                       "resident (counted in params)\n",
                       resident, slots_.size(), opts_.param_persistence_threshold);
  }
  s += fmt::format("zero: transient peak {:.2f} MiB; model-owned storage left idle {:.2f} MiB\n",
                   mib(m.work_peak_bytes), mib(m.model_idle_bytes));
  return s;
}

}  // namespace dtrain::train
