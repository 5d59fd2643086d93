// train_run's TensorBoard scalars (tensorboard.enabled), read back by the independent
// reader (tests/tensorboard/tfevents_read.py) and compared with metrics.jsonl: a round
// that fails after its last checkpoint and the round that resumes it (the new file's
// SessionLog START drops the repeated steps), fp16 overflow steps (non-finite grad
// norms), output_path/job_name, only rank 0 writing, and nothing without the key.
#include "temp_dir.h"
#include "config/train_config.h"
#include "core/error.h"
#include "train/trainer.h"

#include "rank_threads.h"
#include "tensorboard/tfevents_reader.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
using dtrain::test::tfevents_read;
using dtrain::test::tfevents_steps;
namespace fs = std::filesystem;

namespace {

// 6 steps of a tiny Llama, a checkpoint every 2 and an evaluation every 3 steps; fp16
// starting at scale 2^26 so the first steps overflow and are skipped.
const char* kTiny = R"(
train_micro_batch_size_per_gpu: 4
gradient_accumulation_steps: 1
steps_per_print: 1
optimizer:
  type: AdamW
  params:
    lr: 3.0e-3
fp16:
  enabled: true
  initial_scale_power: 26
  hysteresis: 1
model:
  architecture: llama
  vocab_size: 264
  n_layer: 1
  n_head: 2
  n_kv_head: 1
  d_model: 32
  d_ff: 64
  max_seq_len: 32
data:
  train: configs/data/tasks/train.jsonl
  valid: configs/data/tasks/valid.jsonl
  format: alpaca
  tokenizer: byte
  seq_len: 32
  neat_packing: false  # the stream in windows: the task records outrun these sequences
training:
  max_steps: 6
  save_steps: 2
  eval_steps: 3
  seed: 5
)";

using dtrain::test::TempDir;

config::TrainConfig tiny(const std::vector<std::string>& sets, int world = 1) {
  config::TrainConfig c = config::config_load_string(kTiny, "tiny.yaml", sets).cfg;
  config::config_resolve_batch(c, world);
  return c;
}

size_t event_files(const fs::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) ++n;
  return n;
}

}  // namespace

TEST_CASE("a round that fails past its checkpoint, then the resumed round: the scalars match metrics.jsonl") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  const fs::path logs = tmp.path / "tb" / "job1";  // absolute output_path + job_name
  const std::vector<std::string> sets{
      "tensorboard.enabled=true", "tensorboard.output_path=" + (tmp.path / "tb").string(), "tensorboard.job_name=job1"};
  TrainerEnv env;
  env.print = false;
  env.run_dir = run.string();
  // Round 0 dies after logging step 5; its last checkpoint is step 4.
  env.on_step = [](int64_t step) {
    if (step == 5) throw std::runtime_error("test: the rank dies after step 5");
  };
  CHECK_THROWS_WITH_AS(train_run(tiny(sets), env), "test: the rank dies after step 5", std::runtime_error);
  REQUIRE(event_files(logs) == 1);
  env.on_step = nullptr;
  const TrainResult r = train_run(tiny(sets), env);
  REQUIRE(r.resumed_step == 4);
  CHECK(event_files(logs) == 2);
  CHECK(!fs::exists(run / "tensorboard"));  // the absolute output_path, not the run directory

  const auto v = tfevents_read(logs.string(), (run / "metrics.jsonl").string());
  INFO(v.output);
  REQUIRE(v.code == 0);
  CHECK(v.result["sessions"] == nlohmann::json::array({1, 5}));
  CHECK(v.result["purged"] == 5);  // round 0's step 5: loss, lr, grad_norm, tokens_per_s, loss_scale
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/loss_scale"})
    CHECK_MESSAGE((tfevents_steps(v, tag) == std::vector<int64_t>{1, 2, 3, 4, 5, 6}), tag);
  CHECK(tfevents_steps(v, "eval/loss") == std::vector<int64_t>{3, 6});
  CHECK(tfevents_steps(v, "eval/ppl") == std::vector<int64_t>{3, 6});
  CHECK(v.result["metrics_checked"] == 6 * 5 + 2 * 2);
  // The first step overflowed fp16 at scale 2^26: its gradient norm is not finite (null
  // in metrics.jsonl, the float itself in the event file).
  const auto& g0 = v.result["scalars"]["train/grad_norm"][0][1];
  CHECK_MESSAGE((g0 == "inf" || g0 == "nan"), g0.dump());
  CHECK(v.result["scalars"]["train/loss_scale"][0][1].get<double>() == 67108864.0);
}

TEST_CASE("two ranks: rank 0 alone writes, into run_dir/tensorboard by default; off by default") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  const auto errors = dtrain::test::run_ranks(2, [&](comm::Communicator* comm, int rank) {
    TrainerEnv env;
    env.print = false;
    env.run_dir = run.string();
    env.rank = rank;
    env.world_size = 2;
    env.comm = comm;
    train_run(tiny({"tensorboard.enabled=true", "training.max_steps=2", "training.eval_steps=0"}, 2), env);
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e == "", e);
  CHECK(event_files(run / "tensorboard") == 1);
  const auto v = tfevents_read((run / "tensorboard").string(), (run / "metrics.jsonl").string());
  INFO(v.output);
  REQUIRE(v.code == 0);
  CHECK(tfevents_steps(v, "train/loss") == std::vector<int64_t>{1, 2});

  const fs::path off = tmp.path / "off";
  TrainerEnv env;
  env.print = false;
  env.run_dir = off.string();
  train_run(tiny({"training.max_steps=1"}), env);
  CHECK(fs::exists(off / "metrics.jsonl"));
  CHECK(!fs::exists(off / "tensorboard"));
}
