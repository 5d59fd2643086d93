// TrainStep: the optimizer step of the trainer and of `dtrain bench train` (eager, or
// recorded in a CUDA graph and replayed), and the device copy of a host model.
#include "train/train_step.h"

#include "core/check.h"
#include "core/log.h"

#include <cmath>

namespace dtrain::train {

TrainStep::TrainStep(model::Model& model, const model::Model* fp32_source, comm::Communicator* comm,
                     const ZeroOptions& zero, const TrainStepOptions& opts)
    : m_(model), comm_(comm), opts_(opts),
      engine_(model, comm::ProcessGroups::world_only(comm), zero, fp32_source, opts.deferred_weights),
      lockstep_(zero.stage >= 2 || zero.overlap_comm) {
  DT_ENFORCE(opts.micro_batch > 0 && opts.grad_accum > 0 && opts.seq_len > 0, UsageError,
             "TrainStep: micro-batch {}, accumulation {} and sequence length {} must be positive", opts.micro_batch,
             opts.grad_accum, opts.seq_len);
  if (opts.loss_scaler) scaler_ = std::make_unique<LossScaler>(*opts.loss_scaler);
  DT_ENFORCE(!opts.preference || opts.micro_batch % 2 == 0, UsageError,
             "TrainStep: a preference micro-batch holds pairs: {} rows is odd", opts.micro_batch);
  // What a graph can replay: one micro-batch per step (its inputs uploaded before the
  // launch), no collective inside forward/backward hooks beyond stage 1's stream-ordered
  // buckets, no dropout (its masks are seeded per forward).
  graph_on_ = opts.cuda_graph && !opts.preference && model.device().kind() == device::Kind::CUDA &&
              opts.grad_accum == 1 && zero.stage <= 1 && !(model.lora_config().dropout > 0.0f) &&
              !(zero.offload_optimizer && !model.on_host());
}

StepOutcome TrainStep::run(int64_t step, float lr, const StepBatch& b, StepTimer& timer) {
  DT_ENFORCE(b.inputs && b.targets && b.counts && b.inputs->size() == static_cast<size_t>(opts_.grad_accum) &&
                 b.targets->size() == b.inputs->size() && b.counts->size() == b.inputs->size(),
             UsageError, "TrainStep::run: the batch must hold {} micro-batches", opts_.grad_accum);
  StepOutcome out;
  out.lr = lr;
  out.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  // Each micro-batch's backward: loss_scale * W * (its loss sum) / (the step's target
  // count over every rank, read on the device); W undoes the ranks' gradient average.
  const float factor = static_cast<float>(engine_.world_size()) * out.loss_scale;
  PrefStats pref;
  if (opts_.preference) pref = issue_preference(factor, out.loss_scale, lr, b, timer);
  else issue(factor, out.loss_scale, lr, b, timer);
  {
    // The update is issued; the step's one read-back: gradient norm, overflow, the loss
    // sum and the target count over every rank. Collectives and the update interleave
    // inside the engine: timed as one section.
    auto s = timer.scope(Section::OPTIMIZER);
    out.overflow = !engine_.step_finish(out.loss_scale);
  }
  const ZeroStepResults& last = engine_.last_step();
  out.grad_norm = last.grad_norm;
  out.target_count = last.target_count;
  // A step whose every target is masked (possible with short packed windows of SFT data)
  // has loss 0 and zero gradients, as Model::forward defines it; AdamW still runs.
  out.loss = out.target_count > 0 ? last.loss_sum / out.target_count : 0.0;
  DT_ENFORCE(std::isfinite(out.loss), TrainError, "step {}: the loss is {}; lower optimizer.lr", step, out.loss);
  if (out.overflow)
    DT_ENFORCE(scaler_ != nullptr, TrainError,
               "gradients became inf/NaN (global norm {}); lower optimizer.lr or enable gradient_clipping",
               out.grad_norm);
  out.applied = scaler_ ? scaler_->update(out.overflow) : true;
  if (opts_.preference) {
    // The rewards of every rank's pairs: one small host reduction per step.
    std::vector<double> v{pref.chosen_reward, pref.rejected_reward, pref.accuracy, pref.margin,
                          pref.chosen_logp,   pref.rejected_logp,   pref.pairs};
    comm::allreduce_sum_host(comm_, v);
    PrefStats all;
    all.chosen_reward = v[0];
    all.rejected_reward = v[1];
    all.accuracy = v[2];
    all.margin = v[3];
    all.chosen_logp = v[4];
    all.rejected_logp = v[5];
    all.pairs = v[6];
    out.metrics = all.means();
  }
  return out;
}

// A preference step: per micro-batch, the reference sums (a forward of the base model with
// the adapters off, or the precomputed ones), the policy's forward, the objective on the
// host from the rows' log-probability sums, and a backward weighted per row. Each
// micro-batch's mean pair loss goes to its loss slot with its pair count, so the step's
// loss is the mean pair loss over every rank like the SFT step's mean token loss.
PrefStats TrainStep::issue_preference(float factor, float loss_scale, float lr, const StepBatch& b, StepTimer& timer) {
  const PrefOptions& po = *opts_.preference;
  const int accum = opts_.grad_accum, rows = opts_.micro_batch, T = opts_.seq_len, P = rows / 2;
  DT_ENFORCE(po.reference != PrefReference::PRECOMPUTED ||
                 (b.ref_logps != nullptr && b.ref_logps->size() == static_cast<size_t>(accum)),
             UsageError, "TrainStep: a precomputed reference needs the reference sums of each micro-batch");
  float* slots = engine_.loss_slots(static_cast<size_t>(accum));
  engine_.step_prepare(lr);
  const std::vector<int64_t> pairs(static_cast<size_t>(accum), P);
  engine_.step_targets(pairs.data(), pairs.size());
  engine_.before_step();
  engine_.targets_reduce();
  const double total_pairs = static_cast<double>(P) * accum * engine_.world_size();
  PrefStats stats;
  static const std::vector<double> kNone;
  for (int a = 0; a < accum; ++a) {
    const auto i = static_cast<size_t>(a);
    engine_.set_last_micro_batch(a == accum - 1);
    // Each pair's gradient weighs 1 / (the step's pairs over every rank); factor undoes the
    // ranks' average and carries the loss scale.
    const PrefResult r = pref_micro_batch(m_, (*b.inputs)[i].data(), (*b.targets)[i].data(), rows, T, po,
                                          b.ref_logps ? (*b.ref_logps)[i] : kNone, factor / total_pairs, &timer);
    const float mean = static_cast<float>(r.loss_sum / P);
    m_.device().copy_h2d(slots + a, &mean, sizeof mean);
    stats.add(r.stats);
  }
  auto s = timer.scope(Section::OPTIMIZER);
  engine_.step_issue(loss_scale);
  return stats;
}

// Issues the step's forward and backward passes and the update; nothing is read back
// (each micro-batch's mean loss goes to a loss slot of the engine, read with the gradient
// norm in step_finish).
void TrainStep::issue(float factor, float loss_scale, float lr, const StepBatch& b, StepTimer& timer) {
  const int accum = opts_.grad_accum;
  float* slots = engine_.loss_slots(static_cast<size_t>(accum));
  engine_.step_prepare(lr);  // the step's host values, uploaded while the device is idle
  engine_.step_targets(b.counts->data(), b.counts->size());
  if (graph_on_) {
    issue_graphed(factor, loss_scale, b, slots, timer);
    return;
  }
  engine_.before_step();
  engine_.targets_reduce();
  for (int a = 0; a < accum; ++a) {
    const auto i = static_cast<size_t>(a);
    if ((*b.counts)[i] == 0 && !lockstep_) continue;  // nothing to learn from: no forward, no gradient
    {
      auto s = timer.scope(Section::FORWARD);
      m_.backward_fuse(factor, engine_.targets_count());  // the loss pass writes dlogits too
      m_.forward((*b.inputs)[i].data(), (*b.targets)[i].data(), opts_.micro_batch, opts_.seq_len, slots + a,
                 b.doc_start(i));
    }
    auto s = timer.scope(Section::BACKWARD);
    engine_.set_last_micro_batch(a == accum - 1);
    m_.backward(factor, engine_.targets_count());  // fp16 gradients are rounded in the engine's hooks
  }
  auto s = timer.scope(Section::OPTIMIZER);
  engine_.step_issue(loss_scale);
}

// One micro-batch per step: its inputs go to the model's fixed buffers first, then the
// step runs eagerly, is recorded (the second step in a row with the same key) or is
// replayed (the key of the recording).
void TrainStep::issue_graphed(float factor, float loss_scale, const StepBatch& b, float* slot, StepTimer& timer) {
  device::Device& dev = m_.device();
  GraphKey key;
  key.run = (*b.counts)[0] > 0 || lockstep_;
  {
    auto s = timer.scope(Section::FORWARD);
    if (key.run)
      m_.inputs_set((*b.inputs)[0].data(), (*b.targets)[0].data(), opts_.micro_batch, opts_.seq_len, b.doc_start(0));
  }
  // The target counts are in device memory (step_targets): the recording does not
  // bake the step's backward scale in.
  key.loss_scale = loss_scale;
  key.buffers = m_.buffers_version();
  key.documents = b.doc_start(0) != nullptr;
  auto body = [&] {
    engine_.before_step();
    engine_.targets_reduce();
    if (key.run) {
      m_.backward_fuse(factor, engine_.targets_count());
      m_.forward_issue(slot);
      engine_.set_last_micro_batch(true);
      m_.backward(factor, engine_.targets_count());
    }
    engine_.step_issue(loss_scale);
  };
  auto s = timer.scope(Section::FORWARD);
  if (graph_ && graph_key_ == key) {
    dev.graph_launch(*graph_);
    if (key.run) m_.set_forward_count(m_.forward_count() + 1);  // as the recorded forward did
    ++graph_steps_;
  } else if (last_key_ == key) {
    graph_.reset();
    const uint64_t forward_count = m_.forward_count();
    if (!dev.graph_begin()) {
      graph_on_ = false;
      body();
      return;
    }
    try {
      body();
    } catch (...) {
      (void)dev.graph_end();
      throw;
    }
    graph_ = dev.graph_end();
    if (graph_) {
      graph_key_ = key;
      dev.graph_launch(*graph_);
      ++graph_steps_;
    } else {
      // Something in the step could not be recorded (and nothing of it ran): run it
      // eagerly, from here on always.
      if (engine_.rank() == 0)
        log_warn("training.cuda_graph: the step could not be captured in a CUDA graph; running without");
      graph_on_ = false;
      graph_key_.reset();
      m_.set_forward_count(forward_count);
      body();
    }
  } else {
    body();
  }
  last_key_ = key;
}

std::unique_ptr<model::Model> model_on_device(const model::Model& host, device::Device& dev, DType dtype) {
  auto m = std::make_unique<model::Model>(host.config(), dev, dtype);
  m->weights_copy_from(host);
  m->set_recompute_layers(host.recompute_layers());
  return m;
}

}  // namespace dtrain::train
