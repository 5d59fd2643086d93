// HF config.json (GPT-2, Llama) and PEFT adapter_config.json: round trips, real-world
// files as transformers/PEFT write them, and clear rejections of malformed or
// unsupported files.
#include "temp_dir.h"
#include "model/peft.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace dtrain;
using namespace dtrain::model;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using dtrain::test::TempDir;

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::trunc);
  out << s;
}

std::string config_error(const json& j) {
  try {
    hf_config_from_json(j, "cfg.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string peft_error(const json& j) {
  try {
    peft_config_from_json(j, "adapter_config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The config.json of the "gpt2" checkpoint as transformers writes it.
const char* kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

// A TinyLlama-style config.json.
const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
  "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0", "use_cache": true, "vocab_size": 32000})";

}  // namespace

TEST_CASE("reads transformers' GPT-2 and Llama config.json") {
  const HfModelConfig g = hf_config_from_json(json::parse(kGpt2), "gpt2/config.json");
  CHECK(g.arch == "gpt2");
  CHECK(g.vocab_size == 50257);
  CHECK(g.max_seq_len == 1024);
  CHECK(g.n_layer == 12);
  CHECK(g.n_head == 12);
  CHECK(g.n_kv_head == 12);
  CHECK(g.d_model == 768);
  CHECK(g.d_ff == 3072);
  CHECK(g.norm_eps == 1e-5f);
  CHECK(g.tie_embeddings);
  CHECK(g.bos_token_id == 50256);
  CHECK(g.torch_dtype == "float32");

  const HfModelConfig l = hf_config_from_json(json::parse(kLlama), "llama/config.json");
  CHECK(l.arch == "llama");
  CHECK(l.n_kv_head == 4);
  CHECK(l.d_ff == 5632);
  CHECK(l.max_seq_len == 2048);
  CHECK(l.norm_eps == 1e-5f);
  CHECK(l.rope_theta == 10000.0f);
  CHECK_FALSE(l.tie_embeddings);
  CHECK(l.torch_dtype == "bfloat16");
  CHECK(l.eos_token_id == 2);
}

TEST_CASE("config.json round trips through a file") {
  TempDir dir;
  for (const char* arch : {"gpt2", "llama"}) {
    HfModelConfig c;
    c.arch = arch;
    c.vocab_size = 1000;
    c.max_seq_len = 256;
    c.n_layer = 3;
    c.n_head = 8;
    c.n_kv_head = c.arch == "gpt2" ? 8 : 2;
    c.d_model = 128;
    c.d_ff = c.arch == "gpt2" ? 512 : 344;
    c.norm_eps = c.arch == "gpt2" ? 1e-5f : 1e-6f;
    c.rope_theta = 500000.0f;
    c.tie_embeddings = c.arch == "gpt2";
    c.torch_dtype = "bfloat16";
    c.eos_token_id = 7;
    const std::string path = (dir.path / (std::string(arch) + ".json")).string();
    hf_config_write(path, c);
    const HfModelConfig back = hf_config_read(path);
    CHECK(back.arch == c.arch);
    CHECK(back.vocab_size == c.vocab_size);
    CHECK(back.max_seq_len == c.max_seq_len);
    CHECK(back.n_layer == c.n_layer);
    CHECK(back.n_head == c.n_head);
    CHECK(back.n_kv_head == c.n_kv_head);
    CHECK(back.d_model == c.d_model);
    CHECK(back.d_ff == c.d_ff);
    CHECK(back.norm_eps == c.norm_eps);
    CHECK(back.tie_embeddings == c.tie_embeddings);
    CHECK(back.torch_dtype == "bfloat16");
    CHECK(back.bos_token_id == -1);
    CHECK(back.eos_token_id == 7);
    if (c.arch == "llama") CHECK(back.rope_theta == c.rope_theta);
  }
  HfModelConfig g;
  g.arch = "gpt2";
  g.vocab_size = 10;
  g.max_seq_len = 8;
  g.n_layer = g.n_head = g.n_kv_head = 1;
  g.d_model = 4;
  g.d_ff = 16;
  g.norm_eps = 1e-5f;
  const json j = hf_config_to_json(g);
  CHECK(j["n_inner"].is_null());  // 4 * n_embd
  CHECK(j["layer_norm_epsilon"].dump() == "1e-05");
  CHECK(j["architectures"] == json::array({"GPT2LMHeadModel"}));
}

TEST_CASE("malformed or unsupported config.json is rejected clearly") {
  TempDir dir;
  const fs::path p = dir.path / "config.json";
  spit(p, "{\"model_type\": \"gpt2\",\n  \"n_embd\": 768,,}");
  try {
    hf_config_read(p.string());
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    CHECK(msg.find(p.string()) != std::string::npos);
    CHECK(msg.find("line 2") != std::string::npos);
  }
  spit(p, "[1]");
  CHECK_THROWS_AS(hf_config_read(p.string()), ConfigError);
  CHECK_THROWS_AS(hf_config_read((dir.path / "missing.json").string()), ConfigError);  // the input rule

  const json gpt2 = json::parse(kGpt2), llama = json::parse(kLlama);
  auto with = [](json j, const char* key, json v) {
    j[key] = std::move(v);
    return j;
  };
  auto without = [](json j, const char* key) {
    j.erase(key);
    return j;
  };
  CHECK(config_error(with(gpt2, "model_type", "bert")).find("model_type 'bert'") != std::string::npos);
  CHECK(config_error(without(gpt2, "n_embd")).find("missing key 'n_embd'") != std::string::npos);
  CHECK(config_error(with(gpt2, "n_head", "12")).find("'n_head' must be a positive integer") != std::string::npos);
  CHECK(config_error(with(gpt2, "n_head", 0)).find("n_head") != std::string::npos);
  CHECK(config_error(with(gpt2, "n_head", 7)).find("divisible") != std::string::npos);
  CHECK(config_error(with(gpt2, "activation_function", "relu")).find("relu") != std::string::npos);
  CHECK(config_error(with(gpt2, "scale_attn_by_inverse_layer_idx", true)).find("inverse") != std::string::npos);
  CHECK(config_error(with(gpt2, "layer_norm_epsilon", "x")).find("layer_norm_epsilon") != std::string::npos);
  CHECK(config_error(with(llama, "num_key_value_heads", 5)).find("key/value") != std::string::npos);
  CHECK(config_error(with(llama, "rope_scaling", json{{"type", "linear"}, {"factor", 2.0}})).empty());
  CHECK(config_error(with(llama, "rope_scaling", json{{"type", "yarn"}, {"factor", 2.0}})).find("rope_type 'yarn'") !=
        std::string::npos);
  CHECK(config_error(with(llama, "hidden_act", "gelu")).find("hidden_act") != std::string::npos);
  CHECK(config_error(with(llama, "attention_bias", true)).empty());  // supported: q/k/v/o biases
  CHECK(config_error(with(llama, "attention_bias", "yes")).find("attention_bias") != std::string::npos);
  CHECK(hf_config_from_json(with(llama, "head_dim", 128), "cfg.json").head_dim == 128);  // != 2048 / 32
  CHECK(config_error(with(llama, "torch_dtype", "int8")).find("torch_dtype") != std::string::npos);
  CHECK(config_error(with(llama, "head_dim", 64)).empty());
  // rope_type "default" (transformers' rope_scaling / v5's rope_parameters) is plain RoPE
  CHECK(config_error(with(llama, "rope_scaling", json{{"rope_type", "default"}})).empty());
  CHECK(config_error(with(llama, "rope_parameters", json{{"rope_type", "llama3"}, {"factor", 8.0}}))
            .find("rope_parameters rope_type 'llama3' needs 'low_freq_factor'") != std::string::npos);
  CHECK(config_error(with(llama, "rope_scaling", json{{"factor", 2.0}})).find("rope_scaling") != std::string::npos);
  {
    json v5 = without(llama, "rope_theta");
    v5["rope_parameters"] = json{{"rope_type", "default"}, {"rope_theta", 500000.0}};
    CHECK(hf_config_from_json(v5, "v5/config.json").rope_theta == doctest::Approx(500000.0));
    v5["rope_parameters"]["rope_theta"] = "x";
    CHECK(config_error(v5).find("rope_parameters.rope_theta") != std::string::npos);
  }
  CHECK(config_error(without(llama, "num_key_value_heads")).empty());
}

TEST_CASE("adapter_config.json round trip and PEFT's own layout") {
  TempDir dir;
  LoraAdapterConfig c;
  c.r = 16;
  c.lora_alpha = 32.0f;
  c.lora_dropout = 0.05f;
  c.target_modules = {"c_attn", "c_proj"};
  c.base_model_name_or_path = "gpt2";
  c.fan_in_fan_out = true;
  const std::string path = (dir.path / "adapter_config.json").string();
  peft_config_write(path, c);
  const LoraAdapterConfig back = peft_config_read(path);
  CHECK(back.r == 16);
  CHECK(back.lora_alpha == 32.0f);
  CHECK(back.lora_dropout == 0.05f);
  CHECK(back.target_modules == c.target_modules);
  CHECK(back.base_model_name_or_path == "gpt2");
  CHECK(back.fan_in_fan_out);
  const json j = peft_config_to_json(c);
  CHECK(j["peft_type"] == "LORA");
  CHECK(j["task_type"] == "CAUSAL_LM");
  CHECK(j["bias"] == "none");
  CHECK(j["lora_alpha"].is_number_integer());
  CHECK(j["lora_dropout"].dump() == "0.05");

  // As PEFT 0.10 writes it for a Llama adapter.
  const json peft = json::parse(R"({
    "alpha_pattern": {}, "auto_mapping": null, "base_model_name_or_path": "TinyLlama/TinyLlama-1.1B",
    "bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
    "layer_replication": null, "layers_pattern": null, "layers_to_transform": null, "loftq_config": {},
    "lora_alpha": 16, "lora_dropout": 0.1, "megatron_config": null, "megatron_core": "megatron.core",
    "modules_to_save": null, "peft_type": "LORA", "r": 8, "rank_pattern": {}, "revision": null,
    "target_modules": ["v_proj", "q_proj"], "task_type": "CAUSAL_LM", "use_dora": false, "use_rslora": false})");
  const LoraAdapterConfig l = peft_config_from_json(peft, "a.json");
  CHECK(l.r == 8);
  CHECK(l.lora_alpha == 16.0f);
  CHECK(l.target_modules == std::vector<std::string>{"v_proj", "q_proj"});
  CHECK_FALSE(l.fan_in_fan_out);

  auto with = [&](const char* key, json v) {
    json k = peft;
    k[key] = std::move(v);
    return k;
  };
  CHECK(peft_error(with("peft_type", "PREFIX_TUNING")).find("PREFIX_TUNING") != std::string::npos);
  CHECK(peft_error(with("task_type", "SEQ_CLS")).find("SEQ_CLS") != std::string::npos);
  CHECK(peft_error(with("bias", "all")).find("bias") != std::string::npos);
  CHECK(peft_error(with("use_dora", true)).find("DoRA") != std::string::npos);
  CHECK(peft_error(with("use_rslora", true)).find("use_rslora") != std::string::npos);
  CHECK(peft_error(with("r", 0)).find("'r'") != std::string::npos);
  CHECK(peft_error(with("target_modules", "all-linear")).find("target_modules") != std::string::npos);
  CHECK(peft_error(with("target_modules", json::array())).find("target_modules") != std::string::npos);
  CHECK(peft_error(with("rank_pattern", json{{"q_proj", 4}})).find("rank_pattern") != std::string::npos);
  CHECK(peft_error(with("modules_to_save", json::array({"lm_head"}))).find("modules_to_save") != std::string::npos);
  CHECK(peft_error(with("lora_dropout", 1.5)).find("lora_dropout") != std::string::npos);
  json no_tm = peft;
  no_tm.erase("target_modules");
  CHECK(peft_error(no_tm).find("missing key 'target_modules'") != std::string::npos);
  CHECK(peft_error(json::array()).find("object") != std::string::npos);
}
