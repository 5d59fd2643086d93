// config.json / adapter_config.json mapping. Floats are written through their shortest
// decimal form so 1e-5f appears as 1e-05 rather than 9.99999974737875e-06.
#include "model/peft.h"

#include "core/check.h"
#include "core/input_file.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <unistd.h>
#include <vector>

namespace dtrain::model {

using nlohmann::json;

namespace {

// ----------------------------------------------------------------------------
double short_double(float f) { return std::stod(fmt::format("{}", f)); }

json number_of(float f) {
  if (std::floor(f) == f && std::fabs(f) < 1e9f) return static_cast<int64_t>(f);
  return short_double(f);
}

// Typed lookups that name the file and the key.
struct Reader {
  const json& j;
  const std::string& src;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  int positive_int(const char* key) const {
    DT_ENFORCE(j.contains(key), ConfigError, "{}: missing key '{}'", src, key);
    const json& v = j.at(key);
    DT_ENFORCE(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= INT32_MAX, ConfigError,
               "{}: '{}' must be a positive integer, got {}", src, key, v.dump());
    return v.get<int>();
  }
  float number(const char* key, float dflt) const {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    DT_ENFORCE(v.is_number(), ConfigError, "{}: '{}' must be a number, got {}", src, key, v.dump());
    return v.get<float>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    DT_ENFORCE(v.is_boolean(), ConfigError, "{}: '{}' must be true or false, got {}", src, key, v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    DT_ENFORCE(v.is_string(), ConfigError, "{}: '{}' must be a string, got {}", src, key, v.dump());
    return v.get<std::string>();
  }
  int token_id(const char* key) const {
    if (!has(key)) return -1;
    const json& v = j.at(key);
    if (v.is_array()) return -1;  // several eos ids (newer Llama configs): not representable, not needed
    DT_ENFORCE(v.is_number_integer() && v.get<int64_t>() >= 0, ConfigError,
               "{}: '{}' must be a non-negative integer, got {}", src, key, v.dump());
    return v.get<int>();
  }
};

json parse_file(const std::string& path) {
  const std::string text = input_file_read(path, "model file", kInputMetaMaxBytes);
  try {
    json j = json::parse(text);
    DT_ENFORCE(j.is_object(), ConfigError, "{}: expected a JSON object at the top level", path);
    return j;
  } catch (const json::parse_error& e) {
    DT_THROW(ConfigError, "{}: invalid JSON: {}", path, e.what());
  }
}

void write_file(const std::string& path, const json& j) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) DT_THROW(IoError, "cannot create {}: {}", tmp, std::strerror(errno));
    out << j.dump(2) << '\n';
    out.flush();
    if (!out) {
      ::unlink(tmp.c_str());
      DT_THROW(IoError, "cannot write {}", tmp);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
}

void check_dtype(const std::string& d, const std::string& src) {
  DT_ENFORCE(d == "float32" || d == "bfloat16" || d == "float16", ConfigError,
             "{}: torch_dtype '{}' is not one of float32, bfloat16, float16", src, d);
}

// ----------------------------------------------------------------------------
// The Llama family's config.json (LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig as
// transformers writes them).

double positive_number(const json& v, const std::string& what, const std::string& src) {
  DT_ENFORCE(v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()), ConfigError,
             "{}: {} must be a positive number, got {}", src, what, v.dump());
  return v.get<double>();
}

// rope_scaling (and v5's rope_parameters): default, linear, dynamic and llama3 are computed
// exactly as transformers' ROPE_INIT_FUNCTIONS; any other type is refused by name.
void rope_read(const json& j, const char* key, HfModelConfig& c, const std::string& src) {
  const json& rp = j.at(key);
  DT_ENFORCE(rp.is_object(), ConfigError, "{}: {} must be an object or null, got {}", src, key, rp.dump());
  const json* type = rp.contains("rope_type") ? &rp.at("rope_type") : rp.contains("type") ? &rp.at("type") : nullptr;
  DT_ENFORCE(type && type->is_string(), ConfigError, "{}: {} {} has no rope_type", src, key, rp.dump());
  const std::string t = type->get<std::string>();
  const std::string where = std::string(key) + ".";
  auto need = [&](const char* f) -> double {
    DT_ENFORCE(rp.contains(f) && !rp.at(f).is_null(), ConfigError, "{}: {} rope_type '{}' needs '{}'", src, key, t, f);
    return positive_number(rp.at(f), where + f, src);
  };
  if (rp.contains("partial_rotary_factor"))
    DT_ENFORCE(rp.at("partial_rotary_factor").is_number() && rp.at("partial_rotary_factor").get<double>() == 1.0,
               ConfigError, "{}: {}partial_rotary_factor {} is not supported (dtrain rotates the whole head)", src,
               where, rp.at("partial_rotary_factor").dump());
  using RS = ModelConfig::RopeScaling;
  if (t == "default") {
    c.rope_scaling = RS::NONE;
  } else if (t == "linear") {
    c.rope_scaling = RS::LINEAR;
    c.rope_factor = static_cast<float>(need("factor"));
  } else if (t == "dynamic") {
    // Dynamic NTK changes the base only once a sequence is longer than
    // max_position_embeddings (transformers' dynamic_rope_update); dtrain never runs one,
    // so this is plain RoPE at every length it trains, exactly. An original length below
    // max_position_embeddings would make that depend on the transformers version: refused.
    c.rope_scaling = RS::DYNAMIC;
    c.rope_factor = static_cast<float>(need("factor"));
    if (rp.contains("original_max_position_embeddings") && !rp.at("original_max_position_embeddings").is_null())
      DT_ENFORCE(rp.at("original_max_position_embeddings").is_number_integer() &&
                     rp.at("original_max_position_embeddings").get<int64_t>() >= c.max_seq_len,
                 ConfigError,
                 "{}: {} dynamic with original_max_position_embeddings {} below max_position_embeddings {} is not "
                 "supported (the scaled base would apply inside the trained lengths)",
                 src, key, rp.at("original_max_position_embeddings").dump(), c.max_seq_len);
  } else if (t == "llama3") {
    c.rope_scaling = RS::LLAMA3;
    c.rope_factor = static_cast<float>(need("factor"));
    c.rope_low_freq_factor = static_cast<float>(need("low_freq_factor"));
    c.rope_high_freq_factor = static_cast<float>(need("high_freq_factor"));
    const double omax = need("original_max_position_embeddings");
    DT_ENFORCE(omax == std::floor(omax) && omax <= INT32_MAX, ConfigError,
               "{}: {}original_max_position_embeddings must be an integer", src, where);
    c.rope_original_max_pos = static_cast<int>(omax);
    DT_ENFORCE(c.rope_high_freq_factor > c.rope_low_freq_factor, ConfigError,
               "{}: {} llama3 needs high_freq_factor > low_freq_factor", src, key);
  } else {
    DT_THROW(ConfigError,
             "{}: {} rope_type '{}' is not supported; dtrain computes RoPE types default, linear, dynamic and llama3",
             src, key, t);
  }
}

// The scaling fields that the type uses, equal.
bool rope_same(const HfModelConfig& a, const HfModelConfig& b) {
  using RS = ModelConfig::RopeScaling;
  if (a.rope_scaling != b.rope_scaling) return false;
  if (a.rope_scaling != RS::NONE && a.rope_factor != b.rope_factor) return false;
  return a.rope_scaling != RS::LLAMA3 ||
         (a.rope_low_freq_factor == b.rope_low_freq_factor && a.rope_high_freq_factor == b.rope_high_freq_factor &&
          a.rope_original_max_pos == b.rope_original_max_pos);
}

// RoPE's base and scaling. transformers v5 writes both in rope_parameters, v4 the base
// top-level and the scaling in rope_scaling; a config.json may carry both spellings.
// Where they say different things, which one the model was trained with is unknown (and
// transformers versions pick differently): a ConfigError naming both, never a silent pick.
void rope_settings_read(const Reader& r, HfModelConfig& c) {
  const json& j = r.j;
  const std::string& src = r.src;
  struct Theta {
    std::string key;
    float value;
    std::string text;  // as the file writes it
  };
  std::vector<Theta> thetas;
  if (r.has("rope_theta"))
    thetas.push_back({"rope_theta", r.number("rope_theta", 10000.0f), j.at("rope_theta").dump()});
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (r.has(key) && j.at(key).is_object() && j.at(key).contains("rope_theta") &&
        !j.at(key).at("rope_theta").is_null()) {
      const std::string name = std::string(key) + ".rope_theta";
      const json& v = j.at(key).at("rope_theta");
      thetas.push_back({name, static_cast<float>(positive_number(v, name, src)), v.dump()});
    }
  for (size_t i = 1; i < thetas.size(); ++i)
    DT_ENFORCE(thetas[i].value == thetas[0].value, ConfigError,
               "{}: {} = {} and {} = {} disagree: the RoPE base must be given once (or the same in both); remove "
               "the one the model was not trained with",
               src, thetas[0].key, thetas[0].text, thetas[i].key, thetas[i].text);
  c.rope_theta = thetas.empty() ? 10000.0f : thetas[0].value;
  std::optional<HfModelConfig> first;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    HfModelConfig k = c;
    rope_read(j, key, k, src);
    if (!first) {
      first = k;
      continue;
    }
    DT_ENFORCE(rope_same(*first, k), ConfigError,
               "{}: rope_scaling {} and rope_parameters {} disagree: RoPE scaling must be given once (or the same in "
               "both); remove the one the model was not trained with",
               src, j.at("rope_scaling").dump(), j.at("rope_parameters").dump());
  }
  if (first) {
    c.rope_scaling = first->rope_scaling;
    c.rope_factor = first->rope_factor;
    c.rope_low_freq_factor = first->rope_low_freq_factor;
    c.rope_high_freq_factor = first->rope_high_freq_factor;
    c.rope_original_max_pos = first->rope_original_max_pos;
  }
}

void llama_family_read(const Reader& r, HfModelConfig& c) {
  const json& j = r.j;
  const std::string& src = r.src;
  const bool qwen = c.arch == "qwen2" || c.arch == "qwen3";
  c.vocab_size = r.positive_int("vocab_size");
  c.max_seq_len = r.positive_int("max_position_embeddings");
  c.n_layer = r.positive_int("num_hidden_layers");
  c.n_head = r.positive_int("num_attention_heads");
  c.n_kv_head = r.has("num_key_value_heads") ? r.positive_int("num_key_value_heads") : c.n_head;
  c.d_model = r.positive_int("hidden_size");
  c.d_ff = r.positive_int("intermediate_size");
  c.norm_eps = r.number("rms_norm_eps", 1e-6f);
  c.tie_embeddings = r.boolean("tie_word_embeddings", false);
  // head_dim: Qwen3Config's default is 128; the others derive it from the sizes.
  c.head_dim = r.has("head_dim") ? r.positive_int("head_dim") : c.arch == "qwen3" ? 128 : 0;
  if (c.head_dim * c.n_head == c.d_model) c.head_dim = 0;  // the derived value: nothing to keep
  const std::string act = r.string("hidden_act", "silu");
  DT_ENFORCE(act == "silu", ConfigError, "{}: hidden_act '{}' is not supported; dtrain's {} uses SwiGLU (silu)", src,
             act, c.arch);
  rope_settings_read(r, c);
  if (r.has("partial_rotary_factor"))
    DT_ENFORCE(j.at("partial_rotary_factor").is_number() && j.at("partial_rotary_factor").get<double>() == 1.0,
               ConfigError, "{}: partial_rotary_factor {} is not supported (dtrain rotates the whole head)", src,
               j.at("partial_rotary_factor").dump());
  if (c.arch == "qwen2") {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v always biased, o_proj never
  } else if (c.arch == "llama" || c.arch == "qwen3") {
    c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
  } else {
    DT_ENFORCE(!r.boolean("attention_bias", false), ConfigError, "{}: attention_bias true is not a {} option", src,
               c.arch);
  }
  if (c.arch == "llama") c.mlp_bias = r.boolean("mlp_bias", false);
  else DT_ENFORCE(!r.boolean("mlp_bias", false), ConfigError, "{}: mlp_bias true is not a {} option", src, c.arch);
  c.qk_norm = c.arch == "qwen3";
  if (qwen) {
    // Qwen2/Qwen3 keep sliding_window in every config but apply it only with
    // use_sliding_window (to the layers from max_window_layers on): that is refused.
    DT_ENFORCE(!r.boolean("use_sliding_window", false), ConfigError,
               "{}: use_sliding_window true is not supported for {} (dtrain's window is mistral's, on every layer)",
               src, c.arch);
    if (r.has("layer_types"))
      for (const json& t : j.at("layer_types"))
        DT_ENFORCE(t == "full_attention", ConfigError, "{}: layer_types {} is not supported (full_attention only)", src,
                   t.dump());
  } else if (c.arch == "mistral") {
    // MistralConfig's default is 4096; null (Mistral 7B v0.2 on) means no window.
    if (!j.contains("sliding_window")) {
      c.sliding_window = 4096;
    } else if (!j.at("sliding_window").is_null()) {
      c.sliding_window = r.positive_int("sliding_window");
    }
  } else {
    DT_ENFORCE(!r.has("sliding_window"), ConfigError, "{}: sliding_window is not a llama option", src);
  }
}

}  // namespace

// ----------------------------------------------------------------------------
json hf_config_to_json(const HfModelConfig& c) {
  ModelConfig::Arch arch{};
  DT_ENFORCE(arch_parse(c.arch, &arch), InternalError, "HfModelConfig.arch '{}' unknown", c.arch);
  check_dtype(c.torch_dtype, "HfModelConfig");
  json j;
  if (c.arch == "gpt2") {
    j = {{"activation_function", "gelu_new"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"attn_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"resid_pdrop", 0.0},
         {"summary_first_dropout", 0.0},
         {"initializer_range", 0.02},
         {"layer_norm_epsilon", short_double(c.norm_eps)},
         {"model_type", "gpt2"},
         {"n_ctx", c.max_seq_len},
         {"n_embd", c.d_model},
         {"n_head", c.n_head},
         {"n_inner", c.d_ff == 4 * c.d_model ? json(nullptr) : json(c.d_ff)},
         {"n_layer", c.n_layer},
         {"n_positions", c.max_seq_len},
         {"scale_attn_weights", true},
         {"use_cache", true},
         {"vocab_size", c.vocab_size}};
  } else {
    const bool qwen = c.arch == "qwen2" || c.arch == "qwen3";
    const char* cls = c.arch == "llama"   ? "LlamaForCausalLM"
                      : c.arch == "qwen2" ? "Qwen2ForCausalLM"
                      : c.arch == "qwen3" ? "Qwen3ForCausalLM"
                                          : "MistralForCausalLM";
    j = {{"architectures", {cls}},
         {"attention_dropout", 0.0},
         {"hidden_act", "silu"},
         {"hidden_size", c.d_model},
         {"initializer_range", 0.02},
         {"intermediate_size", c.d_ff},
         {"max_position_embeddings", c.max_seq_len},
         {"model_type", c.arch},
         {"num_attention_heads", c.n_head},
         {"num_hidden_layers", c.n_layer},
         {"num_key_value_heads", c.n_kv_head},
         {"rms_norm_eps", short_double(c.norm_eps)},
         {"rope_scaling", nullptr},
         {"rope_theta", short_double(c.rope_theta)},
         {"use_cache", true},
         {"vocab_size", c.vocab_size}};
    j["head_dim"] = c.head_dim > 0 ? c.head_dim : c.d_model / c.n_head;
    if (c.arch == "llama") {
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = c.mlp_bias;
      j["pretraining_tp"] = 1;
    } else if (c.arch == "qwen3") {
      j["attention_bias"] = c.qkv_bias;
    }
    if (qwen) {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layer;
    }
    if (c.arch == "mistral") j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    using RS = ModelConfig::RopeScaling;
    if (c.rope_scaling != RS::NONE) {
      json rs = {{"rope_type", rope_scaling_name(c.rope_scaling)}, {"factor", short_double(c.rope_factor)}};
      if (c.rope_scaling == RS::LLAMA3) {
        rs["low_freq_factor"] = short_double(c.rope_low_freq_factor);
        rs["high_freq_factor"] = short_double(c.rope_high_freq_factor);
        rs["original_max_position_embeddings"] = c.rope_original_max_pos;
      }
      j["rope_scaling"] = rs;
    }
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  return j;
}

HfModelConfig hf_config_from_json(const json& j, const std::string& src) {
  DT_ENFORCE(j.is_object(), ConfigError, "{}: expected a JSON object", src);
  const Reader r{j, src};
  HfModelConfig c;
  c.arch = r.string("model_type", "");
  if (c.arch == "gpt2") {
    c.vocab_size = r.positive_int("vocab_size");
    c.max_seq_len = r.positive_int("n_positions");
    c.n_layer = r.positive_int("n_layer");
    c.n_head = r.positive_int("n_head");
    c.n_kv_head = c.n_head;
    c.d_model = r.positive_int("n_embd");
    c.d_ff = r.has("n_inner") ? r.positive_int("n_inner") : 4 * c.d_model;
    c.norm_eps = r.number("layer_norm_epsilon", 1e-5f);
    c.tie_embeddings = r.boolean("tie_word_embeddings", true);
    const std::string act = r.string("activation_function", "gelu_new");
    DT_ENFORCE(act == "gelu_new" || act == "gelu_pytorch_tanh", ConfigError,
               "{}: activation_function '{}' is not supported; dtrain's GPT-2 uses the tanh GELU (gelu_new)", src, act);
    DT_ENFORCE(r.boolean("scale_attn_weights", true), ConfigError,
               "{}: scale_attn_weights false is not supported by dtrain's GPT-2", src);
    DT_ENFORCE(!r.boolean("scale_attn_by_inverse_layer_idx", false), ConfigError,
               "{}: scale_attn_by_inverse_layer_idx true is not supported by dtrain's GPT-2", src);
  } else if (c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "mistral") {
    llama_family_read(r, c);
  } else {
    DT_THROW(ConfigError,
             "{}: model_type '{}' is not supported; dtrain trains gpt2, llama, qwen2, qwen3 and mistral models", src,
             c.arch);
  }
  DT_ENFORCE(c.head_dim > 0 || c.d_model % c.n_head == 0, ConfigError,
             "{}: hidden size {} is not divisible by {} attention heads", src, c.d_model, c.n_head);
  DT_ENFORCE(c.n_head % c.n_kv_head == 0, ConfigError, "{}: {} attention heads are not divisible by {} key/value heads",
             src, c.n_head, c.n_kv_head);
  DT_ENFORCE(c.norm_eps > 0.0f && std::isfinite(c.norm_eps), ConfigError, "{}: the norm epsilon must be positive", src);
  DT_ENFORCE(c.rope_theta > 0.0f && std::isfinite(c.rope_theta), ConfigError, "{}: rope_theta must be positive", src);
  c.torch_dtype = r.string("torch_dtype", "float32");
  check_dtype(c.torch_dtype, src);
  c.bos_token_id = r.token_id("bos_token_id");
  c.eos_token_id = r.token_id("eos_token_id");
  return c;
}

void hf_config_write(const std::string& path, const HfModelConfig& cfg) { write_file(path, hf_config_to_json(cfg)); }
HfModelConfig hf_config_read(const std::string& path) { return hf_config_from_json(parse_file(path), path); }

// ----------------------------------------------------------------------------
json peft_config_to_json(const LoraAdapterConfig& c) {
  return {{"alpha_pattern", json::object()},
          {"auto_mapping", nullptr},
          {"base_model_name_or_path", c.base_model_name_or_path},
          {"bias", "none"},
          {"fan_in_fan_out", c.fan_in_fan_out},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"layers_pattern", nullptr},
          {"layers_to_transform", nullptr},
          {"lora_alpha", number_of(c.lora_alpha)},
          {"lora_dropout", number_of(c.lora_dropout)},
          {"modules_to_save", nullptr},
          {"peft_type", "LORA"},
          {"r", c.r},
          {"rank_pattern", json::object()},
          {"revision", nullptr},
          {"target_modules", c.target_modules},
          {"task_type", "CAUSAL_LM"},
          {"use_dora", false},
          {"use_rslora", false}};
}

LoraAdapterConfig peft_config_from_json(const json& j, const std::string& src) {
  DT_ENFORCE(j.is_object(), ConfigError, "{}: expected a JSON object", src);
  const Reader r{j, src};
  const std::string type = r.string("peft_type", "");
  DT_ENFORCE(type == "LORA", ConfigError, "{}: peft_type '{}' is not supported; dtrain reads LORA adapters", src, type);
  const std::string task = r.string("task_type", "CAUSAL_LM");
  DT_ENFORCE(task == "CAUSAL_LM", ConfigError, "{}: task_type '{}' is not supported; expected CAUSAL_LM", src, task);
  const std::string bias = r.string("bias", "none");
  DT_ENFORCE(bias == "none", ConfigError, "{}: bias '{}' is not supported; dtrain's LoRA trains no biases (\"none\")",
             src, bias);
  DT_ENFORCE(!r.boolean("use_dora", false), ConfigError, "{}: DoRA adapters (use_dora) are not supported", src);
  DT_ENFORCE(!r.boolean("use_rslora", false), ConfigError, "{}: rank-stabilised LoRA (use_rslora) is not supported",
             src);
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    DT_ENFORCE(!r.has(key) || (j.at(key).is_object() && j.at(key).empty()), ConfigError,
               "{}: per-module '{}' is not supported; every target uses r and lora_alpha", src, key);
  for (const char* key : {"layers_to_transform", "modules_to_save"})
    DT_ENFORCE(!r.has(key) || (j.at(key).is_array() && j.at(key).empty()), ConfigError, "{}: '{}' {} is not supported",
               src, key, j.at(key).dump());
  LoraAdapterConfig c;
  c.r = r.positive_int("r");
  c.lora_alpha = r.number("lora_alpha", 8.0f);
  c.lora_dropout = r.number("lora_dropout", 0.0f);
  DT_ENFORCE(c.lora_alpha > 0.0f, ConfigError, "{}: lora_alpha must be positive", src);
  DT_ENFORCE(c.lora_dropout >= 0.0f && c.lora_dropout < 1.0f, ConfigError, "{}: lora_dropout must be in [0, 1)", src);
  DT_ENFORCE(j.contains("target_modules"), ConfigError, "{}: missing key 'target_modules'", src);
  const json& tm = j.at("target_modules");
  DT_ENFORCE(tm.is_array() && !tm.empty(), ConfigError,
             "{}: target_modules must be a non-empty list of module names (regex strings and \"all-linear\" are not "
             "supported), got {}",
             src, tm.dump());
  for (const json& m : tm) {
    DT_ENFORCE(m.is_string() && !m.get<std::string>().empty(), ConfigError,
               "{}: target_modules entries must be non-empty strings, got {}", src, m.dump());
    c.target_modules.push_back(m.get<std::string>());
  }
  c.base_model_name_or_path = r.string("base_model_name_or_path", "");
  c.fan_in_fan_out = r.boolean("fan_in_fan_out", false);
  return c;
}

void peft_config_write(const std::string& path, const LoraAdapterConfig& cfg) {
  write_file(path, peft_config_to_json(cfg));
}
LoraAdapterConfig peft_config_read(const std::string& path) { return peft_config_from_json(parse_file(path), path); }

}  // namespace dtrain::model
