// ZeroEngine's per-layer hooks (installed on the model): stage 2/3 gradients packed into
// their bucket as each layer's backward ends and reduce-scattered into the shards, stage
// 0/1 buckets reduced during the last micro-batch's backward, and stage 3 parameters
// gathered ahead of each layer (prefetch) and released after it.
#include "train/zero_engine.h"

#include "core/check.h"
#include "core/dtype.h"
#include "train/zero_slot.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dtrain::train {

void ZeroEngine::backward_hooks_install() { hooks_install(); }

void ZeroEngine::hooks_install() {
  model::ModelHooks h;
  if (opts_.stage == 3) h.before_layer_forward = [this](int l) { on_before_forward(l); };
  h.before_layer_backward = [this](int l) { on_before_backward(l); };
  h.after_layer_backward = [this](int l) { on_after_backward(l); };
  model_.set_hooks(std::move(h));
}

// ----------------------------------------------------------------------------
// Stage 2/3 gradients: each layer's gradient lives in a working buffer from
// before_layer_backward to after_layer_backward, is packed rank-major into its bucket
// and the full bucket is reduce-scattered (AVG) and accumulated into the shards.
void ZeroEngine::on_before_backward(int layer) {
  DT_ENFORCE(!materialized_, UsageError,
             "backward() after ZeroEngine::params_materialize(); call params_restore() first");
  DT_ENFORCE(!grads_reduced_, UsageError,
             "backward() after the step's last micro-batch already reduced the gradients (overlap_comm); call "
             "ZeroEngine::before_step() first, or set_last_micro_batch(false) for the earlier micro-batches");
  if (opts_.stage == 3) stage3_visit(layer, -1);
  if (opts_.stage < 2) return;
  auto attach = [&](Slot& s) {
    if (!s.trainable || s.wgrad.get() != nullptr) return;
    s.wgrad = device::DeviceBuffer(*dev_, s.n * sizeof(float));
    work_.add(static_cast<ptrdiff_t>(s.n * sizeof(float)));
    s.pb->grad = s.wgrad.as<float>();
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
    if (opts_.compute_dtype == DType::F16) dev_->round_to(s.pb->grad, s.n, DType::F16);
    if (opts_.stage >= 2) grad_bucket_pack(s);
  }
  // Stages 0/1 reduce once per step: with a communication thread or stream, during the
  // last micro-batch's backward, each bucket as soon as its gradients are complete (the
  // same buckets in the same order as the step-time path, so the results are identical).
  const bool overlapped = coll_.threaded() || (coll_.stream_ordered() && opts_.overlap_comm);
  if (opts_.stage <= 1 && overlapped && last_micro_ && coll_.comm() != nullptr) {
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
    coll_.wait_all();  // nothing in flight on a thread once backward returns
    // The offloaded update started during this backward: no further micro-batch.
    if (offload_.eager() && last_micro_) grads_reduced_ = true;
  }
  if (offload_.on()) {
    const double t = offload_.now();
    offload_.trace_add("backward", layer, t, t);
  }
}

void ZeroEngine::grad_bucket_pack(Slot& s) {
  Bucket& b = buckets_[s.bucket];
  const size_t W = static_cast<size_t>(place_.world);
  if (!b.buf) {
    b.buf = std::make_shared<device::DeviceBuffer>(*dev_, W * b.seg * sizeof(float));
    work_.add(static_cast<ptrdiff_t>(W * b.seg * sizeof(float)));
  }
  float* dst = b.buf->as<float>();
  for (size_t q = 0; q < W; ++q) {
    const size_t a = std::min(q * s.s, s.n), e = std::min(a + s.s, s.n);
    if (e > a) dev_->copy_d2d(dst + q * b.seg + s.bucket_off, s.wgrad.as<float>() + a, (e - a) * sizeof(float));
  }
  s.pb->grad = nullptr;
  s.wgrad.reset();
  work_.add(-static_cast<ptrdiff_t>(s.n * sizeof(float)));
  if (++b.packed == b.slots.size()) grad_bucket_flush(s.bucket);
}

void ZeroEngine::grad_bucket_flush(size_t index) {
  Bucket& b = buckets_[index];
  std::shared_ptr<device::DeviceBuffer> buf = std::move(b.buf);
  b.buf.reset();
  b.packed = 0;
  if ((coll_.threaded() || coll_.stream_ordered()) && backward_layer_ > -1) ++issued_in_backward_;
  coll_.submit([this, buf, index] {
    const Bucket& bk = buckets_[index];
    float* base = buf->as<float>();
    coll_.grad_reduce(base, static_cast<size_t>(place_.world) * bk.seg, true);
    const float* mine = base + static_cast<size_t>(place_.rank) * bk.seg;
    if (offload_.on()) {
      offload_.land(index, mine, offload_.eager() && last_micro_, lr_,
                    step_count_ + 1);  // to the host, where the gradient shards accumulate
    } else {
      for (size_t k = 0; k < bk.slots.size(); ++k) {
        Slot& s = slots_[bk.slots[k]];
        if (s.owned()) dev_->add(s.gshard.as<float>(), mine + bk.offs[k], s.owned());
      }
    }
    const size_t bytes = buf->bytes();
    buf->reset();  // on the communication stream, after its last use
    work_.add(-static_cast<ptrdiff_t>(bytes));
  });
}

// ----------------------------------------------------------------------------
// Stage 3 parameters: a sharded buffer is gathered (in the compute dtype) into a
// working buffer just before its layer runs and released after; the next layers'
// gathers are issued ahead within prefetch_bucket_size / max_live_parameters.
void ZeroEngine::gather_issue(Slot& s) {
  if (s.gathered) return;
  s.gathered = true;
  const size_t W = static_cast<size_t>(place_.world);
  s.work = device::DeviceBuffer(*dev_, W * s.s * dtype_size(mdt_));
  work_.add(static_cast<ptrdiff_t>(s.work.bytes()));
  live_elems_ += s.n;
  const DType t = opts_.compute_dtype;
  Slot* sp = &s;
  s.gather_ticket = coll_.submit([this, sp, t, W] {
    Slot& g = *sp;
    char* work = static_cast<char*>(g.work.get());
    if (t == mdt_) {  // on the wire in the model's dtype: straight into the working buffer
      char* mine = work + static_cast<size_t>(place_.rank) * g.s * dtype_size(t);
      // offload_param: the shard comes from host memory, asynchronously (the host copy is
      // rewritten only by the update, after the gathers of the step are done).
      if (g.off_param && g.owned() && g.host_shard_dtype(mdt_) == t)
        dev_->copy_h2d_async(mine, g.host_shard(), g.owned() * dtype_size(t));
      else offload_.shard_to_device(mine, t, g);
      coll_.all_gather(work, g.s, t);
    } else {  // fp32 model (CPU) under mixed precision: the wire is 16-bit
      device::DeviceBuffer wire(*dev_, W * g.s * dtype_size(t));
      work_.add(static_cast<ptrdiff_t>(wire.bytes()));
      char* w = static_cast<char*>(wire.get());
      offload_.shard_to_device(w + static_cast<size_t>(place_.rank) * g.s * dtype_size(t), t, g);
      coll_.all_gather(w, g.s, t);
      dev_->cast(work, mdt_, w, t, g.n);
      work_.add(-static_cast<ptrdiff_t>(wire.bytes()));
      wire.reset();
    }
    if (g.ready) dev_->event_record(*g.ready, coll_.stream());
  });
}

void ZeroEngine::gather_wait(Slot& s) {
  coll_.wait(s.gather_ticket);
  if (s.ready) dev_->stream_wait(nullptr, *s.ready);
  s.pb->data = s.work.get();
}

void ZeroEngine::gather_release(Slot& s) {
  if (!s.gathered) return;
  coll_.wait(s.gather_ticket);
  if (s.ready) dev_->stream_wait(nullptr, *s.ready);  // freed on the compute stream after the gather
  s.gathered = false;
  s.pb->data = nullptr;
  work_.add(-static_cast<ptrdiff_t>(s.work.bytes()));
  s.work.reset();
  live_elems_ -= s.n;
}

void ZeroEngine::release_all_gathered() {
  for (auto& s : slots_)
    if (s.sharded && s.gathered) gather_release(s);
}

// The hook body for layer `layer` in direction dir (+1 forward, -1 backward): the window
// of layers to hold (zero_prefetch_window), what falls out of it released, the current
// layer's gathers waited for and the layers ahead issued.
void ZeroEngine::stage3_visit(int layer, int dir) {
  const int L = n_layer_;
  auto idx = [](int l) { return static_cast<size_t>(l + 1); };
  std::vector<size_t> sharded_elems(static_cast<size_t>(L) + 2, 0);
  for (int l = -1; l <= L; ++l)
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) sharded_elems[idx(l)] += slots_[i].n;
  const ZeroWindow w =
      zero_prefetch_window(sharded_elems, layer, dir, tied_, opts_.prefetch_bucket_size, opts_.max_live_parameters);
  for (auto& s : slots_)
    if (s.sharded && s.gathered && !w.keep[idx(s.layer)]) gather_release(s);
  std::vector<Slot*> now;
  std::vector<int> current{layer};
  if (layer != -1 && w.keep[idx(-1)]) current.push_back(-1);
  for (int l : current) {
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) {
        gather_issue(slots_[i]);
        now.push_back(&slots_[i]);
      }
  }
  for (int l : w.ahead)
    for (size_t i : layer_slots_[idx(l)])
      if (slots_[i].sharded) gather_issue(slots_[i]);
  for (Slot* s : now) gather_wait(*s);
  if (dir > 0 && layer == L) coll_.wait_all();  // nothing in flight on a thread once forward returns
}

// While materialized every buffer is resident: forward (evaluation) needs no gathering.
void ZeroEngine::on_before_forward(int layer) {
  if (!materialized_) stage3_visit(layer, +1);
}

}  // namespace dtrain::train
