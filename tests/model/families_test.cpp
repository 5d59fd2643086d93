// The Llama family (llama with RoPE scaling / biases / head_dim, qwen2, qwen3, mistral):
// config.json as the public checkpoints write it, refusals by name of what would change the
// math, round trips, and the model's own behaviour for each feature (layouts, the sliding
// window's reach, LoRA over biased projections). The numbers against an independent
// reference are hf_family_parity_test's (scripts/compare_pytorch.py --parity).
#include "model/model.h"
#include "model/peft.h"

#include "core/error.h"
#include "core/rng.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dtrain;
using namespace dtrain::model;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string config_error(const json& j) {
  try {
    hf_config_from_json(j, "cfg.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The config.json files of Llama-3.2-1B, Qwen2.5-0.5B, Qwen3-0.6B and Mistral-7B-v0.1 as
// published (fields that do not change the math trimmed).
const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
  "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 128256})";
const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
  "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})";

ModelConfig tiny(ModelConfig::Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 50;
  c.max_seq_len = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 48;
  c.qkv_bias = arch == ModelConfig::Arch::QWEN2;
  c.qk_norm = arch == ModelConfig::Arch::QWEN3;
  c.tie_embeddings = false;
  return c;
}

std::vector<int32_t> tokens(int n, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(r.below(50));
  return t;
}

}  // namespace

TEST_CASE("the public checkpoints' config.json files parse as their family") {
  const HfModelConfig l = hf_config_from_json(json::parse(kLlama32), "Llama-3.2-1B/config.json");
  CHECK(l.arch == "llama");
  CHECK(l.tie_embeddings);
  CHECK(l.head_dim == 0);  // 64 == 2048 / 32: the derived value
  CHECK(l.rope_scaling == ModelConfig::RopeScaling::LLAMA3);
  CHECK(l.rope_factor == 32.0f);
  CHECK(l.rope_low_freq_factor == 1.0f);
  CHECK(l.rope_high_freq_factor == 4.0f);
  CHECK(l.rope_original_max_pos == 8192);
  CHECK(!l.qkv_bias);

  const HfModelConfig q2 = hf_config_from_json(json::parse(kQwen25), "Qwen2.5-0.5B/config.json");
  CHECK(q2.arch == "qwen2");
  CHECK(q2.qkv_bias);
  CHECK(!q2.o_bias);
  CHECK(q2.tie_embeddings);
  CHECK(q2.sliding_window == 0);  // use_sliding_window false
  CHECK(q2.rope_theta == 1000000.0f);

  const HfModelConfig q3 = hf_config_from_json(json::parse(kQwen3), "Qwen3-0.6B/config.json");
  CHECK(q3.arch == "qwen3");
  CHECK(q3.head_dim == 128);  // != 1024 / 16
  CHECK(q3.qk_norm);
  CHECK(!q3.qkv_bias);

  const HfModelConfig m = hf_config_from_json(json::parse(kMistral), "Mistral-7B-v0.1/config.json");
  CHECK(m.arch == "mistral");
  CHECK(m.sliding_window == 4096);
  json v03 = json::parse(kMistral);
  v03["sliding_window"] = nullptr;  // Mistral 7B v0.2 on: no window
  CHECK(hf_config_from_json(v03, "cfg.json").sliding_window == 0);
  v03.erase("sliding_window");  // MistralConfig's default
  CHECK(hf_config_from_json(v03, "cfg.json").sliding_window == 4096);
  json q3d = json::parse(kQwen3);
  q3d.erase("head_dim");  // Qwen3Config's default is 128 too
  CHECK(hf_config_from_json(q3d, "cfg.json").head_dim == 128);
}

// The 7-8B config.json files examples/ plans with (tests/data/hf_configs; their parameter
// counts are train_memory_plan_test's): each parses as its family with the features that
// family's checkpoint has.
TEST_CASE("the examples' Llama-3.1-8B, Qwen2.5-7B, Qwen3-8B and Mistral-7B-v0.3 config.json parse as their family") {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  const fs::path dir = fs::path(src && *src ? src : ".") / "tests" / "data" / "hf_configs";
  auto read = [&](const char* model) {
    const std::string path = (dir / model / "config.json").string();
    return hf_config_read(path);
  };
  const HfModelConfig l = read("llama3.1-8b");
  CHECK(l.arch == "llama");
  CHECK(l.rope_scaling == ModelConfig::RopeScaling::LLAMA3);
  CHECK(l.rope_factor == 8.0f);
  CHECK(l.rope_original_max_pos == 8192);
  CHECK(l.rope_theta == 500000.0f);
  CHECK(!l.tie_embeddings);
  CHECK(l.n_kv_head == 8);
  const HfModelConfig q2 = read("qwen2.5-7b");
  CHECK(q2.arch == "qwen2");
  CHECK(q2.qkv_bias);
  CHECK(!q2.tie_embeddings);  // tied only on the small Qwen2.5 models
  CHECK(q2.sliding_window == 0);
  CHECK(q2.n_kv_head == 4);
  const HfModelConfig q3 = read("qwen3-8b");
  CHECK(q3.arch == "qwen3");
  CHECK(q3.qk_norm);
  CHECK((q3.head_dim ? q3.head_dim : q3.d_model / q3.n_head) == 128);  // 0: derived, 4096 / 32
  CHECK(!q3.tie_embeddings);
  const HfModelConfig m = read("mistral-7b");
  CHECK(m.arch == "mistral");
  CHECK(m.sliding_window == 0);  // v0.3: null
  CHECK(m.vocab_size == 32768);  // v0.3's extended vocabulary
  CHECK(m.rope_theta == 1000000.0f);
}

TEST_CASE("every config.json field that would change the math and is not computed is refused by name") {
  const json llama = json::parse(kLlama32), qwen2 = json::parse(kQwen25), qwen3 = json::parse(kQwen3),
             mistral = json::parse(kMistral);
  auto with = [](json j, const char* key, json v) {
    j[key] = std::move(v);
    return j;
  };
  CHECK(config_error(with(llama, "model_type", "gemma")).find("model_type 'gemma' is not supported") !=
        std::string::npos);
  for (const char* t : {"yarn", "longrope", "su", "mrope"})
    CHECK(config_error(with(llama, "rope_scaling", json{{"rope_type", t}, {"factor", 4.0}}))
              .find(std::string("rope_scaling rope_type '") + t + "' is not supported") != std::string::npos);
  CHECK(config_error(with(qwen2, "rope_scaling",
                          json{{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}))
            .find("'yarn'") != std::string::npos);
  CHECK(config_error(with(llama, "rope_scaling", json{{"rope_type", "linear"}})).find("needs 'factor'") !=
        std::string::npos);
  CHECK(config_error(with(llama, "rope_scaling",
                          json{{"rope_type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 8192}}))
            .find("original_max_position_embeddings") != std::string::npos);
  CHECK(config_error(with(llama, "rope_scaling",
                          json{{"rope_type", "llama3"},
                               {"factor", 8.0},
                               {"low_freq_factor", 4.0},
                               {"high_freq_factor", 1.0},
                               {"original_max_position_embeddings", 8192}}))
            .find("high_freq_factor > low_freq_factor") != std::string::npos);
  CHECK(config_error(with(llama, "partial_rotary_factor", 0.5)).find("partial_rotary_factor") != std::string::npos);
  CHECK(config_error(with(qwen2, "use_sliding_window", true)).find("use_sliding_window") != std::string::npos);
  CHECK(config_error(with(qwen3, "use_sliding_window", true)).find("use_sliding_window") != std::string::npos);
  CHECK(config_error(with(mistral, "attention_bias", true)).find("attention_bias") != std::string::npos);
  CHECK(config_error(with(qwen3, "mlp_bias", true)).find("mlp_bias") != std::string::npos);
  CHECK(config_error(with(llama, "sliding_window", 128)).find("sliding_window") != std::string::npos);
  CHECK(config_error(with(mistral, "sliding_window", 0)).find("sliding_window") != std::string::npos);
  CHECK(config_error(with(qwen2, "hidden_act", "gelu")).find("hidden_act 'gelu'") != std::string::npos);
  // what is computed is accepted
  CHECK(config_error(with(llama, "rope_scaling", json{{"rope_type", "dynamic"}, {"factor", 2.0}})).empty());
  CHECK(config_error(with(llama, "mlp_bias", true)).empty());
  CHECK(config_error(with(qwen3, "attention_bias", true)).empty());
}

TEST_CASE("RoPE given twice (rope_theta / rope_parameters / rope_scaling): refused by name unless they agree") {
  // Issue 43, item 15: rope_parameters.rope_theta 500000 beside rope_theta 10000 used 10000,
  // rope_parameters factor 2 beside rope_scaling factor 4 used 2, both silently.
  const json mistral = json::parse(kMistral);  // rope_theta 10000, no scaling
  json j = mistral;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  std::string e = config_error(j);
  CHECK(e.find("cfg.json: rope_theta = 10000.0 and rope_parameters.rope_theta = 500000.0 disagree") !=
        std::string::npos);
  j["rope_parameters"]["rope_theta"] = 10000;  // the same base twice: fine
  CHECK(config_error(j).empty());
  j.erase("rope_theta");  // v5: the base only in rope_parameters
  j["rope_parameters"]["rope_theta"] = 500000.0;
  CHECK(hf_config_from_json(j, "cfg.json").rope_theta == 500000.0f);

  json k = mistral;
  k["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  k["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  e = config_error(k);
  CHECK(e.find("cfg.json: rope_scaling {\"factor\":4.0,\"rope_type\":\"linear\"} and rope_parameters "
               "{\"factor\":2.0,\"rope_type\":\"linear\"} disagree") != std::string::npos);
  CHECK(e.find("remove the one the model was not trained with") != std::string::npos);
  k["rope_parameters"] = {{"rope_type", "default"}};  // scaled in one, plain in the other
  CHECK(!config_error(k).empty());
  k["rope_parameters"] = {{"type", "linear"}, {"factor", 4}, {"rope_theta", 10000.0}};  // the same settings
  CHECK(config_error(k).empty());
  CHECK(hf_config_from_json(k, "cfg.json").rope_factor == 4.0f);
}

TEST_CASE("each family's config.json round trips through dtrain's writer") {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_families_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* text : {kLlama32, kQwen25, kQwen3, kMistral}) {
    HfModelConfig c = hf_config_from_json(json::parse(text), "in.json");
    if (c.arch == "llama") {
      c.qkv_bias = c.o_bias = c.mlp_bias = true;  // every llama option at once
      c.head_dim = 128;
    }
    const std::string path = (dir / (c.arch + ".json")).string();
    hf_config_write(path, c);
    const json j = json::parse(std::ifstream(path));
    const HfModelConfig b = hf_config_read(path);
    CHECK(b.arch == c.arch);
    CHECK(j["model_type"] == c.arch);
    CHECK(b.head_dim == c.head_dim);
    CHECK(b.qkv_bias == c.qkv_bias);
    CHECK(b.o_bias == c.o_bias);
    CHECK(b.mlp_bias == c.mlp_bias);
    CHECK(b.qk_norm == c.qk_norm);
    CHECK(b.sliding_window == c.sliding_window);
    CHECK(b.rope_scaling == c.rope_scaling);
    CHECK(b.rope_factor == c.rope_factor);
    CHECK(b.rope_original_max_pos == c.rope_original_max_pos);
    CHECK(b.tie_embeddings == c.tie_embeddings);
    CHECK(b.rope_theta == c.rope_theta);
  }
  fs::remove_all(dir);
}

TEST_CASE("layouts carry each family's tensors under HF's names") {
  auto names = [](const ModelConfig& c) {
    std::vector<std::string> n;
    const std::vector<BufferLayout> lays = layout_build(c);
    for (const auto& t : lays[1].tensors) n.push_back(t.name);
    return n;
  };
  auto has = [](const std::vector<std::string>& n, const std::string& s) {
    return std::find(n.begin(), n.end(), "model.layers.0." + s) != n.end();
  };
  const auto q2 = names(tiny(ModelConfig::Arch::QWEN2));
  CHECK(has(q2, "self_attn.q_proj.bias"));
  CHECK(has(q2, "self_attn.v_proj.bias"));
  CHECK(!has(q2, "self_attn.o_proj.bias"));
  ModelConfig q3c = tiny(ModelConfig::Arch::QWEN3);
  q3c.head_size = 12;  // != 32 / 4
  const auto lay = layout_build(q3c)[1];
  CHECK(lay.find("model.layers.0.self_attn.q_norm.weight")->shape == std::vector<int64_t>{12});
  CHECK(lay.find("model.layers.0.self_attn.q_proj.weight")->shape == std::vector<int64_t>{48, 32});
  CHECK(lay.find("model.layers.0.self_attn.o_proj.weight")->shape == std::vector<int64_t>{32, 48});
  ModelConfig lb = tiny(ModelConfig::Arch::LLAMA);
  lb.qkv_bias = lb.o_bias = lb.mlp_bias = true;
  const auto ll = names(lb);
  for (const char* m : {"self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.down_proj.bias"}) CHECK(has(ll, m));
  // inconsistent family features are the config's error, not a silent mix
  ModelConfig bad = tiny(ModelConfig::Arch::MISTRAL);
  bad.qkv_bias = true;
  CHECK_THROWS_AS(bad.validate(), ConfigError);
  bad = tiny(ModelConfig::Arch::LLAMA);
  bad.sliding_window = 4;
  CHECK_THROWS_AS(bad.validate(), ConfigError);
}

TEST_CASE("mistral's sliding window reaches exactly window tokens back") {
  // Same weights with and without the window: positions t < window see the same keys
  // (equal logits); later ones lose keys (different logits). The gradients stay finite.
  const int W = 5, T = 16;
  ModelConfig c = tiny(ModelConfig::Arch::MISTRAL);
  ModelConfig cw = c;
  cw.sliding_window = W;
  Model a(c), b(cw);
  a.init_weights(3);
  b.weights_copy_from(a);
  const auto tok = tokens(T, 11);
  std::vector<int32_t> tgt(tok.begin() + 1, tok.end());
  tgt.push_back(0);
  a.forward(tok.data(), tgt.data(), 1, T);
  b.forward(tok.data(), tgt.data(), 1, T);
  const int V = c.vocab_size;
  for (int t = 0; t < T; ++t) {
    float diff = 0;
    for (int v = 0; v < V; ++v) diff = std::max(diff, std::fabs(a.logits()[t * V + v] - b.logits()[t * V + v]));
    if (t < W) CHECK(diff == 0.0f);
    else CHECK(diff > 0.0f);
  }
  b.backward();
  for (const auto& pb : b.params())
    for (size_t i = 0; i < pb.size; ++i) REQUIRE(std::isfinite(pb.grad[i]));
}

TEST_CASE("LoRA over qwen2's biased projections: biases stay frozen, the merge keeps the function") {
  ModelConfig c = tiny(ModelConfig::Arch::QWEN2);
  Model m(c);
  m.init_weights(5);
  // biases non-zero so they matter
  float* qb = static_cast<float*>(m.tensor("model.layers.1.self_attn.q_proj.bias").data);
  for (int i = 0; i < 32; ++i) qb[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  LoraConfig l;
  l.rank = 4;
  l.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  m.lora_enable(l);
  for (auto& pb : m.lora_params()) {  // B != 0 (PEFT starts it at 0): the adapters change the output
    float* h = pb.host_f32();
    for (size_t i = 0; i < pb.size; ++i)
      if (h[i] == 0.0f) h[i] = 0.01f * (static_cast<float>(i % 5) - 2.0f);
  }
  const auto tok = tokens(12, 2);
  std::vector<int32_t> tgt(tok.begin() + 1, tok.end());
  tgt.push_back(1);
  const float loss = m.forward(tok.data(), tgt.data(), 1, 12);
  std::vector<float> logits(m.logits(), m.logits() + 12 * c.vocab_size);
  m.backward();
  for (const auto& pb : m.params()) CHECK(pb.grad == nullptr);  // the base, biases included, is frozen
  const std::vector<float> bias_before(qb, qb + 32);
  m.lora_merge();
  const float merged = m.forward(tok.data(), tgt.data(), 1, 12);
  CHECK(merged == doctest::Approx(loss).epsilon(1e-5));
  float worst = 0;
  for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(logits[i] - m.logits()[i]));
  CHECK(worst < 1e-4f);
  const float* qb2 = static_cast<float*>(m.tensor("model.layers.1.self_attn.q_proj.bias").data);
  CHECK(std::equal(bias_before.begin(), bias_before.end(), qb2));
}
