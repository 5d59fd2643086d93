// Preference training through the real binary, end to end on LLaMA-Factory-shaped pairwise
// data (configs/data/preference): `data prepare` of a ranking entry into a pairwise shard,
// `launch` of a stage-dpo job on 2 ranks at ZeRO-3 (LoRA, the reference = the base with the
// adapters off), then `status`, `export --merge-lora`, `eval` on held-out SFT records and a
// resume that has nothing left to train; and a full-fine-tuning DPO job read on the fly.
#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

// A tiny model learning from scratch: only the plumbing is under test here (the objectives
// are checked against PyTorch by pref_parity_test, learning by train_preference_trainer_test).
std::string job(const std::string& dir, const std::string& data_lines) {
  const std::string path = dir + "/dpo.yaml";
  std::ofstream(path) << R"(train_micro_batch_size_per_gpu: 2
steps_per_print: 2
optimizer:
  type: AdamW
  params:
    lr: 1.0e-3
)" << dtrain::test::tiny_llama_yaml(96)
                      << data_lines << R"(
training:
  stage: dpo
  max_steps: 6
  save_steps: 3
zero_optimization:
  stage: 3
  stage3_param_persistence_threshold: 0
)";
  return path;
}

std::vector<nlohmann::json> records(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("a stage-dpo job on a prepared LLaMA-Factory ranking dataset: launch on 2 ranks, status, export, eval") {
  if (dtrain_bin().empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-pref");
  const std::string data_dir = (source_root() / "configs/data/preference").string();
  RunResult r = run_dtrain({"data", "prepare", data_dir, tmp.path() + "/pairs.bin", "--dataset", "basics_pref_alpaca",
                            "--template", "plain", "--tokenizer", "byte"});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(contains(r.out, "chosen/rejected pairs"));

  const std::string run_dir = tmp.path() + "/run";
  const std::string cfg = job(tmp.path(), fmt::format(R"(data:
  train: {}/pairs.bin
  format: tokens
  seq_len: 96
lora:
  r: 4
  alpha: 8
  target_modules: [q_proj, v_proj])",
                                                      tmp.path()));
  r = run_dtrain({"launch", "--config", cfg, "--nproc-per-node", "2", "--master-port", "0", "--output-dir", run_dir});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(contains(r.out, "rewards/accuracies"));  // the live line carries the preference metrics
  const auto recs = records(fs::path(run_dir) / "metrics.jsonl");
  int train_records = 0;
  for (const auto& j : recs) {
    if (!j.contains("loss")) continue;
    ++train_records;
    for (const char* k : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                          "logps/rejected"})
      CHECK_MESSAGE(j.contains(k), k << " missing in " << j.dump());
    CHECK(std::isfinite(j.at("loss").get<double>()));
  }
  CHECK(train_records == 3);
  CHECK(!fs::exists(fs::path(run_dir) / "reference_logps.bin"));  // LoRA: the base with the adapters off
  CHECK(fs::exists(fs::path(run_dir) / "final" / "adapter_model.safetensors"));

  r = run_dtrain({"status", run_dir});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "rewards/accuracies"));

  r = run_dtrain({"export", run_dir, "-o", tmp.path() + "/merged", "--merge-lora"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(fs::exists(fs::path(tmp.path()) / "merged" / "model.safetensors"));

  // The trained model answers held-out questions (the SFT form of the same task).
  r = run_dtrain({"eval", run_dir, "--data", (source_root() / "configs/data/basics/valid.jsonl").string(),
                  "--max-records", "8", "--config", cfg});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "accuracy "));

  // Resumed at its end: nothing to train, the same final/ written again.
  r = run_dtrain({"resume", run_dir, "--master-port", "0"});
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "nothing to train"));
}

TEST_CASE("full-fine-tuning DPO on the fly from a dataset_info.json: the reference is computed once and kept") {
  if (dtrain_bin().empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp("dtrain-pref-full");
  const std::string data_dir = (source_root() / "configs/data/preference").string();
  const std::string run_dir = tmp.path() + "/run";
  const std::string cfg = job(tmp.path(), fmt::format(R"(data:
  train: {}
  dataset: basics_pref_sharegpt
  valid: {}/valid.jsonl
  tokenizer: byte
  template: chatml
  seq_len: 96)",
                                                      data_dir, data_dir));
  RunResult r = run_dtrain({"launch", "--config", cfg, "--master-port", "0", "--output-dir", run_dir});
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(contains(r.out, "reference log-probabilities of"));
  CHECK(contains(r.out, "eval step 0 | eval_loss"));
  CHECK(contains(r.out, "eval_pref_accuracy"));
  CHECK(fs::exists(fs::path(run_dir) / "reference_logps.bin"));
  // An SFT stage on the same pairs is refused by name before any rank starts training.
  r = run_dtrain({"launch", "--config", cfg, "--master-port", "0", "--output-dir", tmp.path() + "/sft", "--set",
                  "training.stage=sft"});
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK(contains(r.out, "training.stage"));
}
