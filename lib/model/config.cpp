// ModelConfig validation and names.
#include "model/config.h"

#include "core/check.h"

namespace dtrain::model {

const char* arch_name(ModelConfig::Arch a) {
  switch (a) {
    case ModelConfig::Arch::GPT2: return "gpt2";
    case ModelConfig::Arch::LLAMA: return "llama";
    case ModelConfig::Arch::QWEN2: return "qwen2";
    case ModelConfig::Arch::QWEN3: return "qwen3";
    case ModelConfig::Arch::MISTRAL: return "mistral";
  }
  return "?";
}

bool arch_parse(const std::string& s, ModelConfig::Arch* out) {
  for (auto a : {ModelConfig::Arch::GPT2, ModelConfig::Arch::LLAMA, ModelConfig::Arch::QWEN2, ModelConfig::Arch::QWEN3,
                 ModelConfig::Arch::MISTRAL})
    if (s == arch_name(a)) {
      *out = a;
      return true;
    }
  return false;
}

const char* rope_scaling_name(ModelConfig::RopeScaling r) {
  switch (r) {
    case ModelConfig::RopeScaling::NONE: return "default";
    case ModelConfig::RopeScaling::LINEAR: return "linear";
    case ModelConfig::RopeScaling::DYNAMIC: return "dynamic";
    case ModelConfig::RopeScaling::LLAMA3: return "llama3";
  }
  return "?";
}

ops::RopeFreq ModelConfig::rope_freq() const {
  ops::RopeFreq r;
  r.theta = rope_theta;
  r.factor = rope_factor;
  r.low_freq_factor = rope_low_freq_factor;
  r.high_freq_factor = rope_high_freq_factor;
  r.original_max_position = rope_original_max_pos;
  r.type = rope_scaling == RopeScaling::LINEAR   ? ops::RopeFreq::LINEAR
           : rope_scaling == RopeScaling::LLAMA3 ? ops::RopeFreq::LLAMA3
                                                 : ops::RopeFreq::DEFAULT;
  return r;
}

void ModelConfig::validate() const {
  DT_ENFORCE_GT(vocab_size, 0, ConfigError, "model vocab_size");
  DT_ENFORCE_GT(max_seq_len, 0, ConfigError, "model max_seq_len");
  DT_ENFORCE_GT(n_layer, 0, ConfigError, "model n_layer");
  DT_ENFORCE_GT(n_head, 0, ConfigError, "model n_head");
  DT_ENFORCE_GT(n_kv_head, 0, ConfigError, "model n_kv_head");
  DT_ENFORCE_GT(d_model, 0, ConfigError, "model d_model");
  DT_ENFORCE_GT(d_ff, 0, ConfigError, "model d_ff");
  DT_ENFORCE_GE(head_size, 0, ConfigError, "model head_dim");
  DT_ENFORCE(head_size > 0 || d_model % n_head == 0, ConfigError,
             "model d_model ({}) must be a multiple of n_head ({}) unless head_dim is given", d_model, n_head);
  DT_ENFORCE(n_head % n_kv_head == 0, ConfigError, "model n_head ({}) must be a multiple of n_kv_head ({})", n_head,
             n_kv_head);
  DT_ENFORCE_GT(norm_eps, 0.0f, ConfigError, "model norm_eps");
  DT_ENFORCE_GE(sliding_window, 0, ConfigError, "model sliding_window");
  const char* name = arch_name(arch);
  if (arch == Arch::GPT2) {
    DT_ENFORCE_EQ(n_kv_head, n_head, ConfigError, "GPT-2 has no grouped KV heads: set n_kv_head = n_head");
    DT_ENFORCE(head_size == 0 || head_size * n_head == d_model, ConfigError,
               "GPT-2's head dim is d_model / n_head; head_dim {} differs", head_size);
    DT_ENFORCE(
        !qkv_bias && !o_bias && !mlp_bias && !qk_norm && sliding_window == 0 && rope_scaling == RopeScaling::NONE,
        ConfigError,
        "GPT-2 takes none of the Llama family's options (biases flags, qk_norm, sliding_window, "
        "rope_scaling)");
    return;
  }
  DT_ENFORCE(head_dim() % 2 == 0, ConfigError, "{} RoPE needs an even head dim, got {}", name, head_dim());
  DT_ENFORCE_GT(rope_theta, 0.0f, ConfigError, "model rope_theta");
  DT_ENFORCE(qk_norm == (arch == Arch::QWEN3), ConfigError, "per-head q/k norms are qwen3's and always on there ({})",
             name);
  DT_ENFORCE(sliding_window == 0 || arch == Arch::MISTRAL, ConfigError,
             "a sliding window is mistral's; {} attends to the whole causal prefix", name);
  switch (arch) {
    case Arch::QWEN2:
      DT_ENFORCE(qkv_bias && !o_bias && !mlp_bias, ConfigError, "qwen2 has q/k/v biases and no other biases");
      break;
    case Arch::QWEN3:
      DT_ENFORCE(qkv_bias == o_bias && !mlp_bias, ConfigError,
                 "qwen3's attention_bias puts biases on q, k, v and o together, and its MLP has none");
      break;
    case Arch::MISTRAL: DT_ENFORCE(!qkv_bias && !o_bias && !mlp_bias, ConfigError, "mistral has no biases"); break;
    default:
      DT_ENFORCE(qkv_bias == o_bias, ConfigError, "llama's attention_bias puts biases on q, k, v and o together");
  }
  if (rope_scaling != RopeScaling::NONE) DT_ENFORCE_GT(rope_factor, 0.0f, ConfigError, "model rope_scaling factor");
  if (rope_scaling == RopeScaling::LLAMA3) {
    DT_ENFORCE(rope_factor >= 1.0f, ConfigError, "llama3 rope_scaling factor {} must be >= 1", rope_factor);
    DT_ENFORCE(rope_low_freq_factor > 0.0f && rope_high_freq_factor > rope_low_freq_factor, ConfigError,
               "llama3 rope_scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({})", rope_low_freq_factor,
               rope_high_freq_factor);
    DT_ENFORCE_GT(rope_original_max_pos, 0, ConfigError, "llama3 rope_scaling original_max_position_embeddings");
  }
}

}  // namespace dtrain::model
