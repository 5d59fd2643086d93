// The native decoder-only transformer (GPT-2 or the Llama family, see ModelConfig), written once
// over the device layer (lib/device: CPU ops or CUDA kernels): flat per-layer parameter
// buffers with HF-named layouts (compute copy in the model's dtype, fp32 gradients),
// forward with masked cross-entropy, backward accumulating into the gradient buffers,
// optional per-layer activation recomputation, ZeRO hooks (and storage release, so the
// ZeRO engine's shards replace the full arrays) and LoRA adapters.
#pragma once

#include "core/tensor.h"
#include "device/device.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/lora.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dtrain::model {

/// Callbacks around each parameter buffer's use, for the ZeRO engine. The index is the
/// buffer's layer: -1 = embeddings, 0..n_layer-1 = transformer layers, n_layer = head
/// (params()[i + 1]). Forward calls before_layer_forward(-1 .. n_layer) in order; backward
/// calls before_layer_backward(i) / after_layer_backward(i) for i = n_layer down to -1.
/// After after_layer_backward(i) the gradients of buffer i are complete, except that with
/// tied embeddings the head also writes the embeddings' gradient (complete only after
/// after_layer_backward(-1)) and reads the embeddings in forward and backward.
/// Recomputation calls no forward hook: it runs after before_layer_backward(i).
/// Writes the fp32 values of base parameter buffer i (layout order) into host[0 .. size):
/// how a model built with deferred storage gets its weights, one buffer at a time.
using BufferFill = std::function<void(size_t i, float* host)>;

/// Values per random stream in Model::init_weights (a tensor's first chunk is its own stream).
inline constexpr size_t kInitChunk = size_t{1} << 20;

/// Whether layer l of n_layer is one of `layers` recomputed in backward: spread evenly over
/// the depth (2 of 4: layers 1 and 3; all when layers == n_layer, none when 0).
inline bool recompute_layer_at(int l, int layers, int n_layer) {
  return layers > 0 && (static_cast<int64_t>(l + 1) * layers) / n_layer != (static_cast<int64_t>(l) * layers) / n_layer;
}

struct ModelHooks {
  std::function<void(int)> before_layer_forward;
  std::function<void(int)> before_layer_backward;
  std::function<void(int)> after_layer_backward;
};

class Model {
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
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  device::Device& device() const { return *dev_; }
  /// The compute dtype of parameters and activations.
  DType dtype() const { return dtype_; }
  bool on_host() const { return dev_->kind() == device::Kind::CPU; }

  /// GPT-2 init from one seed: every matrix (embeddings included) ~ N(0, 0.02), the
  /// residual output projections (attn c_proj / o_proj, mlp c_proj / down_proj) ~
  /// N(0, 0.02 / sqrt(2 n_layer)), norm weights 1, biases 0. Each tensor draws from its
  /// own stream (seed, tensor index), so the result does not depend on sharding
  /// (nor on the device: the values are drawn on the host and copied); beyond its first
  /// kInitChunk values each further chunk from a stream derived from it and the chunk's
  /// index, so the chunks fill in parallel (the same values for any thread count).
  void init_weights(uint64_t seed);
  /// The values init_weights(seed) gives base buffer i, into host[0 .. params()[i].size).
  /// Needs no storage (a deferred model's BufferFill for a fresh run).
  void init_buffer_values(size_t i, uint64_t seed, float* host) const;
  /// Copies every parameter of src (same config; LoRA adapters too, enabling LoRA with
  /// src's config when src has it and this model has none) into this model, converting
  /// to its dtype (round to nearest even). Both models must be whole (no released storage).
  void weights_copy_from(const Model& src);
  /// The parameters of buffer i (base buffers, then adapters) as host fp32 values.
  std::vector<float> buffer_to_host(size_t i) const;
  /// Sets buffer i's parameters from host fp32 values (converted to the model's dtype).
  void buffer_from_host(size_t i, const float* values);

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
  /// Whether the last inputs came with document starts.
  bool inputs_documents() const { return docs_; }
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
  /// The last forward's per-position losses [B, T] (-log p(target), 0 where masked) copied
  /// to host fp32 on any device (waits for the device): the targets' log-probabilities,
  /// negated, for an objective computed on the host.
  std::vector<float> token_losses_to_host() const;
  /// Makes the next forward (with targets) also write the logits' gradient that
  /// backward(grad_scale, count) needs, in the loss's own pass over the logits (one read
  /// fewer of [B*T, vocab]); that forward overwrites logits(), and the backward after it
  /// must pass the same grad_scale and count (UsageError otherwise). The trainer's step
  /// calls it before each forward; the next forward consumes it, with targets or not.
  void backward_fuse(float grad_scale = 1.0f, const float* count = nullptr);

  /// Zeros every trainable gradient buffer.
  void zero_grad();

  /// Base parameter buffers: embeddings, layers 0..n_layer-1, head. grad is null under LoRA.
  std::vector<ParamBuffer>& params() { return params_; }
  const std::vector<ParamBuffer>& params() const { return params_; }
  /// LoRA adapter buffers, one per layer (empty unless lora_enable was called).
  std::vector<ParamBuffer>& lora_params() { return lora_params_; }
  const std::vector<ParamBuffer>& lora_params() const { return lora_params_; }
  /// What the optimizer updates: lora_params() under LoRA, else params().
  std::vector<ParamBuffer>& trainable_params() { return lora_on() ? lora_params_ : params_; }
  /// The tensor named name (base or adapter) as a host fp32 view, or a view with
  /// data == nullptr. UsageError on a device model (copy it to a CPU model first).
  TensorView tensor(const std::string& name);

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
  /// Unmasked target count of the last forward.
  int num_targets() const { return num_targets_; }
  /// Changes whenever the model reallocates its activations or scratch (a new (B, T)):
  /// work recorded against the old buffers (a CUDA graph) must not be replayed.
  uint64_t buffers_version() const { return buffers_version_; }

  size_t num_params() const;            ///< base parameters
  size_t num_trainable_params() const;  ///< adapters under LoRA, else num_params()

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

  void set_hooks(ModelHooks hooks) { hooks_ = std::move(hooks); }

  // ---- Storage (for the ZeRO engine)
  /// Frees storage the ZeRO engine replaces with its own: with grads, the gradient
  /// arrays of every trainable buffer (the adapters' under LoRA); and the parameter
  /// arrays of the listed buffers, indexed base buffers first then adapters
  /// (0 .. params().size() + lora_params().size() - 1). The matching ParamBuffer
  /// pointers become null; whoever owns the replacement points them at it while a hook
  /// needs the buffer and nulls them after. Released parameter values are lost.
  /// Refused (UsageError) for an index out of range. Already released storage stays so.
  void storage_release(bool grads, const std::vector<size_t>& param_buffers);
  /// Re-allocates, zeroed, the released gradient arrays (grads) and the listed released
  /// parameter arrays, and points their ParamBuffers at them. Storage that is not
  /// released is left as it is.
  void storage_restore(bool grads, const std::vector<size_t>& param_buffers);
  /// Re-allocates everything released (zeroed): the model is whole again.
  void storage_restore();
  /// True when any gradient or parameter array is released.
  bool storage_released() const;
  /// True when the parameter array of buffer i (indexed as in storage_release) is released.
  bool param_released(size_t i) const;
  /// Bytes of parameter and gradient arrays the model holds now (base and adapters, in
  /// their dtypes; activations and scratch are not counted: they depend on the batch shape).
  size_t allocated_bytes() const { return param_allocated_bytes() + grad_allocated_bytes(); }
  size_t param_allocated_bytes() const;
  /// Bytes of the activation arena for the last forward's (B, T) (0 before the first).
  size_t activation_bytes() const { return arena_.bytes(); }
  size_t grad_allocated_bytes() const;

  /// With adapters disabled, forward() runs the base model alone (the LoRA adapters are
  /// skipped, bit for bit the base model's output): DPO's reference model without a second
  /// copy. backward() refuses while they are disabled.
  void set_adapters_enabled(bool on) { adapters_enabled_ = on; }
  bool adapters_enabled() const { return adapters_enabled_; }
  /// Training mode (default) applies LoRA dropout; eval mode (false) turns it off.
  void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }

  // ---- LoRA
  /// Adds adapters to the configured modules of every layer and freezes the base model
  /// (its gradient buffers are released and no dW GEMM runs). B starts at 0, so the
  /// output is unchanged until the adapters train.
  void lora_enable(const LoraConfig& lcfg);
  bool lora_on() const { return !lora_params_.empty(); }
  const LoraConfig& lora_config() const { return lora_cfg_; }
  /// Folds W += scale * B A into every adapted base weight, removes the adapters and
  /// makes the base model trainable again (gradient buffers zeroed). fp32 models only.
  void lora_merge();
  /// Dropout masks are seeded by (LoraConfig::seed, forward count, layer, module);
  /// checkpoints save and restore the count to replay the same masks.
  uint64_t forward_count() const { return forward_count_; }
  void set_forward_count(uint64_t n) { forward_count_ = n; }

 private:
  Model(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads = true);
  struct Proj;
  struct LayerActs;
  struct Scratch;
  // The device copy of the last inputs' document starts, or nullptr without them.
  const int32_t* doc_starts() const;

  void allocate(int B, int T);
  void backward_impl(float grad_scale, const float* count, const float* row_scales);
  void layer_forward(int l, LayerActs& a, bool fused_input);
  void layer_backward(int l, LayerActs& a);
  void proj_forward(int l, int p, const void* x, void* y, LayerActs& a) { proj_group_forward(l, p, 1, x, y, a); }
  void proj_backward(int l, int p, const void* dy, const void* x, void* dx, bool accumulate_dx, LayerActs& a) {
    proj_group_backward(l, p, 1, dy, x, dx, accumulate_dx, a);
  }
  // Projections p .. p + n - 1 with their weights (and biases) back to back: one GEMM, y's
  // rows hold their outputs side by side; each member's adapter on its block.
  void proj_group_forward(int l, int p, int n, const void* x, void* y, LayerActs& a);
  void proj_group_backward(int l, int p, int n, const void* dy, const void* x, void* dx, bool accumulate_dx,
                           LayerActs& a);
  void lora_forward(int l, int p, const void* x, void* y, int ld_y, LayerActs& a);
  void lora_backward(int l, int p, const void* dy, int ld_dy, const void* x, void* dx, LayerActs& a);
  bool proj_group_fusable(const BufferLayout& layer, int p, int n) const;
  bool proj_adapted(int l, int p) const;
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
  uint64_t lora_mask_seed(int l, int p) const;
  LayerActs& acts_for(int l);
  void* at(const void* base, size_t elems) const {
    return static_cast<char*>(const_cast<void*>(base)) + elems * dtype_size(dtype_);
  }
  void* param_at(const ParamBuffer& pb, size_t tensor) const { return at(pb.data, pb.layout.tensors[tensor].offset); }
  float* grad_at(const ParamBuffer& pb, size_t tensor) const {
    return pb.grad ? pb.grad + pb.layout.tensors[tensor].offset : nullptr;
  }
  void grads_allocate();
  ParamBuffer& buffer_at(size_t i);
  const ParamBuffer& buffer_at(size_t i) const;
  device::DeviceBuffer& param_store_at(size_t i);
  void host_enforce(const char* what) const;
  void storage_enforce_whole(const char* what) const;
  void buffer_enforce_present(const ParamBuffer& pb, bool need_data, bool need_grad) const;
  void layer_buffers_enforce(int l, bool grads) const;

  ModelConfig cfg_;
  device::Device* dev_;
  DType dtype_;
  std::vector<Proj> projs_;
  // Llama family: tensor indices (in each layer buffer) of the two norms, and of qwen3's
  // q/k norms (-1 without).
  int ln1_ = 0, ln2_ = 0, qnorm_ = -1, knorm_ = -1;
  std::vector<device::DeviceBuffer> param_store_, grad_store_, lora_store_, lora_grad_store_;
  std::vector<ParamBuffer> params_, lora_params_;
  std::vector<std::vector<int>> lora_slot_;  // [layer][proj] -> tensor index of lora_A in lora buffer, -1 if none
  LoraConfig lora_cfg_;

  int B_ = 0, T_ = 0;
  int logits_ld_ = 0;  // row pitch of the logits (elements): the vocabulary, padded on a device
  int recompute_layers_ = 0;
  bool fuse_on_ = true, qkv_fusable_ = false, gate_up_fusable_ = false;
  std::vector<int> act_set_;  // [layer] -> its set in acts_ (the recomputed layers share the last)
  bool training_ = true;
  bool adapters_enabled_ = true;
  bool acts_adapted_ = true;      // adapters_enabled_ when the saved activations were made
  device::DeviceBuffer row_one_;  // 1.0f in device memory: backward_rows' per-row count
  float acts_dropout_ = 0.0f;     // LoRA dropout the saved activations were made with
  bool have_targets_ = false;
  // backward_fuse's request for the next forward, and whether the last forward's loss
  // already wrote the logits' gradient (for this scale and count).
  struct LossGrad {
    bool on = false;
    float grad_scale = 1.0f;
    const float* count = nullptr;
  };
  LossGrad fuse_next_, fused_;
  int num_targets_ = 0;
  bool docs_ = false;  // the last inputs came with document starts (scratch_->doc_start)
  uint64_t forward_count_ = 0;
  bool inputs_targets_ = false;  // inputs_set had targets
  uint64_t buffers_version_ = 0;
  uint64_t acts_step_ = 0;  // forward count the saved activations (and dropout masks) belong to
  ModelHooks hooks_;
  bool grads_released_ = false;
  std::vector<char> param_released_;  // [base buffers, then adapters]
  device::DeviceBuffer arena_;        // every activation and scratch array for (B_, T_)
  std::vector<void*> residuals_;      // [n_layer + 1] of [N, C]: layer inputs, then the last output
  std::vector<std::unique_ptr<LayerActs>> acts_;
  std::unique_ptr<Scratch> scratch_;
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
