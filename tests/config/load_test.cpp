// Loading: every config error names file:line:column, the key path and what is expected;
// the key policy (accepted DeepSpeed keys in one warning, every other unknown key an error
// naming what to write instead); derived values.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

using namespace dtrain;
using namespace dtrain::config;

namespace {

// A complete small job on lines 1-4; tests append lines (starting at line 5) and may
// change entries of its model/data/training maps ("" removes one).
using Over = std::map<std::string, std::string>;
std::string flow(Over base, const Over& over) {
  for (const auto& [k, v] : over) {
    if (v.empty()) base.erase(k);
    else base[k] = v;
  }
  std::string out = "{";
  for (const auto& [k, v] : base) out += (out.size() > 1 ? ", " : "") + k + ": " + v;
  return out + "}";
}
std::string job(const Over& model = {}, const Over& data = {}, const Over& training = {}) {
  return "train_micro_batch_size_per_gpu: 2\n"
         "model: " +
         flow({{"architecture", "llama"},
               {"vocab_size", "512"},
               {"n_layer", "2"},
               {"n_head", "4"},
               {"d_model", "64"},
               {"max_seq_len", "32"}},
              model) +
         "\n"
         "data: " +
         flow({{"train", "x.jsonl"}}, data) +
         "\n"
         "training: " +
         flow({{"max_steps", "10"}}, training) + "\n";
}
const std::string kJob = job();

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    config_load_string(text, "t.yaml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for:\n" << text);
  return "";
}

// Asserts each piece appears in the error message.
void expect_error(const std::string& text, std::initializer_list<std::string> pieces) {
  std::string m = error_of(text);
  INFO("message: " << m);
  for (const std::string& p : pieces) CHECK_MESSAGE(has(m, p), "missing '" << p << "'");
}

}  // namespace

// ---------------------------------------------------------------------------
TEST_CASE("a small job loads with derived values filled") {
  LoadedConfig l = config_load_string(kJob, "jobs/small.yaml");
  const TrainConfig& c = l.cfg;
  CHECK(l.warnings.empty());
  CHECK(c.source == "jobs/small.yaml");
  CHECK(*c.model.architecture == "llama");
  CHECK(*c.model.n_kv_head == 4);
  CHECK(*c.model.d_ff == 256);  // int(8*64/3) = 170 rounded up to 256
  CHECK(*c.model.tie_embeddings == false);
  CHECK(*c.data.seq_len == 32);
  CHECK(c.training.name == "small");
  CHECK(c.training.output_dir == "runs/small");
  CHECK(c.zero.stage == 0);
  CHECK(c.zero.reduce_bucket_size == 500000000);
  CHECK(c.cluster.env.forward_prefixes == std::vector<std::string>{"NCCL_", "CUDA_", "DTRAIN_", "OMP_", "OPENBLAS_"});
  CHECK(!c.activation_checkpointing.enabled);  // not given: the memory plan decides
  CHECK(!c.activation_checkpointing.layers);
  CHECK(!c.lora.enabled());
}

TEST_CASE("llama d_ff follows Llama's rule and gpt2 uses 4*d_model") {
  LoadedConfig a = config_load_string(kJob, "a", {"model.d_model=2048", "model.n_head=32", "model.n_kv_head=8"});
  CHECK(*a.cfg.model.d_ff == 5632);
  LoadedConfig g = config_load_string(kJob, "g", {"model.architecture=gpt2"});
  CHECK(*g.cfg.model.d_ff == 256);
  CHECK(*g.cfg.model.tie_embeddings == true);
}

TEST_CASE("DeepSpeed integers written as floats, and auto") {
  LoadedConfig l = config_load_string(kJob +
                                          "zero_optimization: {stage: 2, reduce_bucket_size: 5e8, "
                                          "allgather_bucket_size: 2.5e7}\n"
                                          "train_batch_size: auto\ngradient_accumulation_steps: auto\n"
                                          "gradient_clipping: auto\n",
                                      "t.yaml");
  CHECK(l.cfg.zero.reduce_bucket_size == 500000000);
  CHECK(l.cfg.zero.allgather_bucket_size == 25000000);
  CHECK(!l.cfg.train_batch_size);
  CHECK(!l.cfg.gradient_accumulation_steps);
  CHECK(l.cfg.gradient_clipping == 0.0);
  expect_error(kJob + "zero_optimization: {reduce_bucket_size: 5.5e0}\n",
               {"t.yaml:5:41:", "zero_optimization.reduce_bucket_size", "expected an integer >= 1", "5.5e0"});
}

// ---------------------------------------------------------------------------
TEST_CASE("key policy: a typo is an error naming the known key") {
  std::string m = error_of("train_micro_batch_size_per_gpu: 2\n\ngradient_cliping: 1.0\n");
  CHECK(has(m, "t.yaml:3:1: gradient_cliping: unknown key; did you mean gradient_clipping?"));
  expect_error(kJob + "zero_optimization:\n  stgae: 2\n",
               {"t.yaml:6:3:", "zero_optimization.stgae", "did you mean zero_optimization.stage?"});
  expect_error(kJob + "zero_optimisation: {stage: 1}\n", {"t.yaml:5:1:", "did you mean zero_optimization?"});
  // short keys: distance 1 only
  expect_error(kJob + "optimizer: {params: {l: 0.1}}\n", {"optimizer.params.l", "did you mean optimizer.params.lr?"});
}

TEST_CASE("key policy: every other unknown key is an error naming what to write instead") {
  // another section's key, or the section's own keys when nothing is near
  expect_error(kJob + "my_custom_thing: 3\n", {"t.yaml:5:1:", "my_custom_thing: unknown key", "the top level has"});
  expect_error(kJob + "cluster: {ssh: {favourite_color: red}}\n",
               {"cluster.ssh.favourite_color: unknown key", "cluster.ssh has user, port"});
  expect_error(kJob + "optimizer: {params: {xyz: 1}}\n", {"optimizer.params.xyz: unknown key", "lr, betas"});
  expect_error(kJob + "seq_len: 64\n", {"t.yaml:5:1:", "did you mean data.seq_len? (a key of another section)"});
  // LLaMA-Factory / HF Trainer / PEFT spellings
  expect_error(kJob + "learning_rate: 1.0e-4\n",
               {"t.yaml:5:1:", "learning_rate: unknown key; dtrain spells this optimizer.params.lr"});
  expect_error(kJob + "lora: {rank: 16}\n", {"t.yaml:5:8:", "lora.rank: unknown key; dtrain spells this lora.r"});
  expect_error(kJob + "per_device_train_batch_size: 4\n", {"dtrain spells this train_micro_batch_size_per_gpu"});
  // DeepSpeed's older name of the bf16 section
  LoadedConfig b = config_load_string(kJob + "bfloat16: {enabled: true}\n", "t.yaml");
  CHECK(b.cfg.bf16.enabled);
}

TEST_CASE("key policy: DeepSpeed keys dtrain does not act on are listed in one warning") {
  LoadedConfig l = config_load_string(kJob +
                                          "zero_optimization:\n"
                                          "  stage: 3\n"
                                          "  offload_optimizer: {device: cpu, pin_memory: true, buffer_count: 4}\n"
                                          "  stage3_gather_16bit_weights_on_model_save: true\n"
                                          "wandb: {enabled: true}\n"
                                          "fp16: {enabled: true, auto_cast: false}\n"
                                          "zero_allow_untested_optimizer: true\n",
                                      "t.yaml");
  REQUIRE(l.warnings.size() == 1);
  const std::string& w = l.warnings[0];
  for (const char* k : {"zero_optimization.offload_optimizer.buffer_count",
                        "zero_optimization.stage3_gather_16bit_weights_on_model_save", "wandb", "fp16.auto_cast",
                        "zero_allow_untested_optimizer"})
    CHECK_MESSAGE(has(w, k), k);
  CHECK(has(w, "not acted on"));
  CHECK(l.cfg.zero.stage == 3);
  CHECK(l.cfg.fp16.enabled);
  // offload_optimizer's device and pin_memory are acted on (ZeRO-Offload), not listed.
  CHECK(l.cfg.zero.offload_optimizer_device == "cpu");
  CHECK(l.cfg.zero.offload_optimizer_pin_memory);
  CHECK(!has(w, "offload_optimizer.device"));
}

// ---------------------------------------------------------------------------
TEST_CASE("type and range errors name file:line:column, key and expectation") {
  expect_error(kJob + "zero_optimization:\n  stage: abc\n",
               {"t.yaml:6:10:", "zero_optimization.stage", "expected an integer in [0, 3]", "'abc'"});
  expect_error(kJob + "zero_optimization: {stage: 4}\n", {"zero_optimization.stage", "in [0, 3]", "'4'"});
  expect_error("train_micro_batch_size_per_gpu: -1\n",
               {"t.yaml:1:33:", "train_micro_batch_size_per_gpu", "expected an integer >= 1", "'-1'"});
  expect_error("train_micro_batch_size_per_gpu: 0\n", {"train_micro_batch_size_per_gpu", ">= 1"});
  expect_error(kJob + "cluster: {ssh: {port: 70000}}\n", {"cluster.ssh.port", "in [1, 65535]"});
  expect_error(kJob + "cluster: {rendezvous: {port: -3}}\n", {"cluster.rendezvous.port", "in [0, 65535]"});
  expect_error(kJob + "optimizer: {type: Lamb}\n", {"t.yaml:5:19:", "optimizer.type", "one of: AdamW, Adam", "'Lamb'"});
  expect_error(kJob + "optimizer: {type: adamw}\n", {"did you mean AdamW?"});
  expect_error(job({}, {}, {{"device", "gpu"}}), {"training.device", "one of: auto, cpu, cuda"});
  expect_error(job({{"n_layer", "four"}}), {"model.n_layer", "expected an integer"});
  expect_error(kJob + "gradient_clipping: \"1.0\"\n", {"gradient_clipping", "quoted string \"1.0\""});
  expect_error(kJob + "wall_clock_breakdown: maybe\n", {"wall_clock_breakdown", "a boolean"});
  expect_error(kJob + "optimizer: {params: {betas: [0.9]}}\n", {"optimizer.params.betas", "a list of 2 numbers"});
  expect_error(kJob + "optimizer: {params: {betas: [0.9, 1.0]}}\n", {"optimizer.params.betas", "in [0, 1)"});
  expect_error(kJob + "optimizer: {params: {lr: 0}}\n", {"optimizer.params.lr", "> 0"});
  expect_error(kJob + "lora: {target_modules: q_proj}\n", {"lora.target_modules", "a list of strings"});
  expect_error(kJob + "cluster: {env: {set: {\"1BAD\": x}}}\n", {"cluster.env.set", "environment variable name"});
  expect_error(kJob + "zero_optimization: 2\n", {"t.yaml:5:20:", "zero_optimization: expected a mapping", "stage"});
  expect_error(job({{"d_model", "1e30"}}), {"model.d_model", "expected an integer"});
}

TEST_CASE("relations between keys") {
  expect_error(kJob + "fp16: {enabled: true}\nbf16: {enabled: true}\n",
               {"t.yaml:6:17:", "bf16.enabled", "fp16.enabled (at t.yaml:5:17)", "at most one"});
  expect_error(job({}, {}, {{"epochs", "2"}}), {"training.epochs", "training.max_steps", "keep one"});
  expect_error(job({{"d_model", "66"}}), {"model.d_model", "66 is not a multiple of model.n_head = 4"});
  expect_error(job({{"n_kv_head", "3"}}), {"model.n_kv_head", "3 must divide model.n_head = 4"});
  expect_error(job({{"architecture", "gpt2"}, {"n_kv_head", "2"}}), {"model.n_kv_head", "gpt2"});
  expect_error(job({}, {{"seq_len", "64"}}), {"data.seq_len", "longer than model.max_seq_len = 32"});
  expect_error(kJob + "fault_tolerance: {heartbeat_interval: 5, heartbeat_timeout: 5}\n",
               {"fault_tolerance.heartbeat_timeout", "greater than heartbeat_interval"});
}

TEST_CASE("LoRA targets are checked against the architecture") {
  LoadedConfig l = config_load_string(
      kJob + "lora: {r: 8, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}\n",
      "t.yaml");
  CHECK(l.cfg.lora.enabled());
  CHECK(l.cfg.lora.target_modules.size() == 7);
  LoadedConfig d = config_load_string(kJob + "lora: {r: 8}\n", "t.yaml");
  CHECK(d.cfg.lora.target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  expect_error(job({{"architecture", "gpt2"}}) + "lora:\n  r: 8\n  target_modules: [q_proj]\n",
               {"t.yaml:7:19:", "lora.target_modules", "'q_proj' is not a projection of gpt2", "c_attn, c_proj, c_fc"});
  expect_error(kJob + "lora: {r: 8, target_modules: [q_prj]}\n", {"did you mean q_proj?"});
  expect_error(kJob + "lora: {r: 8, target_modules: [q_proj, q_proj]}\n", {"listed twice"});
  LoadedConfig off = config_load_string(kJob + "lora: {target_modules: [q_proj]}\n", "t.yaml");
  REQUIRE(off.warnings.size() == 1);
  CHECK(has(off.warnings[0], "LoRA is off"));
}

TEST_CASE("scheduler parameters") {
  LoadedConfig l = config_load_string(
      kJob + "optimizer: {params: {lr: 0.01}}\nscheduler: {type: WarmupDecayLR, params: {warmup_num_steps: 3}}\n",
      "t.yaml");
  CHECK(*l.cfg.scheduler.total_num_steps == 10);  // from training.max_steps
  CHECK(*l.cfg.scheduler.warmup_max_lr == 0.01);  // from optimizer.params.lr
  expect_error(kJob + "scheduler:\n  type: WarmupDecayLR\n  params: {warmup_num_steps: 100, total_num_steps: 50}\n",
               {"t.yaml:7:", "scheduler.params.total_num_steps", "50 must be greater than warmup_num_steps = 100"});
  expect_error(kJob + "scheduler: {type: WarmupLR, params: {cos_min_ratio: 0.1}}\n",
               {"scheduler.params.cos_min_ratio", "not a parameter of scheduler WarmupLR"});
  expect_error(kJob + "scheduler: {params: {warmup_num_steps: 3}}\n",
               {"scheduler.params.warmup_num_steps", "scheduler.type"});
  expect_error(kJob + "scheduler: {type: OneCycle}\n", {"scheduler.type", "WarmupLR, WarmupDecayLR, WarmupCosineLR"});
}

TEST_CASE("activation checkpointing: the section turns it on unless enabled: false or layers says how many") {
  auto ac = [](const std::string& yaml) { return config_load_string(kJob + yaml, "t").cfg.activation_checkpointing; };
  const std::optional<bool> on(true), off(false);
  CHECK(ac("activation_checkpointing: {partition_activations: false}\n").enabled == on);
  CHECK(ac("activation_checkpointing:\n").enabled == on);
  CHECK(ac("activation_checkpointing: {enabled: false}\n").enabled == off);
  CHECK(!ac("").enabled);  // not given: the memory plan decides
  const auto some = ac("activation_checkpointing: {layers: 3}\n");
  CHECK(!some.enabled);
  CHECK(some.layers == std::optional<int64_t>(3));
  CHECK(ac("activation_checkpointing: {enabled: true, layers: 2}\n").layers == std::optional<int64_t>(2));
  expect_error(kJob + "activation_checkpointing: {enabled: false, layers: 2}\n",
               {"activation_checkpointing.layers", "enabled is false"});
  expect_error(kJob + "activation_checkpointing: {layers: -1}\n", {"activation_checkpointing.layers"});
}

TEST_CASE("tensorboard: DeepSpeed's section; output_path stays relative (to the run directory)") {
  const TrainConfig d = config_load_string(kJob, "t").cfg;
  CHECK(!d.tensorboard.enabled);
  CHECK(d.tensorboard.output_path == "tensorboard");
  CHECK(d.tensorboard.job_name.empty());
  // DeepSpeed's JSON spelling: acted on, so not in the "not acted on" warning; a relative
  // output_path is not an input path resolved against the config's directory.
  LoadedConfig ds = config_load_string(
      "{\"train_batch_size\": 8, \"tensorboard\": {\"enabled\": true, \"output_path\": \"logs/tb\", "
      "\"job_name\": \"bert\"}}\n",
      "ds.json", {}, "/configs");
  CHECK(ds.warnings.empty());
  CHECK(ds.cfg.tensorboard.enabled);
  CHECK(ds.cfg.tensorboard.output_path == "logs/tb");
  CHECK(ds.cfg.tensorboard.job_name == "bert");
  CHECK(config_load_string(kJob, "t", {"tensorboard.enabled=true"}).cfg.tensorboard.enabled);
  // The section survives config.yaml.
  CHECK(config_load_string(config_to_yaml(ds.cfg), "ds.json").cfg == ds.cfg);
  expect_error(kJob + "tensorboard: {enable: true}\n", {"t.yaml:5:", "did you mean tensorboard.enabled?"});
  expect_error(kJob + "tensorboard: {enabled: true, job_name: /abs/dir}\n",
               {"t.yaml:5:", "tensorboard.job_name", "must be a relative directory name"});
}

// ---------------------------------------------------------------------------
TEST_CASE("document-level errors") {
  expect_error(kJob + "model: [1, 2\n", {"t.yaml:", "YAML syntax error"});
  expect_error("- a\n- b\n", {"t.yaml:1:1:", "top level must be a mapping", "a list"});
  expect_error("just text\n", {"top level must be a mapping"});
  expect_error("", {"t.yaml", "empty"});
  expect_error(kJob + "steps_per_print: 5\nsteps_per_print: 6\n",
               {"t.yaml:6:1:", "steps_per_print: duplicate key (first given at line 5)"});
  expect_error(kJob + "? [a, b]\n: 1\n", {"keys must be plain names"});
}

TEST_CASE("a complete job needs model, data and steps; a pure DeepSpeed config does not") {
  expect_error("model: {architecture: llama}\n", {"model.vocab_size", "model.n_layer", "model.init_from"});
  expect_error(
      "train_micro_batch_size_per_gpu: 2\nmodel: {architecture: llama, vocab_size: 512, n_layer: 2, "
      "n_head: 4, d_model: 64, max_seq_len: 32}\ndata: {train: x}\n",
      {"training.max_steps / training.epochs", "neither"});
  expect_error("model: {init_from: /models/llama}\ntraining: {epochs: 1}\n", {"data.train"});
  LoadedConfig hf =
      config_load_string("model: {init_from: /models/llama}\ndata: {train: d}\ntraining: {epochs: 1}\n", "t");
  CHECK(!hf.cfg.model.n_layer);
  LoadedConfig ds = config_load_string("train_batch_size: 16\nzero_optimization: {stage: 2}\n", "ds.json");
  CHECK(ds.cfg.zero.stage == 2);
  CHECK_THROWS_AS(config_check_job(ds.cfg), ConfigError);
  CHECK_NOTHROW(config_check_job(config_load_string(kJob, "t").cfg));
}

TEST_CASE("JSON (DeepSpeed ds_config) loads, with JSON positions in errors") {
  std::string json =
      "{\n  \"train_batch_size\": 32,\n  \"fp16\": {\"enabled\": true, \"loss_scale\": 0},\n"
      "  \"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true}\n}\n";
  LoadedConfig l = config_load_string(json, "ds.json");
  CHECK(*l.cfg.train_batch_size == 32);
  CHECK(l.cfg.zero.stage == 3);
  CHECK(l.cfg.zero.overlap_comm);
  expect_error("{\n  \"zero_optimization\": {\"stage\": \"three\"}\n}\n", {"t.yaml:2:34:", "zero_optimization.stage"});
}

TEST_CASE("files: missing, directory, unreadable") {
  try {
    config_load_file("/nonexistent/dir/x.yaml");
    FAIL("no throw");
  } catch (const ConfigError& e) {  // the input rule: a wrong path is the user's to fix, not retried
    CHECK(has(e.what(), "/nonexistent/dir/x.yaml"));
    CHECK(has(e.what(), "does not exist"));
  }
  CHECK_THROWS_AS(config_load_file("/tmp"), ConfigError);
  auto dir = std::filesystem::temp_directory_path() / ("dtrain_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto f = dir / "job.yaml";
  { std::ofstream(f) << kJob << "gradient_cliping: 1\n"; }
  try {
    config_load_file(f.string());
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(has(e.what(), f.string() + ":5:1: gradient_cliping"));
  }
  { std::ofstream(f) << kJob; }
  CHECK(config_load_file(f.string()).cfg.training.name == "job");
  if (::geteuid() != 0) {  // root reads anything
    std::filesystem::permissions(f, std::filesystem::perms::none);
    CHECK_THROWS_AS(config_load_file(f.string()), ConfigError);
  }
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------
TEST_CASE("JSON configs: // and /* */ comments outside strings are skipped; errors say JSON with line") {
  const std::string json =
      "{\n  // the batch\n  \"train_batch_size\": 32, /* global */\n"
      "  \"cluster\": {\"ssh\": {\"user\": \"a//b /* c */\"}},\n"
      "  \"zero_optimization\": {\n    /* two\n       lines */ \"stage\": \"three\"\n  }\n}\n";
  // The comments became blanks: positions after them still point into the file as written.
  std::string m = error_of(json);
  CHECK_MESSAGE(has(m, "t.yaml:7:26:"), m);
  CHECK_MESSAGE(has(m, "zero_optimization.stage"), m);
  std::string ok = json;
  ok.replace(ok.find("\"three\""), 7, "3");
  LoadedConfig l = config_load_string(ok, "ds.json");
  CHECK(*l.cfg.train_batch_size == 32);
  CHECK(l.cfg.zero.stage == 3);
  CHECK(l.cfg.cluster.ssh.user == "a//b /* c */");  // inside a string: not a comment

  m = error_of("{\n  \"train_batch_size\": 32\n  \"fp16\": {}\n}\n");
  CHECK_MESSAGE(has(m, "t.yaml:3:"), m);  // where the parser stopped, after the string it did not expect
  CHECK_MESSAGE(has(m, "JSON syntax error"), m);
  try {
    config_load_string("{\"train_batch_size\": 32,}\n", "ds.json");
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_MESSAGE(has(e.what(), "ds.json:1:25: JSON syntax error"), e.what());
  }
  try {
    config_load_string("{\n  \"train_batch_size\": 32 /* open\n}\n", "ds.json");
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_MESSAGE(has(e.what(), "ds.json:2:26: JSON: a /* comment is not closed"), e.what());
  }
  // A leading comment does not hide that it is JSON.
  CHECK(config_load_string("// ds\n{\"train_batch_size\": 8}\n", "ds.json").cfg.train_batch_size == 8);
  // A YAML flow mapping (not JSON) still loads as YAML.
  CHECK(config_load_string("{zero_optimization: {stage: 1}}\n", "t.yaml").cfg.zero.stage == 1);
}

TEST_CASE("one YAML document per config; merge keys are refused") {
  expect_error(kJob + "---\nsteps_per_print: 5\n", {"t.yaml:5:", "second YAML document"});
  expect_error("# c\n---\n" + kJob + "---\n", {"t.yaml:7:", "second YAML document"});
  CHECK(config_load_string("%YAML 1.2\n---\n" + kJob, "t").cfg.model.n_layer == 2);
  CHECK(config_load_string("---\n" + kJob + "...\n", "t").cfg.model.n_layer == 2);
  expect_error(kJob + "zero_optimization: &z {stage: 2}\nfp16:\n  <<: *z\n", {"t.yaml:7:3:", "fp16", "merge keys"});
  expect_error("<<: {steps_per_print: 5}\n", {"t.yaml:1:1:", "(top level)", "merge keys"});
  // Quoted, "<<" is an ordinary (unknown) key name.
  expect_error(kJob + "\"<<\": 1\n", {"t.yaml:5:1:", "<<: unknown key"});
}

TEST_CASE("data.seq_len must leave a token to predict") {
  expect_error(job({}, {{"seq_len", "1"}}), {"t.yaml:3:", "data.seq_len", "valid range: 2 to"});
  expect_error(job({{"max_seq_len", "1"}}), {"t.yaml:2:", "data.seq_len: 1 (taken from model.max_seq_len)"});
  CHECK(*config_load_string(job({}, {{"seq_len", "2"}}), "t").cfg.data.seq_len == 2);
}

TEST_CASE("relative input paths: a file's against its directory, --set and env against the working directory") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dtrain_paths_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  const fs::path f = dir / "sub" / "job.yaml";
  {
    std::ofstream(f) << job({{"init_from", "../models/m"}}, {{"valid", "v.jsonl"}, {"tokenizer", "tok/tokenizer.json"}},
                            {{"output_dir", "runs/x"}})
                     << "cluster: {ssh: {identity_file: keys/id, known_hosts: ~/.ssh/kh}, rendezvous: {token_file: "
                        "secret/token}}\n";
  }
  const fs::path base = fs::absolute(f).parent_path();
  TrainConfig c = config_load_file(f.string()).cfg;
  CHECK(c.data.train == (base / "x.jsonl").string());
  CHECK(c.data.valid == (base / "v.jsonl").string());
  CHECK(c.data.tokenizer == (base / "tok/tokenizer.json").string());
  CHECK(c.model.init_from == (base / "../models/m").string());
  CHECK(c.cluster.ssh.identity_file == (base / "keys/id").string());
  CHECK(c.cluster.ssh.known_hosts == "~/.ssh/kh");  // the launcher expands ~
  CHECK(c.cluster.rendezvous.token_file == (base / "secret/token").string());
  CHECK(c.training.output_dir == "runs/x");  // an output: the working directory's, like --output-dir

  c = config_load_file(f.string(), {"data.train=t2.jsonl", "data.tokenizer=byte", "data.valid=/abs/v.jsonl"}).cfg;
  CHECK(c.data.train == (fs::current_path() / "t2.jsonl").string());
  CHECK(c.data.tokenizer == "byte");
  CHECK(c.data.valid == "/abs/v.jsonl");

  // Loading the saved (absolute) config again changes nothing.
  { std::ofstream(dir / "config.yaml") << config_to_yaml(c); }
  TrainConfig again = config_load_file((dir / "config.yaml").string()).cfg;
  CHECK(again.data.train == c.data.train);
  CHECK(again.model.init_from == c.model.init_from);

  // From text without a directory, paths stay as written (relative to the working directory).
  CHECK(config_load_string(kJob, "t").cfg.data.train == "x.jsonl");
  fs::remove_all(dir);
}

TEST_CASE("zero_optimization.reduce_scatter / contiguous_gradients: false is warned about as ignored, true is silent") {
  LoadedConfig on = config_load_string(kJob +
                                           "zero_optimization: {stage: 2, reduce_scatter: true, "
                                           "contiguous_gradients: true}\n",
                                       "z.yaml");
  CHECK(on.warnings.empty());
  LoadedConfig off = config_load_string(kJob +
                                            "zero_optimization:\n  stage: 2\n  reduce_scatter: false\n"
                                            "  contiguous_gradients: false\n",
                                        "z.yaml");
  REQUIRE(off.warnings.size() == 2);
  std::string all = off.warnings[0] + "\n" + off.warnings[1];
  INFO(all);
  CHECK(has(all, "z.yaml:7"));
  CHECK(has(all, "zero_optimization.reduce_scatter: false is ignored"));
  CHECK(has(all, "z.yaml:8"));
  CHECK(has(all, "zero_optimization.contiguous_gradients: false is ignored"));
  // From the command line too.
  LoadedConfig set = config_load_string(kJob, "z.yaml", {"zero_optimization.reduce_scatter=false"});
  REQUIRE(set.warnings.size() == 1);
  CHECK(has(set.warnings[0], "reduce_scatter: false is ignored"));
}

TEST_CASE("training.seed takes 64-bit values (it seeds uint64 generators)") {
  LoadedConfig l = config_load_string(kJob, "s.yaml", {"training.seed=4294967296"});
  CHECK(l.cfg.training.seed == 4294967296LL);
  CHECK(error_of(kJob, {"training.seed=-1"}).find("training.seed") != std::string::npos);
}

// ---------------------------------------------------------------------------
TEST_CASE("model.init_from: tokenizer and template default to the model's own, and the notes say so") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dtrain-load-init-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << "{}\n";
  std::ofstream(dir / "tokenizer_config.json")
      << "{\"chat_template\": \"{% for m in messages %}<|im_start|>{% endfor %}\"}\n";
  const std::string head = "model: {init_from: " + dir.string() + "}\ntraining: {max_steps: 2}\n";
  const std::string train = "train: /nonexistent/train.jsonl";
  LoadedConfig l = config_load_string(head + "data: {" + train + "}\n", "t.yaml");
  CHECK(l.cfg.data.tokenizer == (dir / "tokenizer.json").string());
  CHECK(l.cfg.data.template_name == "auto");
  REQUIRE(l.notes.size() == 2);
  CHECK(has(l.notes[0], "model.init_from's; data.tokenizer not given"));
  CHECK(has(l.notes[1], "data.template auto: the chat_template of"));
  // Given ones stay; the byte tokenizer keeps the plain template.
  LoadedConfig b = config_load_string(head + "data: {" + train + ", tokenizer: byte}\n", "t.yaml");
  CHECK(b.cfg.data.tokenizer == "byte");
  CHECK(b.cfg.data.template_name == "plain");
  LoadedConfig t = config_load_string(head + "data: {" + train + ", template: chatml}\n", "t.yaml");
  CHECK(t.cfg.data.template_name == "chatml");
  // No tokenizer.json there: the byte tokenizer, said (the launcher refuses a template that
  // needs the model's special tokens).
  std::filesystem::remove(dir / "tokenizer.json");
  LoadedConfig n = config_load_string(head + "data: {" + train + ", template: chatml}\n", "t.yaml");
  CHECK(n.cfg.data.tokenizer == "byte");
  REQUIRE(n.notes.size() == 1);
  CHECK(has(n.notes[0], "data.tokenizer byte: model.init_from " + dir.string() + " holds no tokenizer.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("preference keys: LLaMA-Factory's stages and losses dtrain does not train are refused by name") {
  // ppo is one edit from dpo: the refusal names what it is instead of suggesting dpo.
  std::string m = error_of(kJob, {"training.stage=ppo"});
  CHECK(has(m, "training.stage: 'ppo' is LLaMA-Factory's PPO stage"));
  CHECK(!has(m, "did you mean"));
  for (const char* s : {"kto", "rm", "pt"})
    CHECK(has(error_of(kJob, {std::string("training.stage=") + s}), "does not train"));
  CHECK(has(error_of(kJob, {"training.stage=dpo", "training.pref_loss=ipo"}), "'ipo' is the IPO preference loss"));
  CHECK(has(error_of(kJob, {"training.stage=dpo", "training.pref_reference=adapters_off"}), "adapters_off needs LoRA"));
  // The bare LLaMA-Factory spellings point to dtrain's keys.
  CHECK(has(error_of(kJob + "pref_beta: 0.2\n"), "training.pref_beta"));
  const TrainConfig c = config_load_string(kJob, "t.yaml", {"training.stage=dpo", "training.pref_loss=simpo"}).cfg;
  CHECK(c.training.stage == "dpo");
  CHECK(c.training.pref_loss == "simpo");
  CHECK(c.training.simpo_gamma == 0.5);
}
