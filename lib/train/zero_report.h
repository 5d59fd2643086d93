// What the ZeRO engine reports about itself: per-rank memory measured against the ZeRO
// theory (ZeroMemory, and the launcher's lines), the time its collectives took and
// exposed, and ZeRO-Offload's schedule of the last step.
#pragma once

#include "device/device.h"
#include "model/model.h"
#include "train/zero_fwd.h"
#include "train/zero_offload.h"

#include <cstddef>
#include <string>
#include <vector>

namespace dtrain::train {

/// Per-rank bytes. Measured = what is resident for training on this rank; theory uses,
/// with Phi = all parameter elements, Psi = trainable elements (adapters under LoRA),
/// Phi_f = Phi - Psi (frozen), W = world size, c = bytes of the model's compute copy
/// (2 for bf16/fp16 on CUDA, 4 on the CPU and in fp32) and K = 12 under mixed precision
/// (fp32 master + m + v), 8 in fp32 (the compute copy is the master):
///   stage 0: param c Phi             grad 4 Psi     optim K Psi
///   stage 1: param c Phi             grad 4 Psi     optim K Psi / W
///   stage 2: param c Phi             grad 4 Psi / W optim K Psi / W
///   stage 3: param c Phi_f / W       grad 4 Psi / W optim K Psi / W
///            (+ 4 Psi / W in param in fp32, where the master shard is the parameter)
/// This is DeepSpeed's 2 Phi + 2 Psi + 12 Psi on CUDA with fp32 gradients (4 Psi: the
/// gradients accumulate in fp32), and at stage 3 without a 16-bit shard of trainable
/// parameters (they are gathered from the fp32 master shard). On the CPU under mixed
/// precision the frozen buffers also keep fp32 masters (optim + 4 Phi_f, sharded as the
/// masters), so the fp32 export stays exact. Stage-3 buffers below the persistence
/// threshold are resident in full and counted so in both. Transient buffers (gradient
/// buckets, stage-2 working layer gradients, stage-3 gathered layers) are reported apart
/// as their peak.
struct ZeroMemory {
  size_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  size_t work_peak_bytes = 0;  ///< peak of the transient buffers
  /// Host memory the engine holds for training (ZeRO-Offload: masters, moments, gradient
  /// shards and their landing and compute-dtype copies), of it pinned, and its theory:
  /// 16 Psi / W (+ 4 Psi / W landing at stages 2-3, + 2 Psi / W compute copy under mixed
  /// precision) and, with offload_param, c Phi_f / W of frozen shards. The device parts
  /// above then lose the optimizer state (K Psi / W), the gradient shard at stages 2-3
  /// and, with offload_param, the sharded parameters.
  size_t host_bytes = 0, host_pinned_bytes = 0, theory_host = 0;
  /// Storage the Model holds (Model::allocated_bytes) beyond what training uses at this
  /// stage: 0, since the engine makes the model release its full gradient arrays
  /// (stages 2-3) and sharded parameter arrays (stage 3); nonzero would be a leak.
  size_t model_idle_bytes = 0;
  size_t theory_param = 0, theory_grad = 0, theory_optim = 0;
  size_t total() const { return param_bytes + grad_bytes + optim_bytes; }
  size_t theory_total() const { return theory_param + theory_grad + theory_optim; }
};

/// The engine's collectives over a span of time: seconds spent in them, and the part the
/// compute thread waited for (exposed); the rest ran overlapped with compute (overlap_comm).
struct ZeroCommTimes {
  double busy_s = 0, exposed_s = 0;
};

class ZeroReport {
 public:
  /// The engine's parts and slots, borrowed for its lifetime.
  ZeroReport(const model::Model& model, const ZeroOptions& opts, const ZeroPlacement& place, ZeroCollectives& coll,
             const ZeroWorkMeter& work, const ZeroOffload& offload, const ZeroWeights& weights,
             const std::vector<ZeroSlot>& slots)
      : model_(model), opts_(opts), place_(place), coll_(coll), work_(work), offload_(offload), weights_(weights),
        slots_(slots) {}

  ZeroMemory memory() const;
  /// A few lines for the launcher: per-rank measured vs theoretical bytes.
  std::string memory_text() const;
  /// The collectives since the last call (which resets the counters).
  ZeroCommTimes comm_times_take();
  /// ZeRO-Offload is active (offload_optimizer on a device model).
  bool offloaded() const { return offload_.on(); }
  /// The last offloaded step's schedule (empty without offload), cleared by before_step():
  /// with offload at stages 2-3, gradient_clipping 0 and no fp16 loss scaling, each
  /// bucket's host AdamW runs as soon as its gradient shard lands, while the device
  /// computes the backward of the buckets after it; otherwise the update waits for the
  /// whole gradient (clipping and the overflow skip need its global norm first).
  std::vector<OffloadTraceEntry> offload_trace() const { return offload_.trace(); }

 private:
  const model::Model& model_;
  const ZeroOptions& opts_;
  const ZeroPlacement& place_;
  ZeroCollectives& coll_;
  const ZeroWorkMeter& work_;
  const ZeroOffload& offload_;
  const ZeroWeights& weights_;
  const std::vector<ZeroSlot>& slots_;
};

}  // namespace dtrain::train
