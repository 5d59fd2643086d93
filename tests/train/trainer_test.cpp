// train_run on tiny inline configs over the shipped SFT data: the loss falls, runs are
// deterministic, gradient accumulation and 2-rank data parallelism reproduce the
// single-rank loss, bf16/fp16 (with loss scaling and forced overflow) train, LoRA
// touches only the adapters, and metrics.jsonl holds the documented fields.
#include "comm/gloo_comm.h"
#include "config/train_config.h"
#include "core/error.h"
#include "data/prepare.h"
#include "model/safetensors.h"
#include "train/metrics.h"
#include "train/model_factory.h"
#include "train/trainer.h"

#include "rank_threads.h"
#include "temp_dir.h"
#include "tiny_job.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

using dtrain::test::losses_check_close;
using dtrain::test::TempDir;

const std::string kTiny = dtrain::test::tiny_train_yaml({48, true, R"(train_micro_batch_size_per_gpu: 4
gradient_accumulation_steps: 1
steps_per_print: 10
training:
  max_steps: 40
  seed: 7
)"});

config::TrainConfig tiny(const std::vector<std::string>& sets = {}, int world = 1) {
  return dtrain::test::tiny_train_config(kTiny, sets, world);
}

TrainerEnv quiet_env(const std::string& run_dir = "") {
  TrainerEnv e;
  e.run_dir = run_dir;
  e.print = false;
  return e;
}

double mean(const std::vector<double>& v, size_t b, size_t e) {
  return std::accumulate(v.begin() + static_cast<ptrdiff_t>(b), v.begin() + static_cast<ptrdiff_t>(e), 0.0) /
         static_cast<double>(e - b);
}

}  // namespace

TEST_CASE("fp32 training lowers the loss on the shipped SFT data and is deterministic") {
  const auto cfg = tiny();
  TrainResult a = train_run(cfg, quiet_env());
  REQUIRE(a.losses.size() == 40);
  CHECK(a.steps == 40);
  CHECK(a.applied_steps == 40);
  CHECK(a.skipped_steps == 0);
  CHECK(a.losses[0] == doctest::Approx(std::log(264.0)).epsilon(0.05));  // near uniform at init
  const double first = mean(a.losses, 0, 5), last = mean(a.losses, 35, 40);
  INFO("first " << first << " last " << last);
  CHECK(last < first - 1.0);
  CHECK(std::isnan(a.final_eval_loss));  // no data.valid
  CHECK(a.tokens == 40 * 4 * 48);

  TrainResult b = train_run(cfg, quiet_env());
  CHECK(a.losses == b.losses);  // bit-identical
  CHECK(a.grad_norms == b.grad_norms);
}

TEST_CASE("gradient accumulation: micro 4 x accum 1 == micro 2 x accum 2 == micro 1 x accum 4") {
  const std::vector<std::string> base{"training.max_steps=12", "gradient_clipping=1.0"};
  auto with = [&](int micro, int accum) {
    auto s = base;
    s.push_back("train_micro_batch_size_per_gpu=" + std::to_string(micro));
    s.push_back("gradient_accumulation_steps=" + std::to_string(accum));
    return train_run(tiny(s), quiet_env());
  };
  TrainResult a = with(4, 1), b = with(2, 2), c = with(1, 4);
  losses_check_close(b.losses, a.losses, 1e-5);
  losses_check_close(c.losses, a.losses, 1e-5);
  losses_check_close(b.grad_norms, a.grad_norms, 1e-4);
}

TEST_CASE("data parallel: 2 ranks x micro 2 give the losses of 1 rank x micro 4") {
  const std::vector<std::string> sets{"training.max_steps=12"};
  TrainResult single = train_run(tiny(sets), quiet_env());

  std::vector<TrainResult> res(2);
  TempDir dir("dp");
  const auto errors = dtrain::test::run_ranks(2, [&](comm::Communicator* comm, int r) {
    auto s = sets;
    s.push_back("train_micro_batch_size_per_gpu=2");
    TrainerEnv env = quiet_env(dir.path.string());
    env.rank = r;
    env.world_size = 2;
    env.comm = comm;
    res[static_cast<size_t>(r)] = train_run(tiny(s, 2), env);
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  losses_check_close(res[0].losses, single.losses, 1e-5);
  CHECK(res[0].losses == res[1].losses);  // every rank reports the allreduced loss
  CHECK(res[0].tokens == single.tokens);
  CHECK(fs::exists(dir.path / "final" / "model.safetensors"));  // rank 0 exported
}

TEST_CASE("bf16 trains and stays close to fp32 early on") {
  const std::vector<std::string> sets{"training.max_steps=30"};
  TrainResult f32 = train_run(tiny(sets), quiet_env());
  auto s = sets;
  s.push_back("bf16.enabled=true");
  TrainResult bf = train_run(tiny(s), quiet_env());
  CHECK(std::fabs(bf.losses[0] - f32.losses[0]) < 0.01);
  CHECK(std::fabs(bf.losses[4] - f32.losses[4]) < 0.05);
  CHECK(mean(bf.losses, 25, 30) < mean(bf.losses, 0, 5) - 0.8);
  CHECK(std::fabs(mean(bf.losses, 25, 30) - mean(f32.losses, 25, 30)) < 0.1);
  CHECK(bf.losses != f32.losses);  // the compute copy really is rounded
}

TEST_CASE("fp16 with dynamic loss scaling trains like bf16; a huge initial scale skips steps") {
  const std::vector<std::string> sets{"training.max_steps=30"};
  auto s_bf = sets;
  s_bf.push_back("bf16.enabled=true");
  TrainResult bf = train_run(tiny(s_bf), quiet_env());
  auto s16 = sets;
  s16.push_back("fp16.enabled=true");
  TrainResult h = train_run(tiny(s16), quiet_env());
  CHECK(h.skipped_steps <= 2);  // hysteresis 2: at most one early overflow costs a step (and no halving)
  CHECK(h.final_loss_scale >= 32768.0);
  CHECK(std::fabs(mean(h.losses, 25, 30) - mean(bf.losses, 25, 30)) < 0.1);

  // 2^26: the scaled gradients overflow fp16 until the scale has halved enough.
  auto so = std::vector<std::string>{"training.max_steps=40"};
  so.insert(so.end(),
            {"fp16.enabled=true", "fp16.initial_scale_power=26", "fp16.hysteresis=1", "scheduler.type=WarmupLR",
             "scheduler.params.warmup_num_steps=10", "scheduler.params.warmup_type=linear"});
  TrainResult o = train_run(tiny(so), quiet_env());
  INFO("skipped " << o.skipped_steps << " final scale " << o.final_loss_scale);
  CHECK(o.skipped_steps >= 5);
  CHECK(o.skipped[0] == 1);
  CHECK(o.skipped_steps <= 20);
  CHECK(o.applied_steps + o.skipped_steps == 40);
  CHECK(o.final_loss_scale < std::ldexp(1.0, 26));
  for (size_t i = 1; i < o.loss_scales.size(); ++i) CHECK(o.loss_scales[i] <= o.loss_scales[i - 1]);
  // Skipped steps do not advance the schedule: every step up to and including the first
  // applied one runs with lr(0), and the schedule then moves once per applied step.
  size_t first = 0;
  while (o.skipped[first]) ++first;
  for (size_t i = 0; i <= first; ++i) CHECK(o.lrs[i] == o.lrs[0]);
  CHECK(o.lrs[first + 1] > o.lrs[first]);
  CHECK(mean(o.losses, 35, 40) < mean(o.losses, 0, 5) - 0.3);
}

TEST_CASE("LoRA lowers the loss and changes only the adapters") {
  // A base model first (full fine-tune, exported), then LoRA on top of it via init_from.
  TempDir base_dir("lora_base"), dir("lora");
  const std::string valid = "data.valid=configs/data/tasks/valid.jsonl";
  TrainResult base = train_run(tiny({"training.max_steps=40", valid}), quiet_env(base_dir.path.string()));
  const std::vector<std::string> sets{"lora.r=8",
                                      "lora.alpha=16",
                                      "lora.target_modules=[q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]",
                                      "optimizer.params.lr=1.0e-2",
                                      "training.max_steps=100",
                                      "train_micro_batch_size_per_gpu=8",
                                      valid,
                                      "model.init_from=" + (base_dir.path / "final").string()};
  const auto cfg = tiny(sets);
  TrainResult r = train_run(cfg, quiet_env(dir.path.string()));
  // Per-batch losses are noisy at this size: the held-out loss is the clear signal.
  INFO("held-out loss: base " << base.final_eval_loss << ", after LoRA " << r.final_eval_loss);
  CHECK(r.final_eval_loss < base.final_eval_loss - 0.05);

  // The exported base weights are bit-identical to the initial ones.
  auto init = model_create(cfg);
  model::SafetensorsFile exported((dir.path / "final" / "model.safetensors").string());
  for (auto& pb : init->params())
    for (const auto& t : pb.layout.tensors) {
      std::vector<float> got(t.numel());
      exported.read_f32(t.name, got.data(), got.size());
      CHECK(std::memcmp(got.data(), pb.host_f32() + t.offset, got.size() * 4) == 0);
    }
  // The adapters moved (B starts at zero).
  model::SafetensorsFile ad((dir.path / "final" / "adapter_model.safetensors").string());
  bool moved = false;
  for (auto& pb : init->lora_params())
    for (const auto& t : pb.layout.tensors) {
      std::vector<float> got(t.numel());
      ad.read_f32(t.name, got.data(), got.size());
      moved = moved || std::memcmp(got.data(), pb.host_f32() + t.offset, got.size() * 4) != 0;
    }
  CHECK(moved);
  CHECK(fs::exists(dir.path / "final" / "adapter_config.json"));
}

TEST_CASE("metrics.jsonl records, periodic eval and the wall-clock breakdown") {
  TempDir dir("metrics");
  const auto cfg = tiny({"training.max_steps=20", "steps_per_print=5", "training.eval_steps=10",
                         "data.valid=configs/data/tasks/valid.jsonl", "wall_clock_breakdown=true"});
  TrainResult r = train_run(cfg, quiet_env(dir.path.string()));
  auto recs = metrics_read((dir.path / "metrics.jsonl").string());
  std::vector<int64_t> train_steps, eval_steps;
  for (const auto& j : recs) {
    if (j.contains("eval_loss")) {
      eval_steps.push_back(j.at("step").get<int64_t>());
      CHECK(j.at("eval_ppl").get<double>() == doctest::Approx(std::exp(j.at("eval_loss").get<double>())));
      continue;
    }
    train_steps.push_back(j.at("step").get<int64_t>());
    for (const char* k : {"loss", "lr", "grad_norm", "loss_scale", "tokens", "tokens_per_s", "step_time", "forward_ms",
                          "backward_ms", "comm_ms", "optimizer_ms", "data_ms"})
      CHECK_MESSAGE(j.contains(k), k);
    const int64_t step = j.at("step").get<int64_t>();
    CHECK(j.at("loss").get<double>() == doctest::Approx(r.losses[static_cast<size_t>(step - 1)]));
    CHECK(j.at("tokens").get<int64_t>() == step * 4 * 48);
  }
  CHECK(train_steps == std::vector<int64_t>{5, 10, 15, 20});
  CHECK(eval_steps == std::vector<int64_t>{10, 20});
  CHECK(std::isfinite(r.final_eval_loss));
  CHECK(r.final_eval_ppl == doctest::Approx(std::exp(r.final_eval_loss)));
}

TEST_CASE("bad environments are refused") {
  auto cfg = tiny();
  TrainerEnv env = quiet_env();
  env.world_size = 2;
  CHECK_THROWS_AS(train_run(cfg, env), UsageError);  // no communicator
  config::TrainConfig unresolved = config::config_load_string(kTiny, "tiny.yaml").cfg;
  CHECK_THROWS_AS(train_run(unresolved, quiet_env()), UsageError);
}

TEST_CASE("token shards (data.format tokens) train exactly like the same data tokenized in memory") {
  TempDir dir("shards");
  fs::create_directories(dir.path);
  const std::string shard = (dir.path / "train.tok").string();
  data::data_prepare("configs/data/tasks/train.jsonl", data::DataFormat::ALPACA, "byte", shard);
  const std::vector<std::string> sets{"training.max_steps=8"};
  TrainResult mem = train_run(tiny(sets), quiet_env());
  auto s = sets;
  s.insert(s.end(), {"data.format=tokens", "data.train=" + shard});
  TrainResult tok = train_run(tiny(s), quiet_env());
  CHECK(tok.losses == mem.losses);
  s.back() = "data.train=" + dir.path.string();  // a directory of shards
  CHECK(train_run(tiny(s), quiet_env()).losses == mem.losses);
}

TEST_CASE("progress callbacks: the step the loop starts after, every completed step, then done once") {
  TempDir dir("progress");
  std::vector<int64_t> steps;
  std::vector<int64_t> saved_before_report;  // steps whose checkpoint already existed at the callback
  int done = 0;
  TrainerEnv env = quiet_env(dir.path.string());
  env.on_step = [&](int64_t s) {
    CHECK(done == 0);
    steps.push_back(s);
    if (fs::exists(dir.path / "checkpoints" / ("step" + std::to_string(s)))) saved_before_report.push_back(s);
  };
  env.on_steps_done = [&] { ++done; };
  TrainResult r = train_run(tiny({"training.max_steps=6", "training.save_steps=3"}), env);
  CHECK(r.steps == 6);
  CHECK(steps == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(done == 1);
  // A step's checkpoint is part of the step: written before the step is reported.
  CHECK(saved_before_report == std::vector<int64_t>{3});

  // Resumed from the step-6 checkpoint with 3 more steps: the loop starts after step 6.
  steps.clear();
  done = 0;
  TrainResult more = train_run(tiny({"training.max_steps=9", "training.save_steps=3"}), env);
  CHECK(more.resumed_step == 6);
  CHECK(steps == std::vector<int64_t>{6, 7, 8, 9});
  CHECK(done == 1);
}
