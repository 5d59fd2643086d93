// The model a training config describes: TrainConfig -> model::ModelConfig, random init
// or Hugging Face import (config.json + model.safetensors, PEFT adapters), LoRA and
// recompute switches, and the HF export the trainer writes to <run_dir>/final/.
#pragma once

#include "config/train_config.h"
#include "model/model.h"
#include "model/peft.h"

#include <memory>
#include <string>

namespace dtrain::train {

/// The architecture the config asks for: model.init_from's config.json when init_from is
/// set (sizes given in the config must then agree with it, else ConfigError), otherwise
/// the model section (architecture and sizes required). Derived fields (n_kv_head, d_ff,
/// max_seq_len, tie_embeddings) follow the config module's rules when still unset.
model::ModelConfig model_config_from(const config::TrainConfig& cfg);

/// The LoRA settings of the config for this architecture (targets default as in the
/// config module; seed = training.seed).
model::LoraConfig lora_config_from(const config::TrainConfig& cfg, const model::ModelConfig& mcfg);

/// Builds the model for cfg: random init from training.seed, or the weights of
/// model.init_from (model_load_hf_weights: model.safetensors, or the shards of
/// model.safetensors.index.json); then LoRA when lora.r > 0 (adapters loaded from init_from's
/// adapter_model.safetensors when that file exists there), and the layers
/// recompute_layers_of says recompute.
std::unique_ptr<model::Model> model_create(const config::TrainConfig& cfg);

/// Layers cfg recomputes in backward, of the model's n_layer: activation_checkpointing.layers
/// when given, all when enabled is true, none when it is false or neither is given (left to
/// the memory plan: train/memory_plan.h recompute_resolve sets layers). ConfigError when
/// layers exceeds n_layer.
int recompute_layers_of(const config::TrainConfig& cfg, int n_layer);

/// A model built with deferred storage (model::Model::Deferred) and the fill that gives
/// each base buffer its values: model_create's, one buffer at a time (the random init of
/// training.seed, or model.init_from's tensors read from their mmapped files). For a ZeRO
/// engine, which takes them buffer by buffer: at stage 3 it keeps only this rank's shards,
/// so no rank holds the whole model; on a device no host copy of it is made.
/// The fill keeps init_from's files open; drop it once the engine is built.
struct DeferredModel {
  std::unique_ptr<model::Model> model;
  model::BufferFill fill;
};
/// On a device, the model computes in `dtype` there (its adapters start there too) and no
/// host copy of the base weights is made.
DeferredModel model_create_deferred(const config::TrainConfig& cfg, device::Device& dev = device::cpu(),
                                    DType dtype = DType::F32);

/// Loads every base tensor of the model from one or more safetensors files (names as in
/// the layout; GPT-2 files without the "transformer." prefix are accepted; Conv1D
/// tensors are transposed; a tied lm_head.weight is ignored). IoError naming the file
/// and tensor for a missing tensor or a shape mismatch.
void model_load_safetensors(model::Model& m, const std::vector<std::string>& paths);

/// Loads the base tensors from an HF directory: model.safetensors; else the shards
/// model.safetensors.index.json names, validated (every shard present, every tensor in the
/// file its weight_map entry says and listed there, none in two shards); else every
/// model-*.safetensors (none in two). IoError naming the file and tensor otherwise.
void model_load_hf_weights(model::Model& m, const std::string& dir);

/// Checks, without reading them, that the weight files model_load_hf_weights would open in
/// dir (and a LoRA adapter's files there) are readable regular files (core/input_file.h):
/// the launcher's check before any rank starts, so a FIFO or a link loop among them is one
/// ConfigError naming it, not a rank blocked in open(). IoError as model_load_hf_weights
/// when no weight file is found.
void model_files_check(const std::string& dir);

/// Whether dir holds any weight file model_files_check would look at (model.safetensors,
/// its index, or a model-*.safetensors shard): false for a directory holding only
/// config.json, which a plan for another cluster (--plan-for) reads its shape from.
bool model_weights_present(const std::string& dir);

/// Loads PEFT adapter weights into a model whose LoRA is enabled (on any device).
void model_load_adapter(model::Model& m, const std::string& path);

/// Loads a Hugging Face model directory written by model_export_hf (or HF transformers /
/// PEFT): config.json + weights, then adapter_config.json + adapter_model.safetensors
/// when present (LoRA is enabled with the adapter's settings, not merged).
std::unique_ptr<model::Model> model_load_hf_dir(const std::string& dir);

/// config.json's fields for this architecture (model_type, sizes, biases, head_dim,
/// rope_scaling, sliding_window; torch_dtype "float32").
model::HfModelConfig model_hf_config(const model::ModelConfig& m);

/// Writes dir/model.safetensors + dir/config.json (fp32, HF names and shapes, bit-exact)
/// and, when LoRA is on, dir/adapter_model.safetensors + dir/adapter_config.json (the base
/// weights stay unmerged in model.safetensors). eos/bos ids go into config.json when >= 0.
/// Replaces dir (train/hf_export.h: model_export_hf with HfExportOptions for bf16, shards
/// and a merged model). IoError on failure.
void model_export_hf(model::Model& m, const std::string& dir, int bos_id = -1, int eos_id = -1);

}  // namespace dtrain::train
