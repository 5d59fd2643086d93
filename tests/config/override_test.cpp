// Overrides: --set key.path=value (typed like YAML, nested paths, lists, maps, unset with
// an empty value, errors with suggestions) and env overrides, with the precedence
// default < file < env < --set.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <filesystem>

#include <cstdlib>
#include <string>

using namespace dtrain;
using namespace dtrain::config;

namespace {

const std::string kJob =
    "train_micro_batch_size_per_gpu: 2\n"
    "model: {architecture: llama, vocab_size: 512, n_layer: 2, n_head: 4, d_model: 64, max_seq_len: 32}\n"
    "data: {train: x.jsonl}\n"
    "training: {max_steps: 10, output_dir: runs/from-file}\n"
    "cluster: {rendezvous: {port: 29600}, env: {set: {A: one}}}\n";

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TrainConfig load(const std::vector<std::string>& sets, const std::string& text = kJob) {
  return config_load_string(text, "t.yaml", sets).cfg;
}

std::string set_error(const std::vector<std::string>& sets) {
  try {
    load(sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError");
  return "";
}

// Sets an env var for one scope and restores the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

void clear_env() {
  for (const char* n : {"DTRAIN_OUTPUT_DIR", "DTRAIN_RDZV_PORT", "DTRAIN_RDZV_ADDR", "DTRAIN_MAX_STEPS", "DTRAIN_SEED",
                        "DTRAIN_DEVICE", "DTRAIN_STEP_TIMEOUT", "DTRAIN_CUDA_GRAPH"})
    ::unsetenv(n);
}

}  // namespace

TEST_CASE("--set: typed scalars, nested paths, lists and maps") {
  clear_env();
  TrainConfig c = load({"zero_optimization.stage=2", "train_micro_batch_size_per_gpu=8", "gradient_clipping=0.5",
                        "bf16.enabled=true", "optimizer.params.betas=[0.8, 0.9]", "lora.r=4",
                        "lora.target_modules=[q_proj, o_proj]", "cluster.env.forward_prefixes=[NCCL_]",
                        "cluster.env.set={B: two, C: 3}", "zero_optimization.reduce_bucket_size=5e8",
                        "data.train=data/with # hash: and colon.jsonl", "scheduler.type=WarmupLR"});
  CHECK(c.zero.stage == 2);
  CHECK(*c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.gradient_clipping == 0.5);
  CHECK(c.bf16.enabled);
  CHECK(c.optimizer.betas == std::array<double, 2>{0.8, 0.9});
  CHECK(c.lora.target_modules == std::vector<std::string>{"q_proj", "o_proj"});
  CHECK(c.cluster.env.forward_prefixes == std::vector<std::string>{"NCCL_"});
  CHECK(c.cluster.env.set == std::map<std::string, std::string>{{"B", "two"}, {"C", "3"}});
  CHECK(c.zero.reduce_bucket_size == 500000000);
  // A relative path given with --set resolves against the working directory.
  CHECK(c.data.train == (std::filesystem::current_path() / "data/with # hash: and colon.jsonl").string());
  CHECK(*c.scheduler.type == "WarmupLR");
}

TEST_CASE("--set: one entry of a mapping keeps the others; later --set wins") {
  clear_env();
  TrainConfig c = load({"cluster.env.set.B=two", "zero_optimization.stage=1", "zero_optimization.stage=3"});
  CHECK(c.cluster.env.set == std::map<std::string, std::string>{{"A", "one"}, {"B", "two"}});
  CHECK(c.zero.stage == 3);
}

TEST_CASE("--set: an empty value or null unsets (the default applies)") {
  clear_env();
  TrainConfig c = load({"training.output_dir=", "train_micro_batch_size_per_gpu=null"});
  CHECK(c.training.output_dir == "runs/t");
  CHECK(!c.train_micro_batch_size_per_gpu);
}

TEST_CASE("--set: \"\" or '' is the empty string, as in a YAML file") {
  clear_env();
  CHECK(load({}).monitor.nvml_library == "libnvidia-ml.so.1");
  CHECK(load({"monitor.nvml_library=\"\""}).monitor.nvml_library.empty());
  CHECK(load({"monitor.nvml_library=''"}).monitor.nvml_library.empty());
  CHECK(load({"monitor.nvml_library="}).monitor.nvml_library == "libnvidia-ml.so.1");
}

TEST_CASE("--set: max_steps and epochs replace each other") {
  clear_env();
  TrainConfig c = load({"training.epochs=2"});
  CHECK(*c.training.epochs == 2);
  CHECK(!c.training.max_steps);
  std::string m = set_error({"training.epochs=2", "training.max_steps=5"});
  CHECK(has(m, "keep one"));
}

TEST_CASE("--set errors") {
  clear_env();
  std::string m = set_error({"train_micro_batch_size_per_gpu=abc"});
  CHECK(has(m, "--set train_micro_batch_size_per_gpu=abc: train_micro_batch_size_per_gpu: expected an integer"));
  m = set_error({"zero_optimization.stage=7"});
  CHECK(has(m, "--set zero_optimization.stage=7"));
  CHECK(has(m, "in [0, 3]"));
  m = set_error({"zero_optimization.stgae=2"});
  CHECK(has(m, "unknown key; did you mean zero_optimization.stage?"));
  m = set_error({"gradient_cliping=1"});
  CHECK(has(m, "did you mean gradient_clipping?"));
  m = set_error({"model.totally_new_thing=1"});
  CHECK(has(m, "model.totally_new_thing: unknown key"));
  m = set_error({"zero_optimization.stage"});
  CHECK(has(m, "--set zero_optimization.stage: expected key.path=value"));
  m = set_error({"=3"});
  CHECK(has(m, "expected key.path=value"));
  m = set_error({"zero_optimization=3"});
  CHECK(has(m, "zero_optimization is a section; set one of its keys: stage"));
  m = set_error({"optimizer.params.betas=[0.9, 0.99"});
  CHECK(has(m, "optimizer.params.betas: the value is not valid YAML"));
  m = set_error({"lora.target_modules={a: b}"});
  CHECK(has(m, "expected a list of strings"));
  m = set_error({"optimizer.type=Lion"});
  CHECK(has(m, "one of: AdamW, Adam"));
}

TEST_CASE("--set of a DeepSpeed key dtrain ignores is accepted with the warning") {
  clear_env();
  LoadedConfig l = config_load_string(kJob, "t.yaml", {"zero_optimization.offload_optimizer.buffer_count=4"});
  REQUIRE(l.warnings.size() == 1);
  CHECK(has(l.warnings[0], "zero_optimization.offload_optimizer.buffer_count"));
}

TEST_CASE("env overrides: default < file < env < --set") {
  clear_env();
  {
    ScopedEnv a("DTRAIN_OUTPUT_DIR", "/scratch/out");
    ScopedEnv b("DTRAIN_RDZV_PORT", "29999");
    ScopedEnv c("DTRAIN_SEED", "7");
    ScopedEnv d("DTRAIN_MAX_STEPS", "77");
    TrainConfig env = load({});
    CHECK(env.training.output_dir == "/scratch/out");  // env beats the file
    CHECK(env.cluster.rendezvous.port == 29999);
    CHECK(env.training.seed == 7);  // env beats the default
    CHECK(*env.training.max_steps == 77);
    TrainConfig set = load({"training.output_dir=/cli", "cluster.rendezvous.port=0", "training.seed=9"});
    CHECK(set.training.output_dir == "/cli");  // --set beats env
    CHECK(set.cluster.rendezvous.port == 0);
    CHECK(set.training.seed == 9);
    // env max_steps replaces the file's epochs
    std::string epochs_job = kJob;
    epochs_job.replace(epochs_job.find("max_steps: 10"), 13, "epochs: 2");
    TrainConfig e = load({}, epochs_job);
    CHECK(*e.training.max_steps == 77);
    CHECK(!e.training.epochs);
  }
  TrainConfig file = load({});
  CHECK(file.training.output_dir == "runs/from-file");
  CHECK(file.cluster.rendezvous.port == 29600);
  CHECK(file.training.seed == 1234);
  CHECK(*file.training.max_steps == 10);
}

TEST_CASE("env overrides are type-checked and named in errors") {
  clear_env();
  ScopedEnv a("DTRAIN_RDZV_PORT", "99999");
  try {
    load({});
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(has(e.what(), "env DTRAIN_RDZV_PORT=99999: cluster.rendezvous.port"));
    CHECK(has(e.what(), "in [0, 65535]"));
  }
  ScopedEnv b("DTRAIN_RDZV_PORT", "");  // empty = not set
  CHECK(load({}).cluster.rendezvous.port == 29600);
}

TEST_CASE("env overrides do not turn a pure DeepSpeed config into a job") {
  clear_env();
  ScopedEnv a("DTRAIN_MAX_STEPS", "5");
  LoadedConfig l = config_load_string("train_batch_size: 8\n", "ds.json");
  CHECK(*l.cfg.training.max_steps == 5);
}

TEST_CASE("fault_tolerance.step_timeout: off by default, DTRAIN_STEP_TIMEOUT, and above heartbeat_interval") {
  clear_env();
  CHECK(load({}).fault_tolerance.step_timeout == 0.0);
  {
    ScopedEnv a("DTRAIN_STEP_TIMEOUT", "90");
    CHECK(load({}).fault_tolerance.step_timeout == 90.0);                                 // env beats the default
    CHECK(load({"fault_tolerance.step_timeout=0"}).fault_tolerance.step_timeout == 0.0);  // --set beats env
  }
  CHECK(load({"fault_tolerance.step_timeout=2.5"}).fault_tolerance.step_timeout == 2.5);
  std::string m = set_error({"fault_tolerance.step_timeout=-1"});
  CHECK(has(m, "fault_tolerance.step_timeout"));
  m = set_error({"fault_tolerance.heartbeat_interval=2", "fault_tolerance.step_timeout=2"});
  CHECK(has(m, "fault_tolerance.step_timeout: 2 s must be 0 (off) or greater than heartbeat_interval = 2 s"));
  ScopedEnv b("DTRAIN_STEP_TIMEOUT", "soon");
  try {
    load({});
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(has(e.what(), "env DTRAIN_STEP_TIMEOUT=soon: fault_tolerance.step_timeout"));
  }
}

TEST_CASE("training.cuda_graph: on by default, DTRAIN_CUDA_GRAPH, --set") {
  clear_env();
  CHECK(load({}).training.cuda_graph);
  {
    ScopedEnv a("DTRAIN_CUDA_GRAPH", "false");
    CHECK_FALSE(load({}).training.cuda_graph);                      // env beats the default
    CHECK(load({"training.cuda_graph=true"}).training.cuda_graph);  // --set beats env
  }
  CHECK_FALSE(load({"training.cuda_graph=false"}).training.cuda_graph);
  ScopedEnv b("DTRAIN_CUDA_GRAPH", "sometimes");
  try {
    load({});
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(has(e.what(), "env DTRAIN_CUDA_GRAPH=sometimes: training.cuda_graph"));
  }
}
