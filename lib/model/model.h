// The native decoder-only transformer (GPT-2 or the Llama family, see ModelConfig), written once
// over the device layer (lib/device: CPU ops or CUDA kernels): forward with masked
// cross-entropy, backward accumulating into the gradient buffers, ZeRO hooks and LoRA
// adapters. Its parameters (flat per-layer buffers with HF-named layouts, storage the ZeRO
// engine releases) are ModelParams', its activations (with optional per-layer
// recomputation) ModelActivations'.
#pragma once

#include "model/lora.h"
#include "model/model_activations.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dtrain::model {

/// Writes the fp32 values of base parameter buffer i (layout order) into host[0 .. size):
/// how a model built with deferred storage gets its weights, one buffer at a time.
using BufferFill = std::function<void(size_t i, float* host)>;

/// Callbacks around each parameter buffer's use, for the ZeRO engine. The index is the
/// buffer's layer: -1 = embeddings, 0..n_layer-1 = transformer layers, n_layer = head
/// (params()[i + 1]). Forward calls before_layer_forward(-1 .. n_layer) in order; backward
/// calls before_layer_backward(i) / after_layer_backward(i) for i = n_layer down to -1.
/// After after_layer_backward(i) the gradients of buffer i are complete, except that with
/// tied embeddings the head also writes the embeddings' gradient (complete only after
/// after_layer_backward(-1)) and reads the embeddings in forward and backward.
/// Recomputation calls no forward hook: it runs after before_layer_backward(i).
struct ModelHooks {
  std::function<void(int)> before_layer_forward;
  std::function<void(int)> before_layer_backward;
  std::function<void(int)> after_layer_backward;
};

/// The parameters, their storage and the weights' init and host copies are ModelParams'
/// (model_params.h); the activations, the switches that shape a pass and the read-backs
/// of logits and losses ModelActivations' (model_activations.h).
class Model : public ModelActivations {
 public:
  /// A model on `dev` (which must outlive it) whose parameters and activations are
  /// `dtype`: F32 on the CPU; F32, BF16 or F16 on CUDA (the compute copy; fp32 masters
  /// are the optimizer's). Gradients are fp32 on every device.
  explicit Model(const ModelConfig& cfg, device::Device& dev = device::cpu(), DType dtype = DType::F32);
  /// Deferred storage (DeepSpeed's zero.Init): no base parameter or gradient array is
  /// allocated; every base buffer starts released (storage_release), so a ZeRO engine
  /// given a BufferFill builds its shards one buffer at a time and no full copy of the
  /// model ever exists. LoRA adapters (lora_enable) are allocated as usual.
  struct Deferred {};
  Model(const ModelConfig& cfg, Deferred, device::Device& dev = device::cpu(), DType dtype = DType::F32);
  /// A base that will be frozen (LoRA is enabled next): its parameters are allocated, its
  /// gradient arrays are not (lora_enable would free them again; a LoRA job's build held
  /// both at once, twice its training memory for a 34M model).
  struct FrozenBase {};
  Model(const ModelConfig& cfg, FrozenBase, device::Device& dev = device::cpu(), DType dtype = DType::F32);
  ~Model();

  /// Copies every parameter of src (same config; LoRA adapters too, enabling LoRA with
  /// src's config when src has it and this model has none) into this model, converting
  /// to its dtype (round to nearest even). Both models must be whole (no released storage).
  void weights_copy_from(const Model& src);

  /// Runs the model on tokens [B, T] (host memory, row-major); T <= max_seq_len. With
  /// targets [B, T] (IGNORE_INDEX = -100 masks a position) returns the mean cross-entropy
  /// over unmasked positions (0 if all are masked) and prepares backward(); with
  /// targets == nullptr only computes logits and returns NaN. UsageError for a token or
  /// target outside the vocabulary (checked on the host, for every device). Activations
  /// are allocated (one arena on the device) on the first call for a (B, T) and reused
  /// while (B, T) stays the same. On CUDA the loss read-back waits for the device; with
  /// loss_out (one float of the model's device memory) the mean loss is written there
  /// instead, nothing is read back and forward returns NaN (the trainer reads every
  /// micro-batch's loss in its step's one read-back). doc_start [B, T] (host, or nullptr):
  /// the rows hold packed documents that must not see each other (ops/attention.h's
  /// layout, checked: UsageError): a position attends only within its document and its
  /// position (RoPE, GPT-2's learned positions) counts from the document's start.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss_out = nullptr,
                const int32_t* doc_start = nullptr);
  /// forward() in two calls, for a caller that records the step in a CUDA graph:
  /// inputs_set validates and uploads tokens and targets to the model's fixed device
  /// buffers (waits for the device on CUDA); forward_issue runs the model on them, waiting
  /// for nothing when loss_out is given.
  void inputs_set(const int32_t* tokens, const int32_t* targets, int B, int T, const int32_t* doc_start = nullptr);
  float forward_issue(float* loss_out = nullptr);

  /// Accumulates (+=) d(grad_scale * mean loss)/d(params) into the gradient buffers (the
  /// adapters' only, under LoRA). grad_scale carries the loss scale / accumulation factor.
  /// Needs a forward() with targets since the last backward. Overwrites logits().
  /// With count (one fp32 value in device memory, read on the device when the backward
  /// runs) the loss is the sum over this forward's targets divided by *count instead of
  /// their mean: the trainer passes the step's target count summed over micro-batches and
  /// ranks, so a recorded step does not bake the per-step scale in.
  void backward(float grad_scale = 1.0f, const float* count = nullptr);
  /// backward() for an objective over whole sequences (DPO, ORPO, SimPO): row b's
  /// targets take the gradient of grad_scale * row_scales[b] * (the sum of their losses),
  /// row_scales[0..B) in host memory. A sequence objective f(S_0, .., S_B-1) of the rows'
  /// target log-probability sums S_b passes row_scales[b] = -df/dS_b.
  void backward_rows(const float* row_scales, float grad_scale = 1.0f);
  /// Makes the next forward (with targets) also write the logits' gradient that
  /// backward(grad_scale, count) needs, in the loss's own pass over the logits (one read
  /// fewer of [B*T, vocab]); that forward overwrites logits(), and the backward after it
  /// must pass the same grad_scale and count (UsageError otherwise). The trainer's step
  /// calls it before each forward; the next forward consumes it, with targets or not.
  void backward_fuse(float grad_scale = 1.0f, const float* count = nullptr);

  void set_hooks(ModelHooks hooks) { hooks_ = std::move(hooks); }

  // ---- LoRA
  /// Adds adapters to the configured modules of every layer and freezes the base model
  /// (its gradient buffers are released and no dW GEMM runs). B starts at 0, so the
  /// output is unchanged until the adapters train.
  void lora_enable(const LoraConfig& lcfg);
  const LoraConfig& lora_config() const { return lora_cfg_; }
  /// Folds W += scale * B A into every adapted base weight, removes the adapters and
  /// makes the base model trainable again (gradient buffers zeroed). fp32 models only.
  void lora_merge();

 private:
  Model(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads = true);
  struct Proj;

  void allocate(int B, int T);
  void backward_impl(float grad_scale, const float* count, const float* row_scales);
  // The logits' gradient for backward_impl (unless the forward's loss pass wrote it).
  void logits_backward(float grad_scale, const float* count, const float* row_scales);
  void layer_forward(int l, LayerActs& a, bool fused_input);
  void layer_backward(int l, LayerActs& a);
  void proj_forward(int l, int p, const void* x, void* y, LayerActs& a);
  void proj_backward(int l, int p, const void* dy, const void* x, void* dx, bool accumulate_dx, LayerActs& a);
  // Projections p .. p + n - 1 with their weights (and biases) back to back: one GEMM, y's
  // rows hold their outputs side by side; each member's adapter on its block.
  void proj_group_forward(int l, int p, int n, const void* x, void* y, LayerActs& a);
  void proj_group_backward(int l, int p, int n, const void* dy, const void* x, void* dx, bool accumulate_dx,
                           LayerActs& a);
  void lora_forward(int l, int p, const void* x, void* y, int ld_y, LayerActs& a);
  void lora_backward(int l, int p, const void* dy, int ld_dy, const void* x, void* dx, LayerActs& a);
  bool proj_group_fusable(const BufferLayout& layer, int p, int n) const;
  bool proj_adapted(int l, int p) const;
  uint64_t lora_mask_seed(int l, int p) const;

  std::vector<Proj> projs_;
  // Llama family: tensor indices (in each layer buffer) of the two norms, and of qwen3's
  // q/k norms (-1 without).
  int ln1_ = 0, ln2_ = 0, qnorm_ = -1, knorm_ = -1;
  std::vector<std::vector<int>> lora_slot_;  // [layer][proj] -> tensor index of lora_A in lora buffer, -1 if none
  LoraConfig lora_cfg_;
  ModelHooks hooks_;
};

/// Runs a scope in eval mode (set_training(false): no LoRA dropout) and restores the
/// previous mode on leaving it.
class EvalScope {
 public:
  explicit EvalScope(Model& m) : m_(m), was_(m.training()) { m_.set_training(false); }
  ~EvalScope() { m_.set_training(was_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Model& m_;
  bool was_;
};

/// Runs a scope with m's adapters switched off (set_adapters_enabled(false)), as the
/// reference model of DPO, and restores what they were on leaving it, by exception too.
class AdaptersOffScope {
 public:
  explicit AdaptersOffScope(Model& m) : m_(m), was_(m.adapters_enabled()) { m_.set_adapters_enabled(false); }
  ~AdaptersOffScope() { m_.set_adapters_enabled(was_); }
  AdaptersOffScope(const AdaptersOffScope&) = delete;
  AdaptersOffScope& operator=(const AdaptersOffScope&) = delete;

 private:
  Model& m_;
  bool was_;
};

}  // namespace dtrain::model
