// HF's sharded checkpoint layout: model-0000k-of-0000n.safetensors with
// model.safetensors.index.json, as transformers' save_pretrained writes it for a model over
// max_shard_size. A qwen2 model (biases, tied embeddings) exported by dtrain, resharded here
// in bf16 and fp32, loads back to the same weights; an index that disagrees with its shards
// (a missing shard, a tensor in another file or in none, one in two shards, one the index
// does not list) is an IoError naming the file and the tensor.
#include "temp_dir.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "train/model_factory.h"

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dtrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using dtrain::test::TempDir;

model::ModelConfig qwen2() {
  model::ModelConfig c;
  c.arch = model::ModelConfig::Arch::QWEN2;
  c.vocab_size = 40;
  c.max_seq_len = 16;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 48;
  c.qkv_bias = true;
  c.tie_embeddings = true;
  return c;
}

// The export's tensors split over n shards (layers spread across them), written in dtype,
// with the index transformers writes; `edit` may corrupt the weight_map first.
void reshard(const fs::path& exported, const fs::path& out, int n, DType dt,
             const std::function<void(json&)>& edit = {}) {
  model::SafetensorsFile src((exported / "model.safetensors").string());
  fs::create_directories(out);
  fs::copy_file(exported / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  const auto names = src.names();
  std::vector<std::vector<std::string>> groups(static_cast<size_t>(n));
  for (size_t i = 0; i < names.size(); ++i) groups[i * static_cast<size_t>(n) / names.size()].push_back(names[i]);
  json map = json::object();
  for (int k = 0; k < n; ++k) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n);
    std::vector<std::vector<uint16_t>> half;
    std::vector<std::vector<float>> full;
    std::vector<model::StTensorRef> refs;
    for (const auto& name : groups[static_cast<size_t>(k)]) {
      const auto& info = src.info(name);
      std::vector<float> v(static_cast<size_t>(info.numel()));
      src.read_f32(name, v.data(), v.size());
      if (dt == DType::BF16) {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
        half.push_back(std::move(h));
      } else {
        full.push_back(std::move(v));
      }
      refs.push_back({name, dt, info.shape, nullptr});
      map[name] = file;
    }
    for (size_t i = 0; i < refs.size(); ++i)
      refs[i].data = dt == DType::BF16 ? static_cast<const void*>(half[i].data()) : full[i].data();
    model::safetensors_write((out / file).string(), refs, {{"format", "pt"}});
  }
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
  if (edit) edit(index);
  std::ofstream(out / "model.safetensors.index.json") << index.dump(2);
}

std::string load_error(const fs::path& dir) {
  try {
    train::model_load_hf_dir(dir.string());
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a sharded checkpoint with its index loads the same weights (fp32 and bf16 shards)") {
  TempDir dir("roundtrip");
  model::Model m(qwen2());
  m.init_weights(9);
  float* qb = static_cast<float*>(m.tensor("model.layers.2.self_attn.q_proj.bias").data);
  for (int i = 0; i < 32; ++i) qb[i] = 0.01f * static_cast<float>(i);
  train::model_export_hf(m, (dir.path / "export").string());
  for (DType dt : {DType::F32, DType::BF16}) {
    const fs::path out = dir.path / dtype_name(dt);
    reshard(dir.path / "export", out, 3, dt);
    CHECK(!fs::exists(out / "model.safetensors"));
    auto back = train::model_load_hf_dir(out.string());
    CHECK(back->config().arch == model::ModelConfig::Arch::QWEN2);
    for (size_t b = 0; b < m.params().size(); ++b) {
      const float* want = m.params()[b].host_f32();
      const float* got = back->params()[b].host_f32();
      for (size_t i = 0; i < m.params()[b].size; ++i) {
        const float w = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(want[i])) : want[i];
        REQUIRE(got[i] == w);
      }
    }
  }
}

TEST_CASE("an index that disagrees with its shards is refused, naming the file and tensor") {
  TempDir dir("bad");
  model::Model m(qwen2());
  m.init_weights(9);
  train::model_export_hf(m, (dir.path / "export").string());
  const std::string t = "model.layers.1.self_attn.k_proj.bias";
  auto variant = [&](const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path out = dir.path / name;
    reshard(dir.path / "export", out, 3, DType::F32, edit);
    return load_error(out);
  };
  // the layout itself: every check below fails only through the edit
  CHECK(variant("ok", {}).empty());
  CHECK(variant("missing_shard", [](json& j) {
          j["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
        }).find("names shard model-00009-of-00009.safetensors, which is not in") != std::string::npos);
  CHECK(variant("wrong_file", [&](json& j) {
          const std::string f = j["weight_map"][t];
          j["weight_map"][t] = f == "model-00001-of-00003.safetensors" ? "model-00003-of-00003.safetensors"
                                                                       : "model-00001-of-00003.safetensors";
        }).find("tensor " + t + " is mapped to") != std::string::npos);
  CHECK(variant("unlisted", [&](json& j) { j["weight_map"].erase(t); }).find(t + ", which") != std::string::npos);
  CHECK(variant("phantom", [](json& j) { j["weight_map"]["model.extra.weight"] = "model-00001-of-00003.safetensors"; })
            .find("model.extra.weight is mapped to model-00001-of-00003.safetensors, which does not hold it") !=
        std::string::npos);
  CHECK(variant("no_map", [](json& j) { j.erase("weight_map"); }).find("weight_map") != std::string::npos);
  // a tensor written into two shards
  {
    const fs::path out = dir.path / "twice";
    reshard(dir.path / "export", out, 2, DType::F32);
    model::SafetensorsFile first((out / "model-00001-of-00002.safetensors").string());
    const std::string dup = first.names().front();
    std::vector<float> v(static_cast<size_t>(first.info(dup).numel()));
    first.read_f32(dup, v.data(), v.size());
    model::safetensors_write((out / "model-00003-of-00002.safetensors").string(),
                             {{dup, DType::F32, first.info(dup).shape, v.data()}});
    json index = json::parse(std::ifstream(out / "model.safetensors.index.json"));
    index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";  // pull the extra shard in
    std::ofstream(out / "model.safetensors.index.json") << index.dump(2);
    CHECK(load_error(out).find("tensor " + dup + " is in both") != std::string::npos);
  }
}
