// Parameter layout: the model's parameters live in one flat fp32 buffer for the
// embeddings, one per transformer layer and one for the final norm + lm_head. Each buffer
// holds an ordered list of named tensors (Hugging Face names, so safetensors import/export
// is a name lookup) with offsets, shapes and weight-decay flags.
#pragma once

#include "core/dtype.h"
#include "model/config.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::model {

/// One named tensor inside a flat buffer.
struct TensorSpec {
  std::string name;            ///< HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  size_t offset = 0;           ///< in floats from the start of the buffer
  std::vector<int64_t> shape;  ///< as stored here: linear weights are [out, in] (torch.nn.Linear)
  /// AdamW decay: true for 2-D matrices (projections, embeddings, lm_head), false for
  /// norm weights and biases (the GPT-2/nanoGPT/HF-Trainer recipe: embeddings decay).
  bool decay = false;
  /// HF stores this tensor transposed ([in, out]: GPT-2's Conv1D); import and export must
  /// transpose. False for every Llama tensor.
  bool hf_transposed = false;
  size_t numel() const;
};

/// The layout of one flat buffer.
struct BufferLayout {
  std::string name;  ///< "embeddings", "layers.3", "head", "lora.layers.3"
  int layer = 0;     ///< -1 embeddings, 0..n_layer-1 transformer layers, n_layer head
  std::vector<TensorSpec> tensors;
  size_t size = 0;  ///< total floats
  /// The tensor called name, or nullptr.
  const TensorSpec* find(const std::string& name) const;
};

/// One parameter buffer as the trainer and the ZeRO engine see it. data/grad point into
/// storage owned by the Model, on the model's device: data is the compute copy (dtype:
/// fp32, or bf16/fp16 on CUDA), grad fp32 and null for frozen buffers (base weights
/// under LoRA). Offsets in the layout are in elements.
struct ParamBuffer {
  BufferLayout layout;
  void* data = nullptr;
  float* grad = nullptr;
  size_t size = 0;  ///< == layout.size
  DType dtype = DType::F32;
  bool on_host = true;  ///< data and grad are host memory (the CPU device)
  /// data as host fp32 (null when released); UsageError on a CUDA or 16-bit buffer.
  float* host_f32() const;
  /// grad as host fp32; UsageError on a CUDA buffer.
  float* host_grad() const;
};

/// The base-model buffers in order: embeddings, layers 0..n_layer-1, head.
std::vector<BufferLayout> layout_build(const ModelConfig& cfg);

/// Module path of layer i ("transformer.h.3" / "model.layers.3").
std::string layer_prefix(const ModelConfig& cfg, int layer);

/// A linear projection of a decoder layer, in the model's order: LoRA's target name, its
/// module path inside the layer, its sizes and whether it has a bias.
struct LayerProjection {
  std::string short_name;  ///< "q_proj", "c_attn", "c_proj" (GPT-2 has two)
  std::string module;      ///< "self_attn.q_proj", "mlp.c_proj"
  int in = 0, out = 0;
  bool bias = false;
};
std::vector<LayerProjection> layer_projections(const ModelConfig& cfg);

}  // namespace dtrain::model
