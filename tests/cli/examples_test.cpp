// examples/ through the real binary: every recipe (found by globbing, so a new one is tested
// without a line here) plans with `launch --plan-for 8x80GB` against a directory holding only
// its model's config.json (tests/data/hf_configs/MODEL); without --plan-for the same dry
// run still exits 2 naming what this machine lacks; the recipes cover the grid the README
// promises; the shipped datasets load; examples/README.md's generated part is current.
#include "cli_harness.h"
#include "skip.h"

#include "config/train_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

// examples/MODEL/RECIPE.yaml, relative to the source root, sorted.
std::vector<std::string> recipes() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& m : fs::directory_iterator(source_root() / "examples", ec)) {
    if (!m.is_directory() || m.path().filename() == "data") continue;
    for (const auto& f : fs::directory_iterator(m.path(), ec))
      if (f.path().extension() == ".yaml") out.push_back(fs::relative(f.path(), source_root()).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string model_of(const std::string& recipe) { return fs::path(recipe).parent_path().filename().string(); }

// A directory holding only the recipe's model's config.json (no weights, no tokenizer).
std::string config_only_dir(const TempDir& tmp, const std::string& model) {
  const fs::path from = source_root() / "tests" / "data" / "hf_configs" / model / "config.json";
  REQUIRE_MESSAGE(fs::is_regular_file(from), "examples/", model,
                  "/ has no tests/data/hf_configs/<model>/config.json: add the model's published config.json there");
  const fs::path dir = fs::path(tmp.path()) / model;
  fs::create_directories(dir);
  fs::copy_file(from, dir / "config.json", fs::copy_options::overwrite_existing);
  return dir.string();
}

dtrain::config::TrainConfig load(const std::string& recipe, std::vector<std::string>* warnings = nullptr) {
  auto loaded = dtrain::config::config_load_file((source_root() / recipe).string(), {});
  if (warnings) *warnings = loaded.warnings;
  return loaded.cfg;
}

}  // namespace

TEST_CASE("every recipe in examples/ plans for 8 x 80 GB against a directory holding only its model's config.json") {
  if (dtrain_bin().empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-examples");
  const auto list = recipes();
  REQUIRE(list.size() >= 8);
  for (const std::string& recipe : list) {
    CAPTURE(recipe);
    const std::string model_dir = config_only_dir(tmp, model_of(recipe));
    const RunResult r = run_dtrain({"launch", "--config", recipe, "--set", "model.init_from=" + model_dir,
                                    "--output-dir", tmp.path() + "/run", "--plan-for", "8x80GB"});
    INFO(r.out);
    CHECK(r.rc == 0);
    CHECK(!contains(r.out, "warning"));
    const auto cfg = load(recipe);
    CHECK(contains(r.out, "plan for    8 GPUs of 80 GB (74.51 GiB) on 1 node"));
    CHECK(contains(r.out, fmt::format("memory per rank (ZeRO stage {}, 8 rank(s)", cfg.zero.stage)));
    CHECK(contains(r.out, "(of 74.51 GiB per GPU: fits)"));
    CHECK(contains(r.out, "per node: 8 rank(s)"));
    // What the directory lacks is said, and is not a reason to fail.
    CHECK(contains(r.out, "holds no weights here"));
    CHECK(contains(r.out, "holds no tokenizer.json here"));
    // The recipe's LLaMA-Factory datasets are found in the shipped dataset_info.json.
    CHECK(contains(r.out, "data        data.dataset " + cfg.data.dataset + ": "));
  }
}

TEST_CASE(
    "the recipes cover each model with LoRA and full SFT, ZeRO-2 and 3, offload or not, alpaca and sharegpt, and each preference objective") {
  std::map<std::string, std::set<bool>> lora_by_model;
  std::set<int64_t> stages;
  std::set<bool> offload;
  std::set<std::string> datasets, methods;
  for (const std::string& recipe : recipes()) {
    CAPTURE(recipe);
    std::vector<std::string> warnings;
    const auto cfg = load(recipe, &warnings);
    for (const auto& w : warnings) MESSAGE(w);
    CHECK(warnings.empty());
    if (cfg.training.stage == "sft") lora_by_model[model_of(recipe)].insert(cfg.lora.enabled());
    stages.insert(cfg.zero.stage);
    offload.insert(cfg.zero.offload_optimizer_device == "cpu");
    datasets.insert(cfg.data.dataset);
    CHECK(cfg.training.device == "cuda");
    CHECK(cfg.bf16.enabled);
    CHECK(cfg.data.tokenizer == "byte");  // not given: init_from's tokenizer.json where the job runs
    // The file name says the method, stage and offload: {lora,full}_sft_..., or for
    // preference training {dpo,orpo,simpo}_{lora,full}_... (dpo: pref_loss sigmoid).
    const std::string name = fs::path(recipe).stem().string();
    const std::string kind = cfg.lora.enabled() ? "lora" : "full";
    if (cfg.training.stage == "dpo") {
      const std::string method = cfg.training.pref_loss == "sigmoid" ? "dpo" : cfg.training.pref_loss;
      CHECK(name.rfind(method + "_" + kind + "_", 0) == 0);
      CHECK(cfg.data.dataset == "example_preference");
      methods.insert(method);
    } else {
      CHECK(name.rfind(kind + "_sft_", 0) == 0);
    }
    CHECK(contains(name, fmt::format("zero{}", cfg.zero.stage)));
    CHECK(contains(name, "offload") == (cfg.zero.offload_optimizer_device == "cpu"));
  }
  for (const char* model : {"llama3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b"}) {
    CAPTURE(model);
    CHECK(lora_by_model[model] == std::set<bool>{false, true});
  }
  CHECK(stages == std::set<int64_t>{2, 3});
  CHECK(offload == std::set<bool>{false, true});
  CHECK(datasets == std::set<std::string>{"example_alpaca", "example_sharegpt", "example_preference"});
  CHECK(methods == std::set<std::string>{"dpo", "orpo", "simpo"});  // a recipe for each objective
}

TEST_CASE("without --plan-for a recipe's dry run against config.json alone still exits 2 naming what is missing") {
  if (dtrain_bin().empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-examples");
  const std::string recipe = "examples/qwen3-8b/lora_sft_zero3.yaml";
  const std::string model_dir = config_only_dir(tmp, "qwen3-8b");
  // One remote node (TEST-NET-2, never contacted): nothing is asked of this machine's GPUs.
  const std::string hosts = tmp.path() + "/hosts";
  std::ofstream(hosts) << "198.51.100.7 slots=8\n";
  const std::vector<std::string> base = {"launch",       "--dry-run",
                                         "--config",     recipe,
                                         "--hostfile",   hosts,
                                         "--set",        "model.init_from=" + model_dir,
                                         "--output-dir", tmp.path() + "/run"};
  RunResult r = run_dtrain(base);
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "--dry-run: a launch of this job would fail on this machine (1 reason)"));
  CHECK(
      contains(r.out, "holds no tokenizer.json and data.tokenizer is not given, so the byte tokenizer would be used"));
  CHECK(contains(r.out, "data        data.tokenizer byte: model.init_from " + model_dir + " holds no tokenizer.json"));
  CHECK(contains(r.out, "tokenizer 'byte' has no <think>"));
  // A template the byte tokenizer can write: the missing weights are then the reason.
  std::vector<std::string> args = base;
  for (const char* s : {"data.tokenizer=byte", "data.template=chatml"}) args.insert(args.end(), {"--set", s});
  r = run_dtrain(args);
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "model.init_from: " + model_dir + ": no model.safetensors"));
  CHECK(contains(r.out, "memory per rank (ZeRO stage 3"));  // the plan is still printed
  // With weights that are here, --plan-for checks them as a launch would: a FIFO is refused.
  REQUIRE(::mkfifo((model_dir + "/model.safetensors").c_str(), 0600) == 0);
  r = run_dtrain({"launch", "--config", recipe, "--set", "model.init_from=" + model_dir, "--output-dir",
                  tmp.path() + "/run", "--plan-for", "8x80GB"});
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "--plan-for 8x80GB: a launch of this job on 8 GPUs of 80 GB (74.51 GiB) on 1 node would fail"));
  CHECK(contains(r.out, "model.safetensors"));
  CHECK(!contains(r.out, "holds no weights here"));
}

TEST_CASE("--plan-for: a rank that does not fit is exit 2 after the plan; the hosts and the grammar") {
  if (dtrain_bin().empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-examples");
  const std::string recipe = "examples/mistral-7b/full_sft_zero2.yaml";
  const std::string model_dir = config_only_dir(tmp, "mistral-7b");
  const std::vector<std::string> base = {
      "launch", "--config", recipe, "--set", "model.init_from=" + model_dir, "--output-dir", tmp.path() + "/run"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return run_dtrain(a);
  };
  RunResult r = with({"--plan-for", "8x24GB"});
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "(of 22.35 GiB per GPU: does NOT fit)"));
  CHECK(contains(r.out, "--plan-for 8x24GB: a launch of this job on 8 GPUs of 24 GB (22.35 GiB) on 1 node would fail"));
  CHECK(contains(r.out, "offload the optimizer"));
  // Two nodes: 16 ranks on node1 and node2, no node commands (the placeholders have none).
  r = with({"--plan-for", "2x8x80GB"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "world size 16, 2 nodes"));
  CHECK(contains(r.out, "node1..node2 stand for the cluster's hosts"));
  CHECK(!contains(r.out, "command:"));
  CHECK(contains(r.out, "memory per rank (ZeRO stage 2, 16 rank(s)"));
  // The size alone plans on the hostfile's hosts, with each node's command.
  const std::string hosts = tmp.path() + "/hosts";
  std::ofstream(hosts) << "198.51.100.7 slots=4\n198.51.100.8 slots=4\n";
  r = with({"--hostfile", hosts, "--plan-for", "80GiB"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "world size 8, 2 nodes"));
  CHECK(contains(r.out, "command:"));
  CHECK(contains(r.out, "(of 80.00 GiB per GPU: fits)"));
  // Usage errors, each naming the flag and the grammar.
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--plan-for", "8x80"}, "'80' is not a GPU memory size"},
           {{"--plan-for", "0x80GB"}, "0 GPUs per node is outside 1.."},
           {{"--plan-for", "1x2x3x80GB"}, "give [NODES x] GPUS x SIZE"},
           {{"--plan-for", "80GB"}, "--plan-for 80GB gives no GPU count"},
           {{"--plan-for", "8x80GB", "--hostfile", hosts}, "so --hostfile has nothing to select"},
           {{"--plan-for", "8x80GB", "--set", "training.device=cpu"}, "plans GPU ranks, but"}}) {
    r = with(args);
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, says));
  }
  // The model's shape must be here: a directory without config.json says how to give one.
  r = run_dtrain({"launch", "--config", recipe, "--set", "model.init_from=" + tmp.path(), "--output-dir",
                  tmp.path() + "/run", "--plan-for", "8x80GB"});
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "reads the model's shape from model.init_from's config.json"));
}

TEST_CASE("the shipped LLaMA-Factory datasets load: every record of both, rendered with a template") {
  if (dtrain_bin().empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-examples");
  size_t records = 0;
  const auto info = nlohmann::json::parse(read_text((source_root() / "examples/data/dataset_info.json").string()));
  for (const char* name : {"example_alpaca", "example_sharegpt"}) {
    REQUIRE(info.contains(name));
    const std::string file = info[name]["file_name"].get<std::string>();
    records += nlohmann::json::parse(read_text((source_root() / "examples/data" / file).string())).size();
  }
  CHECK(records >= 48);  // a few dozen each
  const RunResult r =
      run_dtrain({"data", "prepare", (source_root() / "examples/data").string(), tmp.path() + "/out.bin", "--dataset",
                  "example_alpaca,example_sharegpt", "--template", "chatml", "--tokenizer", "byte"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, fmt::format("wrote {}/out.bin: {} documents", tmp.path(), records)));
  // The preference entry: a ranking dataset, prepared into pairs (two documents each).
  REQUIRE(info.contains("example_preference"));
  CHECK(info["example_preference"].value("ranking", false));
  const size_t pairs =
      nlohmann::json::parse(read_text((source_root() / "examples/data/example_preference.json").string())).size();
  const RunResult p =
      run_dtrain({"data", "prepare", (source_root() / "examples/data").string(), tmp.path() + "/pairs.bin", "--dataset",
                  "example_preference", "--template", "chatml", "--tokenizer", "byte"});
  INFO(p.out);
  CHECK(p.rc == 0);
  CHECK(contains(p.out, fmt::format("{} chosen/rejected pairs", pairs)));
}

TEST_CASE("examples/README.md's commands and memory plans are what scripts/examples_plans.sh prints") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  const RunResult r = run({"/bin/bash", (source_root() / "scripts/examples_plans.sh").string(), "--print", bin}, {},
                          std::chrono::seconds(300));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const std::string readme = read_text((source_root() / "examples/README.md").string());
  const std::string begin = "<!-- generated by scripts/examples_plans.sh: do not edit below -->";
  const std::string end = "<!-- generated by scripts/examples_plans.sh: do not edit above -->";
  const size_t a = readme.find(begin), b = readme.find(end);
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  const std::string part = readme.substr(a, b + end.size() - a) + "\n";
  INFO("examples/README.md is stale: run scripts/examples_plans.sh (after building dtrain)");
  CHECK(part == r.out);
  // Every recipe is in it.
  for (const std::string& recipe : recipes()) CHECK_MESSAGE(contains(part, "--config " + recipe), recipe);
}
