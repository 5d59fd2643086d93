// The example configs of the HF families (configs/qwen2.5-0.5b-sft.yaml, llama-3.2-1b-sft,
// qwen3-0.6b-lora, mistral-7b-lora) run end to end through the real CLI on a tiny random
// checkpoint of the same family written here (config.json as transformers writes it, F32
// safetensors; the mistral one sharded with model.safetensors.index.json), on the CPU with
// the byte tokenizer: two steps, then `dtrain export` writes the family's config.json back
// (and the adapter under LoRA).
#include "run_binary.h"

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace dtrain::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

void safetensors(const fs::path& p, const std::vector<Tensor>& ts) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + 4 * t.data.size()}}};
    off += 4 * t.data.size();
  }
  std::string hs = h.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');
  std::ofstream out(p, std::ios::binary);
  const uint64_t n = hs.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << hs;
  for (const auto& t : ts)
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(4 * t.data.size()));
}

// A tiny checkpoint of `cfg`'s family (hidden 32, 2 layers, vocab 512: the byte tokenizer's ids fit).
void checkpoint(const fs::path& dir, const json& cfg, bool sharded) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const std::string mt = cfg["model_type"];
  const int C = cfg["hidden_size"], NH = cfg["num_attention_heads"], NKV = cfg["num_key_value_heads"];
  const int F = cfg["intermediate_size"], V = cfg["vocab_size"];
  const int HD = cfg.contains("head_dim") ? cfg["head_dim"].get<int>() : C / NH;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<Tensor> ts;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float fill = NAN) {
    size_t k = 1;
    for (auto s : shape) k *= static_cast<size_t>(s);
    Tensor t{n, std::move(shape), std::vector<float>(k)};
    for (auto& x : t.data) x = std::isnan(fill) ? nd(rng) : fill;
    ts.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", {V, C});
  for (int l = 0; l < cfg["num_hidden_layers"].get<int>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, 1.0f);
    for (auto [m, out] : {std::pair{"q_proj", NH * HD}, std::pair{"k_proj", NKV * HD}, std::pair{"v_proj", NKV * HD}}) {
      add(p + "self_attn." + m + ".weight", {out, C});
      if (mt == "qwen2") add(p + "self_attn." + m + ".bias", {out});
    }
    add(p + "self_attn.o_proj.weight", {C, NH * HD});
    if (mt == "qwen3") {
      add(p + "self_attn.q_norm.weight", {HD}, 1.0f);
      add(p + "self_attn.k_norm.weight", {HD}, 1.0f);
    }
    add(p + "post_attention_layernorm.weight", {C}, 1.0f);
    add(p + "mlp.gate_proj.weight", {F, C});
    add(p + "mlp.up_proj.weight", {F, C});
    add(p + "mlp.down_proj.weight", {C, F});
  }
  add("model.norm.weight", {C}, 1.0f);
  if (!cfg.value("tie_word_embeddings", false)) add("lm_head.weight", {V, C});
  if (!sharded) {
    safetensors(dir / "model.safetensors", ts);
    return;
  }
  const size_t half = ts.size() / 2;
  json map = json::object();
  std::vector<Tensor> a(ts.begin(), ts.begin() + static_cast<std::ptrdiff_t>(half)),
      b(ts.begin() + static_cast<std::ptrdiff_t>(half), ts.end());
  safetensors(dir / "model-00001-of-00002.safetensors", a);
  safetensors(dir / "model-00002-of-00002.safetensors", b);
  for (const auto& t : a) map[t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) map[t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json")
      << json{{"metadata", json::object()}, {"weight_map", map}}.dump(2);
}

json base(const char* model_type) {
  return {{"model_type", model_type}, {"vocab_size", 512},
          {"hidden_size", 32},        {"intermediate_size", 64},
          {"num_hidden_layers", 2},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},     {"rope_theta", 10000.0},
          {"hidden_act", "silu"},     {"tie_word_embeddings", false},
          {"torch_dtype", "float32"}};
}

}  // namespace

TEST_CASE("the HF families' example configs train two steps and export the family") {
  if (!have_bin()) return;
  const fs::path tmp = fs::temp_directory_path() / ("dtrain_family_configs_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  json llama = base("llama");
  llama["head_dim"] = 16;  // != 32 / 4
  llama["tie_word_embeddings"] = true;
  llama["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 32.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 16}};
  json qwen2 = base("qwen2");
  qwen2["tie_word_embeddings"] = true;
  qwen2["use_sliding_window"] = false;
  json qwen3 = base("qwen3");
  qwen3["head_dim"] = 12;
  qwen3["tie_word_embeddings"] = true;
  json mistral = base("mistral");
  mistral["sliding_window"] = 8;  // below data.seq_len
  struct Case {
    const char* config;
    json cfg;
    bool lora, sharded;
  };
  for (const Case& c :
       {Case{"qwen2.5-0.5b-sft.yaml", qwen2, false, false}, Case{"llama-3.2-1b-sft.yaml", llama, false, false},
        Case{"qwen3-0.6b-lora.yaml", qwen3, true, false}, Case{"mistral-7b-lora.yaml", mistral, true, true}}) {
    INFO(c.config);
    const fs::path model = tmp / c.config / "model", run = tmp / c.config / "run", exp = tmp / c.config / "export";
    checkpoint(model, c.cfg, c.sharded);
    std::string args = "launch --config configs/" + std::string(c.config) + " --output-dir " + shq(run.string()) +
                       " --nproc-per-node 1 --master-port 0";
    for (const std::string& s :
         {"model.init_from=" + model.string(), std::string("data.tokenizer=byte"), std::string("data.template=plain"),
          std::string("data.seq_len=24"), std::string("data.neat_packing=false"),  // records outrun 24 tokens
          std::string("training.device=cpu"), std::string("bf16.enabled=false"), std::string("training.max_steps=2"),
          std::string("training.save_steps=2"), std::string("training.eval_steps=2"), std::string("train_batch_size=2"),
          std::string("train_micro_batch_size_per_gpu=2")})
      args += " --set " + shq(s);
    const RunResult r = run_dtrain(args, 180);
    INFO(r.out);
    REQUIRE(r.code == 0);
    const RunResult e = run_dtrain("export " + shq(run.string()) + " -o " + shq(exp.string()), 60);
    INFO(e.out);
    REQUIRE(e.code == 0);
    const json back = json::parse(std::ifstream(exp / "config.json"));
    CHECK(back["model_type"] == c.cfg["model_type"]);
    CHECK(back["head_dim"] == (c.cfg.contains("head_dim") ? c.cfg["head_dim"].get<int>() : 8));
    if (c.cfg.contains("rope_scaling")) CHECK(back["rope_scaling"]["rope_type"] == "llama3");
    if (c.cfg.contains("sliding_window")) CHECK(back["sliding_window"] == 8);
    CHECK(fs::exists(exp / "adapter_config.json") == c.lora);
  }
  fs::remove_all(tmp);
}
