// ModelActivations: the activation side of a Model (model.h): one arena per (B, T) holding
// the layer inputs, each layer's saved activations (or the set the recomputed layers
// share) and the backward scratch; what the last forward left for backward; the switches
// that shape the next pass (recomputation, fused projections, training mode, adapters on
// or off, the forward count); and the read-backs of logits and losses.
#pragma once

#include "model/model_params.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace dtrain::model {

/// Whether layer l of n_layer is one of `layers` recomputed in backward: spread evenly over
/// the depth (2 of 4: layers 1 and 3; all when layers == n_layer, none when 0).
inline bool recompute_layer_at(int l, int layers, int n_layer) {
  return layers > 0 && (static_cast<int64_t>(l + 1) * layers) / n_layer != (static_cast<int64_t>(l) * layers) / n_layer;
}

// A logits' gradient written by the loss's own pass (Model::backward_fuse): whether, and
// for which backward(grad_scale, count).
struct LossGrad {
  bool on = false;
  float grad_scale = 1.0f;
  const float* count = nullptr;
};

class ModelActivations : public ModelParams {
 public:
  /// Logits [B, T, vocab] of the last forward (valid until backward()), host fp32.
  /// UsageError on a device model.
  const float* logits() const;
  /// Logits [B, T, vocab] of the last forward (valid until backward()) copied to host fp32,
  /// on any device: a device model's padded rows are dropped and bf16/fp16 values widened.
  /// Waits for the device. For parity checks against other implementations, not the step.
  std::vector<float> logits_to_host() const;
  /// Per-position losses [B, T] of the last forward with targets (0 where masked), host.
  /// UsageError on a device model.
  const float* losses() const;
  /// The last forward's per-position losses [B, T] (-log p(target), 0 where masked) copied
  /// to host fp32 on any device (waits for the device): the targets' log-probabilities,
  /// negated, for an objective computed on the host.
  std::vector<float> token_losses_to_host() const;
  /// Unmasked target count of the last forward.
  int num_targets() const { return num_targets_; }
  /// Whether the last inputs came with document starts.
  bool inputs_documents() const { return docs_; }
  /// Changes whenever the model reallocates its activations or scratch (a new (B, T)):
  /// work recorded against the old buffers (a CUDA graph) must not be replayed.
  uint64_t buffers_version() const { return buffers_version_; }
  /// Bytes of the activation arena for the last forward's (B, T) (0 before the first).
  size_t activation_bytes() const { return arena_.bytes(); }

  /// Keep only each layer's input in forward and recompute the layer before its backward.
  /// Gradients are bit-identical to the non-recompute path.
  void set_recompute(bool on) { set_recompute_layers(on ? cfg_.n_layer : 0); }
  /// Recompute `layers` of the model's layers (0..n_layer), spread evenly over the depth
  /// (recompute_layer_at); the others keep their activations from the forward. The
  /// recomputed layers share one set of activations, so recomputing one layer saves
  /// nothing, each further one a layer's set.
  void set_recompute_layers(int layers);
  int recompute_layers() const { return recompute_layers_; }
  bool recompute() const { return recompute_layers_ > 0; }

  /// Fused projections (on by default): a layer's q/k/v weights (and gate/up's) lie back to
  /// back in its buffer, biases after them (layout_build), so one GEMM computes them together
  /// and q, k, v (gate, up) are column blocks of its output; LoRA adapters stay per
  /// projection. Not for qwen3's q/k/v (its per-head norms read q and k dense). Off: one GEMM
  /// per projection (the same values within rounding; for tests and comparisons). The
  /// weight layout is the same either way.
  void set_fused_projections(bool on);
  bool fused_qkv() const { return fuse_on_ && qkv_fusable_; }
  bool fused_gate_up() const { return fuse_on_ && gate_up_fusable_; }

  /// With adapters disabled, forward() runs the base model alone (the LoRA adapters are
  /// skipped, bit for bit the base model's output): DPO's reference model without a second
  /// copy. backward() refuses while they are disabled.
  void set_adapters_enabled(bool on) { adapters_enabled_ = on; }
  bool adapters_enabled() const { return adapters_enabled_; }
  /// Training mode (default) applies LoRA dropout; eval mode (false) turns it off.
  void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  /// Dropout masks are seeded by (LoraConfig::seed, forward count, layer, module);
  /// checkpoints save and restore the count to replay the same masks.
  uint64_t forward_count() const { return forward_count_; }
  void set_forward_count(uint64_t n) { forward_count_ = n; }

  // The arena's parts and shape, defined in model_arena.h.
  struct LayerActs;
  struct Scratch;
  struct ArenaShape;

 protected:
  ModelActivations(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads);
  ~ModelActivations();

  // Lays out and allocates the arena for shape's (B, T); bumps buffers_version().
  void arena_allocate(const ArenaShape& shape);
  // Drops the activations: the next forward re-allocates them, and backward needs one.
  void activations_invalidate() {
    B_ = T_ = 0;
    have_targets_ = false;
  }
  LayerActs& acts_for(int l);
  // The device copy of the last inputs' document starts, or nullptr without them.
  const int32_t* doc_starts() const;
  // Elements between consecutive tokens of q (and dq) and of k, v (and dk, dv): GPT-2 (and a
  // fused Llama q/k/v) reads them in place from the [N, (NH + 2 NKV) HD] projection output,
  // unfused Llama's are dense.
  bool qkv_one_array() const { return cfg_.arch == ModelConfig::Arch::GPT2 || fused_qkv(); }
  int q_stride() const {
    return qkv_one_array() ? (cfg_.n_head + 2 * cfg_.n_kv_head) * cfg_.head_dim() : cfg_.n_head * cfg_.head_dim();
  }
  int kv_stride() const { return qkv_one_array() ? q_stride() : cfg_.n_kv_head * cfg_.head_dim(); }
  // Row pitch of gate and up (and their gradients): 2 d_ff when fused, else d_ff.
  int gate_up_ld() const { return fused_gate_up() ? 2 * cfg_.d_ff : cfg_.d_ff; }

  // ---- The arena for (B_, T_)
  int B_ = 0, T_ = 0;
  int logits_ld_ = 0;  // row pitch of the logits (elements): the vocabulary, padded on a device
  uint64_t buffers_version_ = 0;
  device::DeviceBuffer arena_;    // every activation and scratch array for (B_, T_)
  std::vector<void*> residuals_;  // [n_layer + 1] of [N, C]: layer inputs, then the last output
  std::vector<int> act_set_;      // [layer] -> its set in acts_ (the recomputed layers share the last)
  std::vector<std::unique_ptr<LayerActs>> acts_;
  std::unique_ptr<Scratch> scratch_;
  device::DeviceBuffer row_one_;  // 1.0f in device memory: backward_rows' per-row count

  // ---- Switches for the next pass
  int recompute_layers_ = 0;
  bool fuse_on_ = true, qkv_fusable_ = false, gate_up_fusable_ = false;
  bool training_ = true, adapters_enabled_ = true;
  uint64_t forward_count_ = 0;

  // ---- What the last inputs and forward left for backward
  bool have_targets_ = false;
  bool acts_adapted_ = true;   // adapters_enabled_ when the saved activations were made
  float acts_dropout_ = 0.0f;  // LoRA dropout the saved activations were made with
  uint64_t acts_step_ = 0;     // forward count the saved activations (and dropout masks) belong to
  // backward_fuse's request for the next forward, and whether the last forward's loss
  // already wrote the logits' gradient (for this scale and count).
  LossGrad fuse_next_, fused_;
  int num_targets_ = 0;
  bool docs_ = false;            // the last inputs came with document starts (scratch_->doc_start)
  bool inputs_targets_ = false;  // inputs_set had targets
};

}  // namespace dtrain::model
