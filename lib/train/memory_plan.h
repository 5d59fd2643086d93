// What one rank of a training job will hold, host and device, before anything is
// allocated: the parameter, gradient and optimizer bytes of its ZeRO stage (DeepSpeed's
// formulas, as ZeroEngine's theory), one micro-batch's activations, the step's token ids,
// and the transient peak of building the model. `dtrain launch --dry-run` prints it, and a
// job whose ranks on this machine cannot fit in its memory is refused with the numbers.
#pragma once

#include "config/train_config.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace dtrain::train {

struct MemoryPlan {
  int world = 1, stage = 0;
  bool cuda = false;   ///< training.device cuda: the weights train in device memory
  bool mixed = false;  ///< bf16 / fp16
  bool lora = false;
  bool deferred = false;  ///< built buffer by buffer (stage 3 on the CPU, every stage on a GPU)
  /// ZeRO-Offload on a GPU rank (offload_optimizer; offload_param at stage 3): the state
  /// that moves to host memory is offload_bytes, of it pinned_bytes page-locked.
  bool offload_optimizer = false, offload_param = false;
  double offload_bytes = 0, pinned_bytes = 0;
  double params = 0;          ///< all parameter elements (Phi)
  double trainable = 0;       ///< elements the optimizer updates (Psi: the adapters under LoRA)
  double largest_buffer = 0;  ///< elements of the largest per-layer buffer (embeddings, a layer, head)
  // Per rank, bytes: the training state where it lives (the device on CUDA, else the host).
  double param_bytes = 0, grad_bytes = 0, optim_bytes = 0, activation_bytes = 0;
  double batch_bytes = 0;       ///< the step's token ids and targets (host)
  double build_peak_bytes = 0;  ///< transient while the model is built (beyond the state above)
  /// The step's working buffers, as the engine allocates them and the device allocator
  /// keeps them for reuse (train/memory_plan.cpp simulates the step's schedule): stage 3's
  /// gathered layers (the one computing and the prefetch window) and stages 1-3's
  /// all-gather of the resident trainable buffers after the update (gather_bytes: the
  /// larger), stages 2-3's gradient of
  /// the layer in backward and the gradient bucket being filled, stages 0-1's bucket
  /// scratch. `work_bytes` is what the allocator holds at most (each size's most blocks in
  /// use at once), `work_live_bytes` the most in use at one moment.
  double gather_bytes = 0, layer_grad_bytes = 0, bucket_bytes = 0;
  double work_bytes = 0, work_live_bytes = 0;
  int n_layer = 0;
  int recompute_layers = 0;  ///< layers recomputed in backward (recompute_layers_of)
  double comm_bytes = 0;     ///< the collectives' own buffers (Gloo's reduce-scatter pieces)
  double runtime_bytes = 0;  ///< a CPU rank's program, libraries, thread buffers and allocator slack (memory_plan.cpp)
  double state_bytes() const { return param_bytes + grad_bytes + optim_bytes + activation_bytes; }
  /// Host bytes of one rank at its peak (building or training): an upper bound.
  double host_bytes() const {
    return (cuda ? offload_bytes
                 : state_bytes() + std::max(work_bytes, build_peak_bytes) + comm_bytes + runtime_bytes) +
           batch_bytes + (cuda ? build_peak_bytes : 0.0);
  }
  /// Device bytes of one rank (0 on the CPU).
  /// (CUDA's stream-ordered pool hands a freed block out again for any size that fits, so
  /// the working buffers count at their most in use at once there.)
  double device_bytes() const { return cuda ? state_bytes() + work_live_bytes : 0.0; }
};

/// The plan for cfg (its batch resolved) on `world` ranks; the model's shape from the
/// model section or model.init_from's config.json. ConfigError as model_config_from.
MemoryPlan memory_plan(const config::TrainConfig& cfg, int world);

/// How many layers recompute, and why (for --dry-run and rank 0's log).
struct RecomputeChoice {
  int layers = 0, n_layer = 0;
  bool planned = false;  ///< chosen by the plan (activation_checkpointing left to it)
  std::string why;
};

/// cfg (its batch resolved) with activation_checkpointing.layers set. When the config
/// leaves recompute to the plan, the fewest layers whose plan fits `capacity_bytes` per rank
/// (a GPU rank's device bytes against its GPU, a CPU rank's host bytes against its share of
/// the node's memory) after a reserve (5 %, and 1 GiB on a GPU for the CUDA context,
/// cuBLASLt's workspace and NCCL): none when everything fits or the capacity is unknown (0),
/// every layer when even that does not fit (the memory check then refuses the job). Given
/// keys are kept. Recompute changes no result (the gradients are bit-identical), so ranks
/// may choose differently.
config::TrainConfig recompute_resolve(config::TrainConfig cfg, int world, double capacity_bytes,
                                      RecomputeChoice* choice = nullptr);

/// The dry run's lines: per rank host and device bytes with their parts, then per node
/// (`ranks_here` ranks on this machine, of `memory_bytes`; 0 = unknown) the total, and
/// against `gpu_bytes` (each GPU's memory; 0 = unknown) whether a GPU rank fits. A plan
/// for another cluster (--plan-for) gives `ranks_per_node`: the host total of such a node.
std::string memory_plan_text(const MemoryPlan& p, int ranks_here, double memory_bytes, double gpu_bytes = 0,
                             int ranks_per_node = 0);

/// ConfigError with the numbers when `ranks_here` ranks of this plan need more host memory
/// than memory_bytes (this machine's), or a GPU rank more than gpu_bytes (0 = unknown),
/// saying which stage / offload / world size would fit.
void memory_plan_check(const MemoryPlan& p, int ranks_here, double memory_bytes, const std::string& source,
                       double gpu_bytes = 0);

}  // namespace dtrain::train
