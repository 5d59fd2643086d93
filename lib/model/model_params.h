// ModelParams: the parameter side of a Model (model.h): its config, device and dtype, the
// flat per-layer parameter buffers (HF-named layouts, compute copy in the model's dtype,
// fp32 gradients) with their storage, which the ZeRO engine may release and restore, and
// the weights' init and host copies. Model derives from it; nothing else builds one.
#pragma once

#include "core/tensor.h"
#include "device/device.h"
#include "model/config.h"
#include "model/layout.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::model {

/// Values per random stream in Model::init_weights (a tensor's first chunk is its own stream).
inline constexpr size_t kInitChunk = size_t{1} << 20;

class ModelParams {
 public:
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
  /// The parameters of buffer i (base buffers, then adapters) as host fp32 values.
  std::vector<float> buffer_to_host(size_t i) const;
  /// Sets buffer i's parameters from host fp32 values (converted to the model's dtype).
  void buffer_from_host(size_t i, const float* values);
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
  bool lora_on() const { return !lora_params_.empty(); }
  /// The tensor named name (base or adapter) as a host fp32 view, or a view with
  /// data == nullptr. UsageError on a device model (copy it to a CPU model first).
  TensorView tensor(const std::string& name);
  size_t num_params() const;            ///< base parameters
  size_t num_trainable_params() const;  ///< adapters under LoRA, else num_params()

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
  size_t grad_allocated_bytes() const;

 protected:
  // The base buffers of cfg's layout on dev: allocated (grads: with their gradient
  // arrays), or released from the start (deferred).
  ModelParams(const ModelConfig& cfg, device::Device& dev, DType dtype, bool deferred, bool grads);
  ~ModelParams();
  ModelParams(const ModelParams&) = delete;
  ModelParams& operator=(const ModelParams&) = delete;

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
  std::vector<device::DeviceBuffer> param_store_, grad_store_, lora_store_, lora_grad_store_;
  std::vector<ParamBuffer> params_, lora_params_;
  bool grads_released_ = false;
  std::vector<char> param_released_;  // [base buffers, then adapters]
};

}  // namespace dtrain::model
