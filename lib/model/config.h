// ModelConfig: the architecture (GPT-2, or the Llama family: llama, qwen2, qwen3,
// mistral) and sizes of the native decoder transformer, with the family features that
// change the math (projection biases, q/k norms, head_dim, RoPE scaling, sliding window);
// the config module converts user/HF configs into it.
#pragma once

#include "ops/rope.h"

#include <cstdint>
#include <string>

namespace dtrain::model {

struct ModelConfig {
  /// GPT2 is its own block; the others are the Llama block (RMSNorm, RoPE, SwiGLU) with
  /// their HF model_type's features: QWEN2 q/k/v biases; QWEN3 per-head q_norm/k_norm;
  /// MISTRAL a sliding window.
  enum class Arch { GPT2, LLAMA, QWEN2, QWEN3, MISTRAL };
  /// HF rope_scaling types dtrain computes. DYNAMIC (dynamic NTK) changes the base only for
  /// sequences longer than max_seq_len, which the model refuses, so its frequencies are
  /// DEFAULT's at every length trained; it is kept to write config.json back as it was.
  enum class RopeScaling { NONE, LINEAR, DYNAMIC, LLAMA3 };
  Arch arch = Arch::GPT2;
  int vocab_size = 0;
  int max_seq_len = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;  ///< == n_head for GPT-2; divides n_head for Llama (GQA / MQA)
  int d_model = 0;
  int d_ff = 0;  ///< MLP hidden size (GPT-2: usually 4*d_model; Llama: intermediate_size)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_embeddings = true;
  /// Explicit head dimension (HF head_dim); 0: d_model / n_head.
  int head_size = 0;
  bool qkv_bias = false;   ///< biases on q_proj, k_proj, v_proj (qwen2; llama/qwen3 attention_bias)
  bool o_bias = false;     ///< bias on o_proj (llama/qwen3 attention_bias)
  bool mlp_bias = false;   ///< biases on gate_proj, up_proj, down_proj (llama mlp_bias)
  bool qk_norm = false;    ///< RMSNorm over head_dim of each q and k head before RoPE (qwen3)
  int sliding_window = 0;  ///< > 0: query i attends to keys i - window < j <= i (mistral)
  RopeScaling rope_scaling = RopeScaling::NONE;
  float rope_factor = 1.0f;            ///< linear, dynamic, llama3
  float rope_low_freq_factor = 1.0f;   ///< llama3
  float rope_high_freq_factor = 4.0f;  ///< llama3
  int rope_original_max_pos = 8192;    ///< llama3: original_max_position_embeddings

  int head_dim() const { return head_size > 0 ? head_size : (n_head > 0 ? d_model / n_head : 0); }
  bool is_gpt2() const { return arch == Arch::GPT2; }
  /// The RoPE frequencies the ops compute (rope_theta and the scaling).
  ops::RopeFreq rope_freq() const;
  /// Throws ConfigError naming the offending field when sizes are inconsistent.
  void validate() const;
};

/// The HF model_type: "gpt2", "llama", "qwen2", "qwen3", "mistral".
const char* arch_name(ModelConfig::Arch a);
/// The Arch of an HF model_type; false when it names none.
bool arch_parse(const std::string& s, ModelConfig::Arch* out);
/// "linear", "dynamic", "llama3" ("default" for NONE).
const char* rope_scaling_name(ModelConfig::RopeScaling r);

}  // namespace dtrain::model
