// ZeRO data-parallel optimizer engine (DeepSpeed stages 0-3) over the model's flat
// per-layer buffers, on the model's device (lib/device: host memory on the CPU, device
// memory on CUDA): bucketed gradient allreduce / reduce-scatter, sharded fp32 masters and
// AdamW state, layer-by-layer gradient sharding (stage 2) and just-in-time parameter
// gathering with prefetch (stage 3). Collectives overlap with compute on a communication
// thread (Gloo, overlap_comm) or on the communicator's own CUDA stream (NCCL), ordered
// against the compute stream with events.
#pragma once

#include "comm/groups.h"
#include "config/train_config.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "model/model.h"
#include "ops/optim.h"
#include "train/zero_checkpoint_view.h"
#include "train/zero_comm.h"
#include "train/zero_compression.h"
#include "train/zero_gather.h"
#include "train/zero_grads.h"
#include "train/zero_layout.h"
#include "train/zero_offload.h"
#include "train/zero_report.h"
#include "train/zero_step_buffer.h"
#include "train/zero_step_state.h"
#include "train/zero_weights.h"

#include <cstddef>
#include <cstdint>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dtrain::train {

class ZeroCommQueue;
struct ZeroSlot;
struct ZeroBucket;

/// The engine's knobs (zero_optimization keys; sizes in elements, as DeepSpeed's).
struct ZeroOptions {
  int stage = 0;                             ///< 0, 1, 2 or 3
  size_t reduce_bucket_size = 500000000;     ///< elements per gradient collective
  size_t allgather_bucket_size = 500000000;  ///< elements per post-step parameter all-gather
  bool overlap_comm = false;                 ///< run collectives on a communication thread
  /// Keep a communicator of size 1 (its buckets, streams and events) instead of running as
  /// a lone rank without one: the GPU check's NCCL path on one card (TrainerEnv).
  bool single_rank_comm = false;
  size_t prefetch_bucket_size = 50000000;       ///< stage 3: elements gathered ahead of use
  size_t param_persistence_threshold = 100000;  ///< stage 3: buffers below it stay resident
  size_t max_live_parameters = 1000000000;      ///< stage 3: cap on gathered elements (prefetch stops)
  ops::AdamWConfig adamw;
  /// F32, or BF16/F16 mixed precision: fp32 masters; the model's buffers hold the
  /// masters rounded to this dtype (stored in it on CUDA, as fp32 values on the CPU);
  /// parameter all-gathers travel in it.
  DType compute_dtype = DType::F32;
  float gradient_clipping = 0.0f;  ///< max global L2 norm, 0 = off
  /// communication.compression's 16-bit wire: the dtype gradients are reduced in (F32 =
  /// uncompressed; BF16 / F16: cast, summed, cast back; fp16 divided by the world size
  /// first, as PyTorch's fp16_compress_hook, so the sum cannot overflow).
  DType grad_wire = DType::F32;
  /// communication.compression topk (stages 0-1, several ranks, the CPU device): the
  /// fraction of each gradient bucket's elements a rank sends, the largest in magnitude
  /// of gradient + residual, all-gathered as (value, index) pairs and summed densely; the
  /// residual keeps the rest for the next step (error feedback). 0 = off. A double, as
  /// the config's key: k = ceil(ratio n) is at least 1 for any positive ratio, where a
  /// float would round a ratio under 1.4e-45 to 0, which is "off".
  double topk_ratio = 0.0;
  /// communication.compression powersgd (stages 0-1, several ranks, the CPU device):
  /// the approximation rank (0 = off), the applied steps reduced uncompressed first, and
  /// error feedback (PyTorch's powerSGD_hook, Vogels et al. 2019).
  int powersgd_rank = 0;
  int64_t powersgd_start_step = 0;
  bool powersgd_error_feedback = true;
  /// ZeRO-Offload (zero_optimization.offload_optimizer / offload_param, device cpu), for a
  /// model on a GPU (a CPU model holds everything in host memory already: no-ops there).
  /// offload_optimizer (stages 1-3): the fp32 masters, AdamW's moments and the reduced
  /// gradient shard of every trainable buffer live in host memory (pinned with
  /// offload_pin_memory), AdamW runs on the host (the CPU device's threads) and the
  /// updated shard goes back in the compute dtype. offload_param (stage 3, with
  /// offload_optimizer): the compute-dtype shards of the sharded buffers live in host
  /// memory too and are copied in by each layer's gather.
  bool offload_optimizer = false;
  bool offload_param = false;
  bool offload_pin_memory = false;
  bool offload_param_pin_memory = false;
};

/// The engine options a training config asks for: zero_optimization (stage, bucket
/// sizes, overlap_comm, stage3_*), optimizer (AdamW), bf16/fp16 (compute dtype) and
/// gradient_clipping. ConfigError for a negative size or an unknown stage.
ZeroOptions zero_options_from(const config::TrainConfig& cfg);

/// What a checkpoint needs of one buffer, in host memory (on a device the engine stages
/// its state on the host when the view is made and takes it back in `loaded`): its shard
/// [lo, hi) of the master weights and (trainable buffers) AdamW's m and v, plus the full
/// fp32 values when resident.
struct ZeroBufferView {
  const model::ParamBuffer* buffer = nullptr;
  bool trainable = false;
  /// True when the model holds the full buffer (stages 0-2, stage-3 persistent buffers).
  bool resident = false;
  size_t lo = 0, hi = 0;    ///< owned element range (stage 0: the whole buffer)
  float* master = nullptr;  ///< hi - lo fp32 master values
  float* m = nullptr;       ///< hi - lo (trainable only)
  float* v = nullptr;
  /// buffer->size fp32 values of a resident buffer, written by a checkpoint load (the
  /// engine derives its master and compute copy from them in `loaded`).
  float* full = nullptr;
};

/// What a checkpoint reads and writes of an engine: its buffers' views, its AdamW step
/// and where it runs. Checkpoints take this, not the engine (train/checkpoint.h).
struct ZeroCheckpointView {
  std::vector<ZeroBufferView> buffers;  ///< base buffers first, then adapters
  comm::Communicator* comm = nullptr;   ///< the data-parallel group; nullptr for a single rank
  /// Every rank of the job (comm::ProcessGroups::world), when it may hold more ranks than
  /// comm: then several data-parallel groups write one checkpoint, each its own shards.
  /// nullptr (or comm itself): the data-parallel group is the job.
  comm::Communicator* world_comm = nullptr;
  int rank = 0, world = 1, stage = 0;  ///< rank and world: in the data-parallel group
  DType compute_dtype = DType::F32;
  int64_t step_count = 0;  ///< applied updates (AdamW's bias-correction step)
  /// This rank's error-feedback state (top-k: one residual per gradient bucket), fp32 in
  /// host memory, each with its length: saved in the rank's own shard file and restored
  /// into the same rank when the world size and the lengths match; otherwise (another
  /// world size, compression turned on at resume) it starts at zero, with a warning.
  std::vector<std::pair<float*, size_t>> rank_state;
  /// After a checkpoint wrote the masters (and resident full buffers): takes the loaded
  /// step count and refreshes the compute copies.
  std::function<void(int64_t step_count)> loaded;
};

/// The engine. Call order per optimizer step (one thread; train::TrainStep is the caller
/// that training and `dtrain bench train` use):
///   engine.step_prepare(lr);                    // the step's host values to the device
///   engine.before_step();                       // zeroes the gradients it owns
///   for each micro-batch: engine.set_last_micro_batch(is_last);  // overlap_comm, stages 0/1
///                         model.forward(...); model.backward(scale);
///   engine.step_issue(loss_scale);              // reduce, overflow check, clip, AdamW, gather
///   bool applied = engine.step_finish(loss_scale);  // the one read-back
///   engine.last_step();                         // its loss, target count and gradient norm
/// The constructor installs the model hooks (stages 2/3 reduce-scatter and gather in
/// them; every stage rounds fp16 gradients there) and, under mixed precision, rounds the
/// model's buffers to the compute dtype. Between forward()/backward() calls no engine
/// collective is in flight, so the caller may use the communicator itself. Gradients
/// must only be read through the engine: at stages 2/3 the model's grad pointers are
/// null outside backward. At stage 3 the model's data pointers are null for sharded
/// buffers outside their use; call weights().materialize() before reading the weights
/// (export, tests). Every rank must make the same calls; in particular at stages 2/3
/// backward (and at stage 3 forward) runs collectives, so every rank runs the same
/// number of forward/backward calls per step (a rank with nothing to learn runs them
/// with grad_scale 0), and an evaluation whose forward count differs between ranks
/// runs between weights().materialize() and weights().restore() (no gathering then).
///
/// Construction: comm == nullptr or of size 1 is a single rank; the groups constructor
/// takes groups.data_parallel, the ranks that shard this model and average its gradients
/// (the communicator constructor: the world is that group). The engine's state lives on
/// the model's device; with several ranks a CUDA model needs a communicator on that
/// device (NCCL) and a CPU model one on the host (Gloo), else UsageError. A model whose
/// compute copy is 16-bit (on CUDA) must be given fp32_source, a host fp32 model with the
/// same buffers holding the exact weights the fp32 masters start from. ConfigError for a
/// bad stage/dtype. `deferred`, for a model built with deferred storage
/// (model::Model::Deferred: every base buffer released, no gradient array), gives the
/// fp32 values of each base buffer: the engine takes one buffer at a time into a host
/// staging copy, keeps this rank's shard of a sharded buffer (stage 3) as its master and
/// gives the model storage only for the buffers it keeps resident, so no full copy of a
/// sharded model exists on any rank; the fp32 values also serve as fp32_source. A
/// deferred engine leaves the sharded buffers released when it is destroyed (the model is
/// then only good for destruction or a new deferred engine).
///
/// Storage: at stages 2-3 the constructor makes the model free its full gradient
/// arrays, and at stage 3 the parameter arrays of every sharded buffer (those at or
/// above param_persistence_threshold), through Model::storage_release; the hooks point
/// the model's ParamBuffer data/grad at the engine's working buffers (stage-2/3 layer
/// gradients, stage-3 gathered layers) while a layer runs and null them after.
/// weights().materialize() re-allocates the sharded parameter arrays (full fp32 weights),
/// weights().restore() frees them again. The destructor re-allocates everything: the
/// model is whole and usable without an engine; at stage 3 it holds the full trained
/// weights only if the engine was materialized (otherwise this rank's master shard,
/// zeros elsewhere: no collective runs in a destructor). The model must own all its
/// storage when the engine is created (UsageError otherwise).
class ZeroEngine {
 public:
  /// A single rank or the world's ranks (see Construction above).
  ZeroEngine(model::Model& model, comm::Communicator* comm, const ZeroOptions& opts,
             const model::Model* fp32_source = nullptr, const model::BufferFill& deferred = {});
  /// The ranks of groups.data_parallel.
  ZeroEngine(model::Model& model, const comm::ProcessGroups& groups, const ZeroOptions& opts,
             const model::Model* fp32_source = nullptr, const model::BufferFill& deferred = {});
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  /// Zeroes the gradients for a new optimizer step (replaces model.zero_grad()).
  void before_step();
  /// (Re)installs the model hooks; the constructor already did. Needed only after the
  /// caller replaced them.
  void backward_hooks_install();
  /// The update, in three calls so that a caller can record the step in a CUDA graph:
  /// step_prepare uploads the step's host values (lr, AdamW's step) to device memory (on
  /// CUDA it waits for the stream: call it before the step's forward, after loss_slots);
  /// step_issue issues the reduction, norm, clip and overflow decision, AdamW and the
  /// gathers without reading anything back (nothing in it waits for the device): the
  /// gradients are reduced, the overflow agreed over all ranks, clipped by the global norm
  /// and AdamW applied with the lr unless a gradient is inf/NaN (the gradients hold
  /// loss_scale * the true gradient); step_finish reads back once and returns true when
  /// the update was applied, false (weights untouched, step count unchanged) on overflow.
  void step_prepare(float lr);
  void step_issue(float loss_scale);
  bool step_finish(float loss_scale);
  /// What the last step_finish() read back, and the counts across steps.
  const ZeroStepResults& last_step() const { return step_.results; }
  /// The step's unmasked-target counts, one per loss slot (after loss_slots, before the
  /// step; an upload like step_prepare's): step_issue then sums the slots' mean loss times
  /// these counts on the device (and over the ranks), read back with the gradient norm
  /// as last_step().loss_sum; their total, summed over the ranks on the device by
  /// targets_reduce(), is last_step().target_count after step_finish and, in device
  /// memory, targets_count() for Model::backward (issue targets_reduce first, every rank).
  void step_targets(const int64_t* counts, size_t n);
  void targets_reduce();
  const float* targets_count() const;
  /// n fp32 slots in the engine's step buffer (device memory) for the micro-batch losses
  /// of the next step (Model::forward's loss_out), read back by step_finish() together with the
  /// gradient norm: one device-to-host read per step. The pointer stays valid while n
  /// does not grow (a growing n reallocates the step buffer: call before step_prepare).
  float* loss_slots(size_t n);
  /// overlap_comm at stages 0/1: the gradients are reduced once per step, during the
  /// backward of the micro-batch marked last (each bucket as soon as it is complete), so
  /// with gradient accumulation mark the earlier micro-batches with false before their
  /// backward, and every rank must run the same micro-batches. Default true (one
  /// backward per step). Without a communication thread the reduction runs in step_issue().
  void set_last_micro_batch(bool last) { step_.last_micro = last; }

  int stage() const { return opts_.stage; }
  int rank() const { return place_.rank; }
  int world_size() const { return place_.world; }
  /// The communicator (nullptr for a single rank). Free for the caller's own
  /// collectives between forward()/backward() calls (see the call order above).
  comm::Communicator* communicator() const { return coll_.comm(); }
  const ZeroOptions& options() const { return opts_; }
  model::Model& model() { return model_; }

  /// Everything a checkpoint needs of the engine (buffer views, step, placement).
  ZeroCheckpointView checkpoint_view();
  /// The full weights: materialized into the model and restored, or copied to a host model.
  ZeroWeights& weights() { return weights_; }
  /// Memory (measured and in theory), collective times and the offload schedule.
  ZeroReport& report() { return report_; }
  const ZeroReport& report() const { return report_; }

 private:
  using Slot = ZeroSlot;
  using Bucket = ZeroBucket;

  // Construction, in this order (zero_engine.cpp).
  void options_check();
  void sources_check(const model::Model* fp32_source);
  void slots_build(const model::Model* fp32_source, const model::BufferFill& deferred);
  void slot_state_init(Slot& s, size_t index, const float* fp32);
  void buckets_plan();
  void storage_hand_over();
  // The step (zero_step.cpp).
  void step_decide(float loss_scale);
  void adamw_issue();
  float* grad_shard(Slot& s);  // the reduced gradient of the owned range
  // Per-layer hooks (zero_hooks.cpp): stage 0/1 overlapped buckets, stage 2/3 gradient
  // buckets, stage 3 gathers (gather_).
  void hooks_install();
  void on_before_backward(int layer);
  void on_after_backward(int layer);
  void on_before_forward(int layer);

  model::Model& model_;
  device::Device* dev_;
  ZeroOptions opts_;
  DType mdt_ = DType::F32;  // the model's storage dtype (16-bit only on CUDA)
  bool mixed_ = false;      // compute dtype != F32
  ZeroPlacement place_;     // stage, this rank and the data-parallel group's size
  // groups.world: every rank of the job, over which a checkpoint of several groups agrees
  comm::Communicator* job_comm_ = nullptr;
  ZeroCollectives coll_;
  ZeroWorkMeter work_;
  bool tied_ = false;
  int n_layer_ = 0;
  std::vector<Slot> slots_;                       // one per model buffer: base buffers, then adapters
  std::vector<std::vector<size_t>> layer_slots_;  // [layer + 1] -> slot indices
  std::vector<Bucket> buckets_;                   // gradient buckets in backward order
  std::vector<size_t> sharded_;  // stage 3: slots (= model buffer indices) whose parameters are sharded
  bool deferred_ = false;        // built from a deferred model: never restore its full storage
  ZeroCompression compress_;
  ZeroOffload offload_;        // where the optimizer state lives; ZeRO-Offload
  ZeroGather gather_;          // stage 3's gathers, the post-step all-gathers
  ZeroGradBuckets grads_;      // the gradient buckets' reductions
  ZeroCheckpointStage views_;  // the checkpoint views
  ZeroWeights weights_;        // the full weights for callers (materialize / restore)
  ZeroReport report_;          // memory, collective times, the offload schedule
  ZeroStepBuffer step_buf_;    // the step's values in device memory, read back once
  ZeroStepState step_;         // the step's host side: its results and flags
};

}  // namespace dtrain::train
