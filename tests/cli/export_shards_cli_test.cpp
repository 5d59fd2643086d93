// `dtrain export` and the trainer's final/ at real size through the CLI: the export.*
// keys give final/ bf16 shards with their index, the adapter and the merged model; the
// flags override them, and --dtype fp32 of a bf16 final/ takes the checkpoint's fp32
// masters (their bf16 rounding is final/'s bytes); a bad --max-shard-size is refused by name.
#include "run_binary.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace dtrain::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Tensor {
  std::string dtype;
  std::string bytes;
};

// Every tensor of a safetensors file (read by hand: these tests link no model code).
std::map<std::string, Tensor> tensors_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  const json h = json::parse(head);
  std::map<std::string, Tensor> out;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    const uint64_t a = v["data_offsets"][0], b = v["data_offsets"][1];
    std::string bytes(b - a, '\0');
    in.seekg(static_cast<std::streamoff>(8 + n + a));
    in.read(bytes.data(), static_cast<std::streamsize>(b - a));
    out[name] = {v["dtype"], bytes};
  }
  return out;
}

// The weights of an export directory: the shards its index names.
std::map<std::string, Tensor> weights_of(const fs::path& dir) {
  const json index = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  std::map<std::string, Tensor> out;
  std::map<std::string, bool> files;
  for (const auto& [name, file] : index["weight_map"].items()) files[file.get<std::string>()] = true;
  for (const auto& [file, _] : files)
    for (auto& [name, t] : tensors_of(dir / file)) out[name] = t;
  CHECK(out.size() == index["weight_map"].size());
  return out;
}

uint16_t bf16_rne(uint32_t x) { return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); }

std::string torch_dtype(const fs::path& dir) {
  return json::parse(std::ifstream(dir / "config.json"))["torch_dtype"].get<std::string>();
}

}  // namespace

TEST_CASE("final/ and dtrain export write bf16 shards, the adapter and the merged model; flags override") {
  if (!have_bin()) return;
  const fs::path tmp = fs::temp_directory_path() / ("dtrain_export_cli_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const fs::path run = tmp / "run";
  std::string args =
      "launch --config configs/tiny-sft.yaml --output-dir " + shq(run.string()) + " --nproc-per-node 1 --master-port 0";
  for (const char* s : {"training.device=cpu", "training.max_steps=2", "training.save_steps=2",
                        "data.valid=", "lora.r=4", "export.max_shard_size=100KB", "export.merge_lora=true"})
    args += " --set " + shq(s);
  const RunResult r = run_dtrain(args, 180);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const fs::path fin = run / "final";
  CHECK(torch_dtype(fin) == "bfloat16");
  CHECK(!fs::exists(fin / "model.safetensors"));
  CHECK(fs::exists(fin / "adapter_model.safetensors"));
  CHECK(fs::exists(fin / "merged" / "model.safetensors.index.json"));
  const auto final_w = weights_of(fin);
  CHECK(final_w.size() > 4);
  for (const auto& [name, t] : final_w) CHECK(t.dtype == "BF16");
  // tiny-sft is 1.8 MB in bf16: many files of at most 100 KB (the 128 KB embedding and
  // lm_head each alone in its own).
  CHECK(json::parse(std::ifstream(fin / "model.safetensors.index.json"))["weight_map"]["lm_head.weight"] !=
        json::parse(std::ifstream(fin / "model.safetensors.index.json"))["weight_map"]["model.embed_tokens.weight"]);
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(fin)) {
    if (f.path().filename().string().rfind("model-", 0) != 0) continue;
    ++files;
    const auto ts = tensors_of(f.path());
    size_t bytes = 0;
    for (const auto& [n, t] : ts) bytes += t.bytes.size();
    CHECK((bytes <= 100000 || ts.size() == 1));
  }
  CHECK(files > 10);

  // --dtype fp32 of the bf16 final/: the fp32 masters of the last checkpoint, whose
  // rounding to bf16 is final/'s weights exactly.
  const fs::path x = tmp / "fp32";
  RunResult e =
      run_dtrain("export " + shq(run.string()) + " -o " + shq(x.string()) + " --dtype fp32 --max-shard-size 1MB");
  INFO(e.out);
  REQUIRE(e.code == 0);
  CHECK(has(e.out, "exporting the fp32 masters of the latest checkpoint"));
  CHECK(torch_dtype(x) == "float32");
  CHECK(fs::exists(x / "merged" / "config.json"));
  const auto fp32_w = weights_of(x);
  REQUIRE(fp32_w.size() == final_w.size());
  size_t differ = 0;
  for (const auto& [name, t] : fp32_w) {
    REQUIRE(t.dtype == "F32");
    const std::string& b16 = final_w.at(name).bytes;
    REQUIRE(b16.size() * 2 == t.bytes.size());
    for (size_t i = 0; i < b16.size() / 2; ++i) {
      uint32_t f;
      uint16_t h;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      std::memcpy(&h, b16.data() + 2 * i, 2);
      REQUIRE(bf16_rne(f) == h);
      differ += (static_cast<uint32_t>(h) << 16) != f;
    }
  }
  CHECK(differ > 0);  // the fp32 export is not the bf16 one widened

  // Bad flag values: refused, naming the flag.
  e = run_dtrain("export " + shq(run.string()) + " -o " + shq((tmp / "bad").string()) + " --max-shard-size 12XB");
  CHECK(e.code == 2);
  CHECK(has(e.out, "--max-shard-size 12XB"));
  CHECK(!fs::exists(tmp / "bad"));
  e = run_dtrain("export " + shq(run.string()) + " -o " + shq((tmp / "bad").string()) + " --dtype fp16");
  CHECK(e.code == 2);
  CHECK(has(e.out, "--dtype fp16"));
  fs::remove_all(tmp);
}
