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
  DT_ENFORCE(!weights_.materialized(), UsageError,
             "backward() after ZeroEngine::weights().materialize(); call weights().restore() first");
  DT_ENFORCE(!step_.grads_reduced, UsageError,
             "backward() after the step's last micro-batch already reduced the gradients (overlap_comm); call "
             "ZeroEngine::before_step() first, or set_last_micro_batch(false) for the earlier micro-batches");
  if (opts_.stage == 3) gather_.visit(layer, -1);
  if (opts_.stage < 2) return;
  for (size_t i : layer_slots_[static_cast<size_t>(layer + 1)]) grads_.attach(slots_[i]);
  // The tied head writes the embeddings' gradient too.
  if (layer == n_layer_ && tied_)
    for (size_t i : layer_slots_[0]) grads_.attach(slots_[i]);
}

void ZeroEngine::on_after_backward(int layer) {
  for (size_t i : layer_slots_[static_cast<size_t>(layer + 1)]) {
    Slot& s = slots_[i];
    if (!s.trainable) continue;
    if (opts_.compute_dtype == DType::F16) dev_->round_to(s.pb->grad, s.n, DType::F16);
    // Counted when issued before the last layer: it overlaps with the rest of the backward.
    const ZeroGradBuckets::Landing landing{offload_.eager() && step_.last_micro, step_.lr, step_.next_step()};
    if (opts_.stage >= 2 && grads_.pack(s, landing) && (coll_.threaded() || coll_.stream_ordered()) && layer > -1)
      ++step_.results.comm_issued_in_backward;
  }
  // Stages 0/1 reduce once per step: with a communication thread or stream, during the
  // last micro-batch's backward, each bucket as soon as its gradients are complete (the
  // same buckets in the same order as the step-time path, so the results are identical).
  const bool overlapped = coll_.threaded() || (coll_.stream_ordered() && opts_.overlap_comm);
  if (opts_.stage <= 1 && overlapped && step_.last_micro && coll_.comm() != nullptr) {
    for (size_t bi = 0; bi < buckets_.size(); ++bi)
      if (buckets_[bi].done_layer == layer) {
        grads_.reduce_async(bi, step_.results.step_count);
        if (layer > -1) ++step_.results.comm_issued_in_backward;
      }
    if (layer == -1) step_.grads_reduced = true;
  }
  if (opts_.stage == 3) {
    for (size_t i : layer_slots_[static_cast<size_t>(layer + 1)])
      if (slots_[i].sharded) gather_.release(slots_[i]);
  }
  if (layer == -1) {
    if (opts_.stage == 3) gather_.release_all();
    coll_.wait_all();  // nothing in flight on a thread once backward returns
    // The offloaded update started during this backward: no further micro-batch.
    if (offload_.eager() && step_.last_micro) step_.grads_reduced = true;
  }
  if (offload_.on()) {
    const double t = offload_.now();
    offload_.trace_add("backward", layer, t, t);
  }
}

// While materialized every buffer is resident: forward (evaluation) needs no gathering.
void ZeroEngine::on_before_forward(int layer) {
  if (!weights_.materialized()) gather_.visit(layer, +1);
}

}  // namespace dtrain::train
