// ModelConfig validation.
#include "model/config.h"

#include "core/check.h"

namespace dtrain::model {

const char* arch_name(ModelConfig::Arch a) { return a == ModelConfig::Arch::GPT2 ? "gpt2" : "llama"; }

void ModelConfig::validate() const {
  DT_ENFORCE_GT(vocab_size, 0, ConfigError, "model vocab_size");
  DT_ENFORCE_GT(max_seq_len, 0, ConfigError, "model max_seq_len");
  DT_ENFORCE_GT(n_layer, 0, ConfigError, "model n_layer");
  DT_ENFORCE_GT(n_head, 0, ConfigError, "model n_head");
  DT_ENFORCE_GT(n_kv_head, 0, ConfigError, "model n_kv_head");
  DT_ENFORCE_GT(d_model, 0, ConfigError, "model d_model");
  DT_ENFORCE_GT(d_ff, 0, ConfigError, "model d_ff");
  DT_ENFORCE(d_model % n_head == 0, ConfigError, "model d_model ({}) must be a multiple of n_head ({})", d_model, n_head);
  DT_ENFORCE(n_head % n_kv_head == 0, ConfigError, "model n_head ({}) must be a multiple of n_kv_head ({})", n_head, n_kv_head);
  DT_ENFORCE_GT(norm_eps, 0.0f, ConfigError, "model norm_eps");
  if (arch == Arch::GPT2) {
    DT_ENFORCE_EQ(n_kv_head, n_head, ConfigError, "GPT-2 has no grouped KV heads: set n_kv_head = n_head");
  } else {
    DT_ENFORCE(head_dim() % 2 == 0, ConfigError, "Llama RoPE needs an even head dim, got d_model/n_head = {}", head_dim());
    DT_ENFORCE_GT(rope_theta, 0.0f, ConfigError, "model rope_theta");
  }
}

}  // namespace dtrain::model
