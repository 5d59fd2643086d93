// train_run's checkpoints and resume: a run continued from its step-k checkpoint
// repeats the uninterrupted run bit for bit (losses, final weights, metrics.jsonl
// without duplicates) at 1 and 2 ranks; resharding 4->2, 2->3 and stage 1->3 continues
// the same losses up to fp32 reduction order; a corrupt shard falls back to the previous
// checkpoint naming the file; extending a finished run; and the offline export of a
// 3-rank stage-3 LoRA checkpoint equals the weights the live run exported.
#include "comm/gloo_comm.h"
#include "config/train_config.h"
#include "core/error.h"
#include "train/checkpoint_export.h"
#include "train/metrics.h"
#include "train/trainer.h"

#include "temp_dir.h"
#include "tiny_job.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

using dtrain::test::losses_check_close;
using dtrain::test::TempDir;

// train_batch_size 24 with micro 2: accumulation 12 / 6 / 4 / 3 at 1 / 2 / 3 / 4 ranks,
// so every world size trains on the same global batches.
const std::string kTiny = dtrain::test::tiny_train_yaml({32, true, R"(train_batch_size: 24
train_micro_batch_size_per_gpu: 2
steps_per_print: 1
scheduler:
  type: WarmupDecayLR
  params:
    warmup_num_steps: 3
training:
  max_steps: 8
  save_steps: 3
  keep_last: 10
  seed: 7
zero_optimization:
  stage3_param_persistence_threshold: 0
  reduce_bucket_size: 5000
  allgather_bucket_size: 5000
)"});

// Runs the config on `world` ranks (threads over Gloo); returns rank 0's result.
TrainResult run(const std::vector<std::string>& sets, int world, const std::string& run_dir) {
  return dtrain::test::tiny_train_run(kTiny, sets, world, run_dir);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A run dir that holds only `from`'s checkpoints at the given steps (latest = the last
// one) and its metrics.jsonl: the state a job killed after step `steps.back()`'s
// checkpoint (and a few steps more) leaves behind.
void stage_run_dir(const fs::path& from, const fs::path& to, const std::vector<int>& steps) {
  fs::create_directories(to / "checkpoints");
  for (int k : steps)
    fs::copy(from / "checkpoints" / ("step" + std::to_string(k)), to / "checkpoints" / ("step" + std::to_string(k)),
             fs::copy_options::recursive);
  std::ofstream(to / "checkpoints" / "latest") << "step" << steps.back();
  fs::copy_file(from / "metrics.jsonl", to / "metrics.jsonl");
}

std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end());
}

// Training records of metrics.jsonl: (step, loss) in file order.
std::vector<std::pair<int64_t, double>> train_records(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& j : metrics_read((run_dir / "metrics.jsonl").string())) {
    CHECK_MESSAGE(j.contains("time_ms"), j.dump());
    if (j.contains("loss")) out.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>());
  }
  return out;
}

// Uninterrupted run vs the same run resumed from its step-3 checkpoint: bit-identical.
void check_exact_resume(const std::vector<std::string>& sets, int world, const std::string& tag) {
  TempDir full_dir(tag + "_full"), cut_dir(tag + "_cut");
  const TrainResult full = run(sets, world, full_dir.path.string());
  REQUIRE(full.losses.size() == 8);
  CHECK(full.resumed_step == -1);
  for (int k : {3, 6, 8})
    CHECK(fs::exists(full_dir.path / "checkpoints" / ("step" + std::to_string(k)) / "manifest.json"));

  stage_run_dir(full_dir.path, cut_dir.path, {3});
  const TrainResult resumed = run(sets, world, cut_dir.path.string());
  CHECK(resumed.resumed_step == 3);
  CHECK(resumed.resumed_world_size == world);
  CHECK(resumed.checkpoints_skipped.empty());
  CHECK(resumed.steps == 8);
  CHECK(resumed.applied_steps == full.applied_steps);
  CHECK(resumed.losses == tail(full.losses, 3));  // bit-exact
  CHECK(resumed.final_loss == full.final_loss);
  CHECK(bytes_of(cut_dir.path / "final" / "model.safetensors") ==
        bytes_of(full_dir.path / "final" / "model.safetensors"));
  if (fs::exists(full_dir.path / "final" / "adapter_model.safetensors"))
    CHECK(bytes_of(cut_dir.path / "final" / "adapter_model.safetensors") ==
          bytes_of(full_dir.path / "final" / "adapter_model.safetensors"));
  // metrics.jsonl: the copied file held steps 1-8 of the full run; the resume dropped
  // 4-8 and wrote them again, so every step appears once with the same loss.
  const auto a = train_records(full_dir.path), b = train_records(cut_dir.path);
  CHECK(a.size() == 8);
  CHECK(a == b);
}

}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE("one rank: resume from step 3 is bit-identical (fp16 loss scaler, LoRA dropout)") {
  check_exact_resume(
      {"fp16.enabled=true", "fp16.initial_scale_power=12", "fp16.loss_scale_window=2", "lora.r=4", "lora.dropout=0.1"},
      1, "w1");
}

TEST_CASE("two ranks: resume from step 3 is bit-identical at stages 1 and 3") {
  check_exact_resume({"zero_optimization.stage=1"}, 2, "w2s1");
  check_exact_resume({"zero_optimization.stage=3", "bf16.enabled=true"}, 2, "w2s3");
}

TEST_CASE("resharding: 4 -> 2 ranks, 2 -> 3 ranks and stage 1 -> 3 continue the same losses") {
  struct Case {
    int from_world, to_world;
    std::string from_stage, to_stage;
  };
  for (const Case& c : {Case{4, 2, "2", "2"}, Case{2, 3, "3", "3"}, Case{2, 2, "1", "3"}}) {
    INFO(c.from_world << " ranks stage " << c.from_stage << " -> " << c.to_world << " ranks stage " << c.to_stage);
    TempDir full_dir("reshard_full"), cut_dir("reshard_cut");
    const TrainResult full = run({"zero_optimization.stage=" + c.from_stage}, c.from_world, full_dir.path.string());
    stage_run_dir(full_dir.path, cut_dir.path, {3});
    const TrainResult resumed = run({"zero_optimization.stage=" + c.to_stage}, c.to_world, cut_dir.path.string());
    CHECK(resumed.resumed_step == 3);
    CHECK(resumed.resumed_world_size == c.from_world);
    CHECK(resumed.resumed_stage == std::stoi(c.from_stage));
    losses_check_close(resumed.losses, tail(full.losses, 3), 1e-5);
  }
}

TEST_CASE("a corrupt shard: the previous checkpoint is used, the bad file named, the run still exact") {
  TempDir full_dir("corrupt_full"), cut_dir("corrupt_cut");
  const TrainResult full = run({}, 2, full_dir.path.string());
  stage_run_dir(full_dir.path, cut_dir.path, {3, 6});
  const fs::path bad = cut_dir.path / "checkpoints" / "step6" / "rank1.bin";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-100, std::ios::end);
    f.write(&c, 1);
  }
  const TrainResult resumed = run({}, 2, cut_dir.path.string());
  CHECK(resumed.resumed_step == 3);
  REQUIRE(resumed.checkpoints_skipped.size() == 1);
  CHECK(resumed.checkpoints_skipped[0].find(bad.string()) != std::string::npos);
  CHECK(resumed.checkpoints_skipped[0].find("checksum") != std::string::npos);
  CHECK(resumed.losses == tail(full.losses, 3));
  CHECK(bytes_of(cut_dir.path / "final" / "model.safetensors") ==
        bytes_of(full_dir.path / "final" / "model.safetensors"));
}

TEST_CASE("a finished run: re-running trains nothing; a larger max_steps extends it") {
  TempDir long_dir("extend_long"), dir("extend");
  // WarmupLR does not depend on the total step count, so the first 4 steps of an 8-step
  // run are those of a 4-step run.
  const std::vector<std::string> base{"scheduler.type=WarmupLR", "training.save_steps=0"};
  auto with = [&](const std::string& s) {
    auto v = base;
    v.push_back(s);
    return v;
  };
  const TrainResult whole = run(with("training.max_steps=8"), 1, long_dir.path.string());
  const TrainResult first = run(with("training.max_steps=4"), 1, dir.path.string());
  CHECK(first.losses == std::vector<double>(whole.losses.begin(), whole.losses.begin() + 4));
  CHECK(fs::exists(dir.path / "checkpoints" / "step4"));

  const TrainResult again = run(with("training.max_steps=4"), 1, dir.path.string());
  CHECK(again.resumed_step == 4);
  CHECK(again.losses.empty());
  CHECK(again.steps == 4);
  CHECK(fs::exists(dir.path / "final" / "model.safetensors"));

  const TrainResult more = run(with("training.max_steps=8"), 1, dir.path.string());
  CHECK(more.resumed_step == 4);
  CHECK(more.losses == tail(whole.losses, 4));
  CHECK(bytes_of(dir.path / "final" / "model.safetensors") == bytes_of(long_dir.path / "final" / "model.safetensors"));
  CHECK(train_records(dir.path) == train_records(long_dir.path));
}

TEST_CASE("final/ as a symbolic link (a loop, or to a directory elsewhere) is replaced, never followed") {
  // Issue 43, item 19: final -> final survived the resume, and the final export failed
  // "Not a directory" (retried, exit 3).
  TempDir dir("final_link"), elsewhere("final_link_elsewhere");
  const std::vector<std::string> base{"scheduler.type=WarmupLR", "training.save_steps=0"};
  auto with = [&](const std::string& s) {
    auto v = base;
    v.push_back(s);
    return v;
  };
  const fs::path final_dir = dir.path / "final";
  auto is_real_final = [&] {
    std::error_code ec;
    return !fs::is_symlink(fs::symlink_status(final_dir, ec)) && fs::is_directory(final_dir, ec) &&
           fs::exists(final_dir / "model.safetensors", ec);
  };
  run(with("training.max_steps=2"), 1, dir.path.string());
  REQUIRE(is_real_final());

  // A resume that trains on: final -> final is dropped, final/ written again.
  fs::remove_all(final_dir);
  fs::create_directory_symlink("final", final_dir);
  const TrainResult more = run(with("training.max_steps=4"), 1, dir.path.string());
  CHECK(more.resumed_step == 2);
  CHECK(is_real_final());

  // Nothing to train (final/ is written again): a link to a directory elsewhere is
  // replaced by the run's own final/, and what it pointed to is left as it was.
  fs::create_directories(elsewhere.path);
  std::ofstream(elsewhere.path / "keep.txt") << "not the run's";
  fs::remove_all(final_dir);
  fs::create_directory_symlink(elsewhere.path, final_dir);
  const TrainResult again = run(with("training.max_steps=4"), 1, dir.path.string());
  CHECK(again.losses.empty());
  CHECK(is_real_final());
  CHECK(bytes_of(elsewhere.path / "keep.txt") == "not the run's");
  CHECK(!fs::exists(elsewhere.path / "model.safetensors"));
}

TEST_CASE("export: a 3-rank stage-3 LoRA checkpoint gives the weights the live run exported") {
  TempDir dir("export");
  const TrainResult r =
      run({"zero_optimization.stage=3", "bf16.enabled=true", "lora.r=4", "training.max_steps=4"}, 3, dir.path.string());
  REQUIRE(r.losses.size() == 4);
  const CheckpointExportResult e = checkpoint_export_hf(dir.path.string());
  CHECK(e.step == 4);
  CHECK(e.saved_world_size == 3);
  CHECK(e.saved_stage == 3);
  CHECK(e.lora);
  const fs::path out = dir.path / "export";
  for (const char* f : {"model.safetensors", "adapter_model.safetensors", "config.json", "adapter_config.json"})
    CHECK_MESSAGE(bytes_of(out / f) == bytes_of(dir.path / "final" / f), f);

  // A damaged latest: the export falls back to the step-3 checkpoint and says so.
  std::ofstream(dir.path / "checkpoints" / "step4" / "rank2.bin", std::ios::trunc) << "x";
  const CheckpointExportResult old = checkpoint_export_hf(dir.path.string(), (dir.path / "old").string());
  CHECK(old.step == 3);
  REQUIRE(old.skipped.size() == 1);
  CHECK(old.skipped[0].find("rank2.bin") != std::string::npos);
  CHECK(fs::exists(dir.path / "old" / "model.safetensors"));
  CHECK_THROWS_AS(checkpoint_export_hf((dir.path / "old").string()), CheckpointError);
}
