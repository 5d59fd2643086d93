// The shipped configs: every configs/*.yaml and *.json loads (globbed at test time), the
// embedded default job is configs/tiny-sft.yaml, config_to_yaml round-trips, and
// config_help documents every key.
#include "config/schema.h"
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

using namespace dtrain;
using namespace dtrain::config;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() {
  const char* d = std::getenv("DTRAIN_SOURCE_DIR");
  return d && *d ? fs::path(d) : fs::current_path();
}

std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(source_dir() / "configs"))
    if (e.is_regular_file() && (e.path().extension() == ".yaml" || e.path().extension() == ".json"))
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

void clear_env() {
  for (const char* n : {"DTRAIN_OUTPUT_DIR", "DTRAIN_RDZV_PORT", "DTRAIN_RDZV_ADDR", "DTRAIN_MAX_STEPS", "DTRAIN_SEED",
                        "DTRAIN_DEVICE", "DTRAIN_STEP_TIMEOUT", "DTRAIN_CUDA_GRAPH"})
    ::unsetenv(n);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TrainConfig load(const std::string& name) { return config_load_file((source_dir() / "configs" / name).string()).cfg; }

void check_round_trip(const TrainConfig& c) {
  std::string yaml = config_to_yaml(c);
  INFO(yaml);
  TrainConfig back = config_load_string(yaml, "roundtrip.yaml").cfg;
  back.source = c.source;
  CHECK(back == c);
  CHECK(config_to_yaml(back) == yaml);
}

}  // namespace

TEST_CASE("every shipped config loads; YAML ones without warnings") {
  clear_env();
  std::vector<fs::path> files = shipped_configs();
  CHECK(files.size() >= 8);
  for (const fs::path& f : files) {
    INFO(f.string());
    LoadedConfig l = config_load_file(f.string());
    if (f.extension() == ".yaml") CHECK(l.warnings.empty());
    else CHECK(l.warnings.size() == 1);  // the accepted-but-ignored DeepSpeed keys
    check_round_trip(l.cfg);
  }
}

TEST_CASE("the embedded default job is configs/tiny-sft.yaml") {
  clear_env();
  CHECK(std::string(kDefaultConfigYaml) == slurp(source_dir() / "configs/tiny-sft.yaml"));
  CHECK(fs::equivalent(kDefaultConfigDir, source_dir() / "configs"));
  LoadedConfig l = config_load_string(kDefaultConfigYaml, "<embedded default>", {}, kDefaultConfigDir);
  const TrainConfig& c = l.cfg;
  CHECK(l.warnings.empty());
  CHECK_NOTHROW(config_check_job(c));
  CHECK(*c.model.architecture == "llama");
  CHECK(*c.model.vocab_size == 512);
  CHECK(*c.model.n_kv_head == 2);
  CHECK(c.data.format == "alpaca");
  CHECK(c.data.tokenizer == "byte");
  // Its data paths are relative to configs/, so the default job runs from any directory.
  CHECK(c.data.train == (fs::path(kDefaultConfigDir) / "data/basics/train.jsonl").string());
  CHECK(fs::is_regular_file(c.data.train));
  CHECK(fs::is_regular_file(c.data.valid));
  CHECK(!c.bf16.enabled);
  CHECK(!c.fp16.enabled);
  CHECK(c.zero.stage == 0);
  CHECK(*c.training.max_steps == 1200);
  CHECK(c.training.device == "cpu");
  CHECK(c.training.output_dir == "runs/tiny-sft");
  CHECK(*c.scheduler.type == "WarmupDecayLR");
  CHECK(c.optimizer.lr == 3e-3);
  TrainConfig r = c;
  config_resolve_batch(r, 1);
  CHECK(r.resolved_train_batch_size == 8);
}

TEST_CASE("example contents") {
  clear_env();
  TrainConfig gpt2 = load("gpt2-124m.yaml");
  CHECK(*gpt2.model.d_ff == 3072);
  CHECK(gpt2.bf16.enabled);
  CHECK(*gpt2.data.seq_len == 1024);
  config_resolve_batch(gpt2, 8);
  CHECK(gpt2.resolved_grad_accum_steps == 4);

  TrainConfig llama = load("llama-1b.yaml");
  CHECK(*llama.model.d_ff == 5632);
  CHECK(*llama.model.n_kv_head == 8);
  CHECK(llama.activation_checkpointing.enabled == std::optional<bool>(true));

  TrainConfig lora = load("lora-sft.yaml");
  CHECK(lora.lora.r == 16);
  CHECK(lora.lora.target_modules.size() == 7);
  CHECK(!lora.model.n_layer);  // from init_from's config.json

  TrainConfig tiny = load("tiny-cpu.yaml");
  CHECK(*tiny.model.architecture == "gpt2");
  CHECK(tiny.data.format == "text");

  // ds_config.json is the DeepSpeed JSON form of zero3-fp16.yaml
  TrainConfig z = load("zero3-fp16.yaml");
  TrainConfig j = load("ds_config.json");
  CHECK(z.fp16.enabled);
  CHECK(z.zero.stage == 3);
  j.source = z.source;
  j.training.name = z.training.name;
  j.training.output_dir = z.training.output_dir;
  CHECK(j == z);

  // the HF Trainer config: "auto" everywhere, no model yet
  LoadedConfig hf = config_load_file((source_dir() / "configs/hf_ds_config.json").string());
  CHECK(!hf.cfg.train_batch_size);
  CHECK(!hf.cfg.fp16.enabled);
  CHECK(hf.cfg.zero.stage == 2);
  // The stock offload section is acted on now (ZeRO-Offload), not warned about.
  CHECK(hf.cfg.zero.offload_optimizer_device == "cpu");
  CHECK(hf.cfg.zero.offload_optimizer_pin_memory);
  for (const auto& w : hf.warnings) CHECK(w.find("offload") == std::string::npos);
  CHECK_THROWS_AS(config_resolve_batch(hf.cfg, 2), ConfigError);
  CHECK_THROWS_AS(config_check_job(hf.cfg), ConfigError);
  TrainConfig completed = config_load_file((source_dir() / "configs/hf_ds_config.json").string(),
                                           {"model.init_from=models/x", "data.train=d.jsonl", "training.epochs=1",
                                            "train_micro_batch_size_per_gpu=4"})
                              .cfg;
  CHECK_NOTHROW(config_check_job(completed));
}

TEST_CASE("round trip with unusual values") {
  clear_env();
  TrainConfig c = config_load_string(kDefaultConfigYaml, "x.yaml",
                                     {"data.train=we\"ird: #path\\x", "cluster.env.set={K: 'a b', L: \"true\"}",
                                      "cluster.ssh.user=null", "training.name=n.a-b_c", "data.valid=", "lora.r=2",
                                      "optimizer.params.lr=1.2345678901234567e-7", "scheduler.type=WarmupCosineLR",
                                      "scheduler.params.warmup_min_lr=null", "scheduler.params.warmup_max_lr=null",
                                      "cluster.rendezvous.address=true", "model.rope_theta=500000"})
                      .cfg;
  CHECK(c.cluster.rendezvous.address == "true");
  check_round_trip(c);
}

TEST_CASE("config_help documents every key") {
  std::string h = config_help();
  for (const KeySpec& k : schema_keys()) CHECK_MESSAGE(h.find(std::string(k.path) + "\n") != std::string::npos, k.path);
  for (const char* env : {"DTRAIN_OUTPUT_DIR", "DTRAIN_RDZV_PORT", "DTRAIN_MAX_STEPS", "DTRAIN_SEED"})
    CHECK(h.find(env) != std::string::npos);
  CHECK(h.find("offload_optimizer") != std::string::npos);
  CHECK(h.find("Adam with weight_decay behaves as AdamW") != std::string::npos);
}
