// train_run with training.stage dpo on pairwise data: DPO (LoRA with the adapters-off
// reference, full with the precomputed one), ORPO and SimPO on 2 ranks at ZeRO-0 and
// ZeRO-3 give the single-rank losses; a resumed run equals the uninterrupted one bit for
// bit; the reference file is checked on resume; a tiny task is learnt.
#include "comm/gloo_comm.h"
#include "config/train_config.h"
#include "core/error.h"
#include "train/metrics.h"
#include "train/trainer.h"

#include "rank_threads.h"
#include "tiny_job.h"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("dtrain_pref_trainer_" + std::to_string(getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A preference task a tiny model masters: "x+y=" answered with the right sum (chosen) or
// a sum off by one to three (rejected), alpaca-ranking records.
void write_pairs(const fs::path& path, int first, int count) {
  std::ofstream f(path);
  for (int i = first; i < first + count; ++i) {
    const int x = (i * 7) % 10, y = (i * 3 + 1) % 10, off = 1 + i % 3;
    f << "{\"instruction\": \"" << x << "+" << y << "=\", \"input\": \"\", \"chosen\": \"" << x + y
      << "\", \"rejected\": \"" << x + y + off << "\"}\n";
  }
}

const std::string kTiny = R"(
train_micro_batch_size_per_gpu: 4
gradient_accumulation_steps: 1
optimizer:
  type: AdamW
  params:
    lr: 5.0e-3
    betas: [0.9, 0.95]
    weight_decay: 0.0
)" + dtrain::test::tiny_llama_yaml(48) +
                          R"(data:
  format: pairwise
  tokenizer: byte
  seq_len: 48
  pack: false
training:
  stage: dpo
  pref_beta: 0.5
  max_steps: 8
  save_steps: 3
  keep_last: 5
  seed: 11
zero_optimization:
  stage3_param_persistence_threshold: 0
  reduce_bucket_size: 5000
)";

struct Data {
  TempDir dir{"data"};
  std::string train, valid;
  Data() {
    train = (dir.path / "train.jsonl").string();
    valid = (dir.path / "valid.jsonl").string();
    write_pairs(train, 0, 48);
    write_pairs(valid, 1000, 16);
  }
};

const Data& data() {
  static const Data d;
  return d;
}

// Runs the config on `world` ranks (threads over Gloo): every rank's result, and each
// rank's error ("" when it ran through).
std::pair<std::vector<TrainResult>, std::vector<std::string>> run_ranks(std::vector<std::string> sets, int world,
                                                                        const std::string& run_dir) {
  sets.insert(sets.begin(), "data.train=" + data().train);
  std::vector<TrainResult> res(static_cast<size_t>(world));
  auto errors = dtrain::test::run_ranks(world, [&](comm::Communicator* comm, int r) {
    TrainerEnv env;
    env.print = false;
    env.run_dir = run_dir;
    env.rank = r;
    env.world_size = world;
    env.comm = comm;
    config::TrainConfig c = config::config_load_string(kTiny, "tiny.yaml", sets).cfg;
    config::config_resolve_batch(c, world);
    res[static_cast<size_t>(r)] = train_run(c, env);
  });
  return {res, errors};
}

// rank 0's result of a run that must succeed (every rank with the same losses).
TrainResult run(const std::vector<std::string>& sets, int world, const std::string& run_dir = "") {
  const auto [res, errors] = run_ranks(sets, world, run_dir);
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  for (int r = 1; r < world; ++r) CHECK(res[static_cast<size_t>(r)].losses == res[0].losses);
  return res[0];
}

void check_close(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1 << ": " << a[i] << " vs " << b[i]);
    CHECK(std::fabs(a[i] - b[i]) <= rel * std::fabs(b[i]) + 1e-7);
  }
}

const std::vector<std::string> kLora{"lora.r=4", "lora.alpha=8", "lora.target_modules=[q_proj,v_proj,down_proj]"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The metrics.jsonl training records' value of `key`, in step order.
std::vector<double> metric(const fs::path& run_dir, const std::string& key) {
  std::vector<double> out;
  for (const auto& j : metrics_read((run_dir / "metrics.jsonl").string()))
    if (j.contains(key) && j.contains("loss")) out.push_back(j.at(key).get<double>());
  return out;
}

}  // namespace

TEST_CASE("DPO, ORPO and SimPO on 2 ranks at ZeRO-0 and ZeRO-3 give the single-rank losses") {
  const std::vector<std::vector<std::string>> objectives{
      kLora,                                    // DPO, reference = base with adapters off
      {"training.pref_reference=precomputed"},  // DPO, full, precomputed reference
      with(kLora, {"training.pref_loss=orpo", "training.pref_ftx=0.2"}),
      {"training.pref_loss=simpo", "training.pref_beta=2.0", "training.simpo_gamma=0.4"},
  };
  for (const auto& obj : objectives) {
    std::string what;
    for (const auto& s : obj) what += s + " ";
    CAPTURE(what);
    const TrainResult single = run(with(obj, {"training.save_steps=0"}), 1);
    REQUIRE(single.losses.size() == 8);
    for (double l : single.losses) CHECK(std::isfinite(l));
    for (int stage : {0, 3}) {
      CAPTURE(stage);
      const TrainResult two = run(with(obj, {"training.save_steps=0", "train_micro_batch_size_per_gpu=2",
                                             "zero_optimization.stage=" + std::to_string(stage)}),
                                  2);
      check_close(two.losses, single.losses, 2e-5);
    }
  }
}

TEST_CASE("a DPO run resumed from its step-3 checkpoint equals the uninterrupted run bit for bit") {
  for (auto obj : std::vector<std::vector<std::string>>{kLora, {"training.pref_reference=precomputed"}}) {
    const bool precomputed = obj.size() == 1;
    obj.push_back("steps_per_print=1");  // a record per step: the interval means match too
    TempDir full("full"), cut("cut");
    const TrainResult a = run(obj, 1, full.path.string());
    REQUIRE(a.losses.size() == 8);
    CHECK(fs::exists(full.path / "reference_logps.bin") == precomputed);
    fs::create_directories(cut.path / "checkpoints");
    fs::copy(full.path / "checkpoints" / "step3", cut.path / "checkpoints" / "step3", fs::copy_options::recursive);
    std::ofstream(cut.path / "checkpoints" / "latest") << "step3";
    fs::copy_file(full.path / "metrics.jsonl", cut.path / "metrics.jsonl");
    if (precomputed) {
      // Without the reference file the resume is refused, naming it.
      const auto [none, errors] = run_ranks(obj, 1, cut.path.string());
      REQUIRE(errors.size() == 1);
      CHECK(errors[0].find("reference_logps.bin: missing") != std::string::npos);
      // ... and refused for other data, naming what differs.
      std::ofstream(cut.path / "reference_logps.bin") << "not a table";
      const auto [bad, errors2] = run_ranks(obj, 1, cut.path.string());
      CHECK(errors2[0].find("not a dtrain reference log-probability file") != std::string::npos);
      fs::remove(cut.path / "reference_logps.bin");
      fs::copy_file(full.path / "reference_logps.bin", cut.path / "reference_logps.bin");
    }
    const TrainResult b = run(obj, 1, cut.path.string());
    CHECK(b.resumed_step == 3);
    CHECK(b.losses == std::vector<double>(a.losses.begin() + 3, a.losses.end()));
    CHECK(metric(cut.path, "rewards/accuracies") == metric(full.path, "rewards/accuracies"));
  }
}

TEST_CASE("a preference run learns the task: rewards/accuracies above 0.9, held-out accuracy up") {
  TempDir d("learn");
  const TrainResult r = run({"training.max_steps=60", "training.save_steps=0", "steps_per_print=10",
                             "data.valid=" + data().valid, "training.pref_reference=precomputed"},
                            1, d.path.string());
  const std::vector<double> acc = metric(d.path, "rewards/accuracies");
  REQUIRE(acc.size() == 6);
  CHECK(acc.back() > 0.9);
  std::vector<double> eval;
  for (const auto& j : metrics_read((d.path / "metrics.jsonl").string()))
    if (j.contains("eval_pref_accuracy")) eval.push_back(j.at("eval_pref_accuracy").get<double>());
  REQUIRE(eval.size() == 2);  // the starting model (step 0) and the trained one
  CHECK(eval.back() > eval.front());
  CHECK(r.final_pref_accuracy == eval.back());
  MESSAGE("held-out preference accuracy " << eval.front() << " -> " << eval.back() << ", rewards/accuracies "
                                          << acc.back());
}
