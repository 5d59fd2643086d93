// The Hugging Face export at real size (issue 27 item 3): save_pretrained's shard plan and
// index, bf16 (round to nearest even) and fp32, loading every layout back with dtrain's
// loader, the merged LoRA model, export.* keys and flags refused by name, an interrupted
// or partial export never taken for a complete one, and the checkpoint streamed tensor by
// tensor giving the bytes the model path writes.
#include "temp_dir.h"
#include "config/train_config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "model/peft.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "train/checkpoint_export.h"
#include "train/hf_export.h"
#include "train/model_factory.h"
#include "train/zero_engine.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string yaml(const std::string& arch) {
  return R"(
train_micro_batch_size_per_gpu: 2
model:
  architecture: )" +
         arch + R"(
  vocab_size: 272
  n_layer: 2
  n_head: 2
  d_model: 32
  max_seq_len: 16
data:
  train: configs/data/tasks/train.jsonl
  format: alpaca
  seq_len: 16
training:
  max_steps: 2
  seed: 5
)";
}

config::TrainConfig load(const std::string& arch, const std::vector<std::string>& sets = {}) {
  auto c = config::config_load_string(yaml(arch), "es.yaml", sets).cfg;
  config::config_resolve_batch(c, 1);
  return c;
}

using dtrain::test::TempDir;

HfExportOptions opts(DType dt, uint64_t max_shard, bool merge = false) {
  HfExportOptions o;
  o.dtype = dt;
  o.max_shard_size = max_shard;
  o.merge_lora = merge;
  return o;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Random non-zero adapters (B starts at zero) so that a lost or unmerged adapter shows.
void adapters_randomize(model::Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  for (auto& pb : m.lora_params())
    for (size_t i = 0; i < pb.size; ++i) pb.host_f32()[i] = u(rng);
}

// The names and element counts of the model's base tensors, in the HF state_dict order
// the export fills shards in (Llama family: a layer's two norms after attention and MLP).
std::vector<std::pair<std::string, size_t>> state_dict_order(const model::Model& m) {
  std::vector<std::pair<std::string, size_t>> out;
  for (const auto& pb : m.params()) {
    std::vector<std::pair<std::string, size_t>> norms;
    for (const auto& t : pb.layout.tensors) {
      const bool norm = !m.config().is_gpt2() && (t.name.find("input_layernorm") != std::string::npos ||
                                                  t.name.find("post_attention_layernorm") != std::string::npos);
      (norm ? norms : out).emplace_back(t.name, t.numel());
    }
    out.insert(out.end(), norms.begin(), norms.end());
  }
  return out;
}

// Checks dir's sharded layout against the model: the index names every weight once, in
// the file holding it; total_size is the sum of the tensors' bytes; each file holds at
// most cap bytes of data unless it holds one tensor; shards are filled in state_dict
// order. Returns the number of shard files.
size_t check_sharded(const fs::path& dir, const model::Model& m, DType dt, uint64_t cap) {
  REQUIRE(fs::exists(dir / "model.safetensors.index.json"));
  CHECK(!fs::exists(dir / "model.safetensors"));
  const json index = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  REQUIRE(index.contains("metadata"));
  REQUIRE(index.contains("weight_map"));
  const auto order = state_dict_order(m);
  std::map<std::string, std::string> map = index.at("weight_map").get<std::map<std::string, std::string>>();
  CHECK(map.size() == order.size());
  uint64_t total = 0;
  std::set<std::string> files;
  for (const auto& [name, numel] : order) {
    REQUIRE_MESSAGE(map.count(name) == 1, name);
    total += numel * dtype_size(dt);
    files.insert(map.at(name));
  }
  CHECK(index.at("metadata").at("total_size").get<uint64_t>() == total);
  size_t k = 0;
  for (const auto& f : files) {
    ++k;
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", k, files.size());
    CHECK(f == want);
    model::SafetensorsFile sf((dir / f).string());
    uint64_t data = 0;
    for (const auto& n : sf.names()) {
      CHECK(map.at(n) == f);
      const auto& info = sf.info(n);
      CHECK(info.dtype_name == (dt == DType::BF16 ? "BF16" : "F32"));
      data += info.end - info.begin;
    }
    CHECK((data <= cap || sf.names().size() == 1));
  }
  // Filled in order: walking the state_dict, the shard index never goes back, except for
  // a tensor alone in its shard (larger than the cap), which HF places where it is met.
  size_t last = 0;
  for (const auto& [name, numel] : order) {
    if (numel * dtype_size(dt) > cap) continue;
    const size_t s = static_cast<size_t>(std::distance(files.begin(), files.find(map.at(name))));
    CHECK(s >= last);
    last = s;
  }
  return files.size();
}

std::vector<float> logits_of(model::Model& m) {
  std::vector<int32_t> tokens(2 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % 272);
  m.set_training(false);
  m.forward(tokens.data(), nullptr, 2, 8);
  return m.logits_to_host();
}

}  // namespace

TEST_CASE("byte sizes as max_shard_size takes them") {
  CHECK(config::byte_size_parse("5GB") == 5'000'000'000ull);
  CHECK(config::byte_size_parse("500MB") == 500'000'000ull);
  CHECK(config::byte_size_parse("2GiB") == (2ull << 30));
  CHECK(config::byte_size_parse("1000") == 1000ull);
  CHECK(config::byte_size_parse(" 1.5 kb ") == 1500ull);
  CHECK(config::byte_size_parse("64B") == 64ull);
  for (const char* bad : {"", "GB", "0", "0MB", "5XB", "-1", "1.5", "1e9", "5 G B", "99999999999999999999"})
    CHECK_MESSAGE(!config::byte_size_parse(bad).has_value(), bad);
}

TEST_CASE("the shard plan is save_pretrained's: in order, at most the cap, a larger tensor alone") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t cap = 1 + rng() % 100;
    std::vector<uint64_t> sizes(1 + rng() % 30);
    for (auto& s : sizes) s = rng() % 130;
    const ShardPlan p = shard_plan(sizes, cap);
    uint64_t total = 0;
    for (auto s : sizes) total += s;
    CHECK(p.total_size == total);
    std::vector<size_t> seen;
    for (const auto& shard : p.shards) {
      REQUIRE(!shard.empty());
      uint64_t bytes = 0;
      for (size_t i : shard) bytes += sizes[i];
      if (shard.size() > 1 || sizes[shard[0]] <= cap) CHECK(bytes <= cap);
      for (size_t i : shard)
        if (sizes[i] > cap) CHECK(shard.size() == 1);
      seen.insert(seen.end(), shard.begin(), shard.end());
    }
    // Every tensor once; the tensors within the cap keep their order across shards.
    std::vector<size_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) REQUIRE(sorted[i] == i);
    std::vector<size_t> small;
    for (size_t i : seen)
      if (sizes[i] <= cap) small.push_back(i);
    CHECK(std::is_sorted(small.begin(), small.end()));
    // A shard is closed only when the next tensor within the cap would not fit in it.
    for (size_t k = 0; k + 1 < p.shards.size(); ++k) {
      const auto& a = p.shards[k];
      if (a.size() == 1 && sizes[a[0]] > cap) continue;
      uint64_t bytes = 0;
      for (size_t i : a) bytes += sizes[i];
      size_t next = a.back() + 1;
      while (next < sizes.size() && sizes[next] > cap) ++next;
      if (next < sizes.size()) CHECK(bytes + sizes[next] > cap);
    }
  }
}

TEST_CASE("sharded fp32 and bf16 exports load back: fp32 bit-exact, bf16 the masters rounded to nearest even") {
  for (const std::string arch : {"llama", "gpt2"}) {
    INFO(arch);
    TempDir dir("rt_" + arch);
    auto m = model_create(load(arch));
    // The largest tensor (the embedding, 272 x 32 fp32 = 34816 bytes) is over the fp32 cap:
    // alone in its file; the layers spread over several.
    const uint64_t cap = 20000;
    for (DType dt : {DType::F32, DType::BF16}) {
      INFO(dtype_name(dt));
      const fs::path out = dir.path / dtype_name(dt);
      model_export_hf(*m, out.string(), opts(dt, cap));
      CHECK(check_sharded(out, *m, dt, cap) > 2);
      const auto hf = model::hf_config_read((out / "config.json").string());
      CHECK(hf.torch_dtype == (dt == DType::BF16 ? "bfloat16" : "float32"));
      auto back = model_load_hf_dir(out.string());
      for (size_t b = 0; b < m->params().size(); ++b) {
        const float* want = m->params()[b].host_f32();
        const float* got = back->params()[b].host_f32();
        for (size_t i = 0; i < m->params()[b].size; ++i) {
          const float w = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(want[i])) : want[i];
          REQUIRE(std::memcmp(&got[i], &w, 4) == 0);
        }
      }
    }
    // Everything fits: one model.safetensors and no index, as save_pretrained.
    const fs::path one = dir.path / "one";
    model_export_hf(*m, one.string(), opts(DType::BF16, 5'000'000'000));
    CHECK(fs::exists(one / "model.safetensors"));
    CHECK(!fs::exists(one / "model.safetensors.index.json"));
  }
}

TEST_CASE("LoRA: the adapter as before, and the merged model gives the adapter's logits") {
  for (const std::string arch : {"llama", "gpt2"}) {
    INFO(arch);
    TempDir dir("lora_" + arch);
    auto cfg =
        load(arch, {"lora.r=4", "lora.target_modules=[" +
                                    std::string(arch == "gpt2" ? "c_attn, c_proj, c_fc" : "q_proj, v_proj, down_proj") +
                                    "]"});
    auto m = model_create(cfg);
    adapters_randomize(*m, 7);
    const std::vector<float> want = logits_of(*m);
    model_export_hf(*m, dir.path.string() + "/out", opts(DType::F32, 12000, true));
    const fs::path out = dir.path / "out";
    CHECK(fs::exists(out / "adapter_model.safetensors"));
    CHECK(fs::exists(out / "adapter_config.json"));
    REQUIRE(fs::exists(out / "merged" / "config.json"));
    CHECK(!fs::exists(out / "merged" / "adapter_config.json"));
    // The base + adapter directory loads as before: same base weights and adapters.
    auto adapted = model_load_hf_dir(out.string());
    REQUIRE(adapted->lora_on());
    for (size_t b = 0; b < m->lora_params().size(); ++b)
      CHECK(std::memcmp(adapted->lora_params()[b].data, m->lora_params()[b].data, m->lora_params()[b].size * 4) == 0);
    // The merged directory: sharded like the base, no adapter, the same logits.
    auto merged = model_load_hf_dir((out / "merged").string());
    CHECK(!merged->lora_on());
    check_sharded(out / "merged", *merged, DType::F32, 12000);
    const std::vector<float> got = logits_of(*merged);
    REQUIRE(got.size() == want.size());
    float worst = 0, moved = 0;
    CHECK(logits_of(*adapted) == want);  // base + adapter reloaded: the same computation
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    // The adapter moves the logits (so the comparison can fail), the merge reproduces it.
    auto plain = model_create(load(arch));
    const std::vector<float> unadapted = logits_of(*plain);
    for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, std::fabs(unadapted[i] - want[i]));
    CHECK(moved > 1e-3f);
    CHECK(worst <= 1e-5f);
  }
}

TEST_CASE("export.* keys and flags: bad values refused by name, flags override the config") {
  CHECK_THROWS_WITH_AS(load("llama", {"export.max_shard_size=5XB"}), doctest::Contains("export.max_shard_size"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(load("llama", {"export.max_shard_size=0"}), doctest::Contains("export.max_shard_size"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(load("llama", {"export.dtype=fp16"}), doctest::Contains("export.dtype"), ConfigError);
  const auto cfg = load("llama", {"export.max_shard_size=500MB", "export.dtype=fp32"});
  HfExportOptions o = hf_export_options(cfg);
  CHECK(o.max_shard_size == 500'000'000ull);
  CHECK(o.dtype == DType::F32);
  CHECK(!o.merge_lora);
  const HfExportOptions d = hf_export_options(load("llama"));
  CHECK(d.dtype == DType::BF16);
  CHECK(d.max_shard_size == 5'000'000'000ull);
  HfExportFlags f;
  f.dtype = "bf16";
  f.max_shard_size = "2GiB";
  f.merge_lora = true;
  o = hf_export_options(cfg, f);
  CHECK(o.dtype == DType::BF16);
  CHECK(o.max_shard_size == (2ull << 30));
  CHECK(o.merge_lora);
  f.max_shard_size = "lots";
  CHECK_THROWS_WITH_AS(hf_export_options(cfg, f), doctest::Contains("--max-shard-size"), UsageError);
  f.max_shard_size = "";
  f.dtype = "fp16";
  CHECK_THROWS_WITH_AS(hf_export_options(cfg, f), doctest::Contains("--dtype"), UsageError);
}

TEST_CASE("an interrupted or partial export is never taken for a complete one") {
  TempDir dir("partial");
  auto m = model_create(load("llama"));
  const fs::path out = dir.path / "hf";
  // A single-file export, a file of the user's, then a sharded export over it: the stale
  // model.safetensors (which the loader would prefer) is gone, the user's file kept.
  model_export_hf(*m, out.string(), opts(DType::F32, 5'000'000'000));
  std::ofstream(out / "NOTES.md") << "mine";
  model_export_hf(*m, out.string(), opts(DType::F32, 20000));
  CHECK(!fs::exists(out / "model.safetensors"));
  CHECK(bytes_of(out / "NOTES.md") == "mine");
  const size_t n = check_sharded(out, *m, DType::F32, 20000);
  REQUIRE(n > 2);
  const std::string complete = bytes_of(out / "model.safetensors.index.json");

  // An export that fails part way (its tokenizer file is gone after the weights were
  // written) leaves the previous export as it was, and no staging directory behind.
  HfExportOptions bad = opts(DType::BF16, 20000);
  bad.extra_files = {{(dir.path / "missing.json").string(), "tokenizer.json"}};
  CHECK_THROWS_AS(model_export_hf(*m, out.string(), bad), IoError);
  CHECK(bytes_of(out / "model.safetensors.index.json") == complete);
  for (const auto& e : fs::directory_iterator(dir.path))
    CHECK_MESSAGE(e.path().filename().string().find(".partial-") == std::string::npos, e.path().string());
  CHECK(model_load_hf_dir(out.string())->num_params() == m->num_params());

  // A staging directory of a process that died is what an interrupted export leaves: not
  // the output directory, and removed by the next export beside it.
  const fs::path stale = dir.path / "hf.partial-999999999";
  fs::create_directories(stale);
  fs::copy_file(out / "config.json", stale / "config.json");
  model_export_hf(*m, out.string(), opts(DType::F32, 20000));
  CHECK(!fs::exists(stale));

  // Shards without their index: only a complete set loads.
  fs::remove(out / "model.safetensors.index.json");
  CHECK(model_load_hf_dir(out.string())->num_params() == m->num_params());
  char second[64];
  std::snprintf(second, sizeof second, "model-%05d-of-%05zu.safetensors", 2, n);
  fs::remove(out / second);
  CHECK_THROWS_WITH_AS(model_load_hf_dir(out.string()), doctest::Contains(second), IoError);
  // With the index, a missing shard is named too.
  std::ofstream(out / "model.safetensors.index.json") << complete;
  CHECK_THROWS_WITH_AS(model_load_hf_dir(out.string()), doctest::Contains(second), IoError);
}

TEST_CASE("dtrain export's checkpoint path streams the masters: the same files as the model's export") {
  for (const bool lora : {false, true}) {
    INFO(lora);
    TempDir dir(lora ? "ck_lora" : "ck");
    std::vector<std::string> sets{"export.max_shard_size=20000", "export.merge_lora=true"};
    if (lora) sets.push_back("lora.r=4");
    const auto cfg = load("llama", sets);
    auto m = model_create(cfg);
    if (lora) adapters_randomize(*m, 9);
    {
      // A stage-0 single-rank checkpoint of these weights (the engine's masters are the model's).
      ZeroOptions zo = zero_options_from(cfg);
      zo.overlap_comm = false;
      ZeroEngine engine(*m, nullptr, zo);
      TrainState st;
      st.step = 3;
      st.config_yaml = config::config_to_yaml(cfg);
      checkpoint_save(dir.path.string(), engine.checkpoint_view(), st);
    }
    for (DType dt : {DType::BF16, DType::F32}) {
      INFO(dtype_name(dt));
      HfExportFlags f;
      f.dtype = dt == DType::BF16 ? "bf16" : "fp32";
      const fs::path streamed = dir.path / ("streamed_" + f.dtype), direct = dir.path / ("direct_" + f.dtype);
      const CheckpointExportResult r = checkpoint_export_hf(dir.path.string(), streamed.string(), f);
      CHECK(r.step == 3);
      CHECK(r.lora == lora);
      HfExportOptions o = hf_export_options(cfg, f);
      const auto tok = data::tokenizer_load(cfg.data.tokenizer);
      o.bos_id = tok->bos_id();
      o.eos_id = tok->eos_id();
      model_export_hf(*m, direct.string(), o);
      size_t files = 0;
      for (const auto& e : fs::recursive_directory_iterator(direct)) {
        if (!e.is_regular_file()) continue;
        ++files;
        const fs::path rel = fs::relative(e.path(), direct);
        CHECK_MESSAGE(bytes_of(streamed / rel) == bytes_of(e.path()), rel.string());
      }
      CHECK(files >= (lora ? 12u : 4u));
      CHECK(fs::exists(streamed / "model.safetensors.index.json"));
      CHECK(fs::exists(streamed / "merged") == lora);
    }
  }
}

TEST_CASE("safetensors_write_stream writes the bytes safetensors_write writes") {
  TempDir dir("stream");
  std::vector<float> a(37), b(5);
  std::vector<uint16_t> c(12);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  for (size_t i = 0; i < c.size(); ++i) c[i] = f32_to_bf16(static_cast<float>(i) / 7.0f);
  const std::vector<model::StTensorRef> refs{{"z.weight", DType::F32, {37}, a.data()},
                                             {"a.bias", DType::F32, {5, 1}, b.data()},
                                             {"m.half", DType::BF16, {3, 4}, c.data()}};
  std::vector<model::StTensorSource> sources;
  for (const auto& r : refs)
    sources.push_back({r.name, r.dtype, r.shape, [r](void* dst) {
                         size_t n = dtype_size(r.dtype);
                         for (int64_t d : r.shape) n *= static_cast<size_t>(d);
                         std::memcpy(dst, r.data, n);
                       }});
  model::safetensors_write((dir.path / "ref.safetensors").string(), refs, {{"format", "pt"}});
  model::safetensors_write_stream((dir.path / "stream.safetensors").string(), sources, {{"format", "pt"}});
  CHECK(bytes_of(dir.path / "stream.safetensors") == bytes_of(dir.path / "ref.safetensors"));
  CHECK(bytes_of(dir.path / "ref.safetensors").size() > 200);
}
