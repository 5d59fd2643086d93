// ModelConfig: the architecture switch (GPT-2 or Llama) and sizes of the native decoder
// transformer; the config module converts user/HF configs into it.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::model {

struct ModelConfig {
  enum class Arch { GPT2, LLAMA };
  Arch arch = Arch::GPT2;
  int vocab_size = 0;
  int max_seq_len = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;  ///< == n_head for GPT-2; divides n_head for Llama (GQA / MQA)
  int d_model = 0;
  int d_ff = 0;       ///< MLP hidden size (GPT-2: usually 4*d_model; Llama: intermediate_size)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_embeddings = true;

  int head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  /// Throws ConfigError naming the offending field when sizes are inconsistent.
  void validate() const;
};

const char* arch_name(ModelConfig::Arch a);  ///< "gpt2" / "llama"

}  // namespace dtrain::model
