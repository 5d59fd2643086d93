// Hugging Face interchange files beside the weights: config.json for GPT2LMHeadModel,
// LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM, and PEFT's
// adapter_config.json for LoRA adapters, mapped to plain structs. Features dtrain's model
// does not implement are rejected by name, not ignored.
#pragma once

#include "model/config.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dtrain::model {

/// The architecture fields dtrain needs from / writes to an HF config.json.
struct HfModelConfig {
  std::string arch;  ///< config.json model_type: gpt2, llama, qwen2, qwen3, mistral
  int vocab_size = 0;
  int max_seq_len = 0;  ///< n_positions / max_position_embeddings
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;  ///< == n_head for gpt2
  int d_model = 0;
  int d_ff = 0;                 ///< gpt2: n_inner (null means 4 * d_model)
  float norm_eps = 1e-5f;       ///< layer_norm_epsilon / rms_norm_eps
  float rope_theta = 10000.0f;  ///< llama family only
  bool tie_embeddings = true;   ///< tie_word_embeddings
  // Llama family (see ModelConfig for their meaning)
  int head_dim = 0;  ///< 0: hidden_size / num_attention_heads
  bool qkv_bias = false, o_bias = false, mlp_bias = false, qk_norm = false;
  int sliding_window = 0;  ///< 0: none (null)
  ModelConfig::RopeScaling rope_scaling = ModelConfig::RopeScaling::NONE;
  float rope_factor = 1.0f, rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;
  int rope_original_max_pos = 8192;
  std::string torch_dtype = "float32";  ///< "float32", "bfloat16" or "float16"
  int bos_token_id = -1;                ///< -1: not written / not present
  int eos_token_id = -1;
};

/// The config.json object HF transformers writes for this model (keys sorted, HF defaults
/// for fields dtrain does not use; dropout 0 as dtrain trains without dropout).
nlohmann::json hf_config_to_json(const HfModelConfig& cfg);
/// Parses a config.json object; `source` (a path) prefixes error messages. Throws
/// ConfigError for a missing or mistyped key, an unknown model_type or an unsupported
/// feature, named (other activations, rope_scaling types other than default, linear,
/// dynamic and llama3, partial_rotary_factor, qwen's use_sliding_window, ...).
HfModelConfig hf_config_from_json(const nlohmann::json& j, const std::string& source);
/// Atomic write (temp file + rename), 2-space indented like transformers.
void hf_config_write(const std::string& path, const HfModelConfig& cfg);
/// IoError if unreadable, ConfigError if malformed (with line and column for bad JSON).
HfModelConfig hf_config_read(const std::string& path);

/// A LoRA adapter as PEFT's adapter_config.json describes it.
struct LoraAdapterConfig {
  int r = 8;
  float lora_alpha = 16.0f;
  float lora_dropout = 0.0f;
  std::vector<std::string> target_modules;  ///< e.g. {"c_attn"} or {"q_proj", "v_proj"}
  std::string base_model_name_or_path;
  bool fan_in_fan_out = false;  ///< true for GPT-2 (Conv1D weights are [in, out])
};

nlohmann::json peft_config_to_json(const LoraAdapterConfig& cfg);
/// Throws ConfigError unless peft_type is LORA, task_type CAUSAL_LM (or absent), bias
/// "none", target_modules a non-empty list, and DoRA / rsLoRA / rank_pattern /
/// alpha_pattern / layers_to_transform / modules_to_save unused.
LoraAdapterConfig peft_config_from_json(const nlohmann::json& j, const std::string& source);
void peft_config_write(const std::string& path, const LoraAdapterConfig& cfg);
LoraAdapterConfig peft_config_read(const std::string& path);

}  // namespace dtrain::model
