// The trainer's CUDA step reads from the device once: train_run on the CPU execution
// engine's devices, traced; the device-to-host copies a step adds (a 6-step run minus a
// 3-step run, over 3) are the step's one read-back (gradient norm, overflow flag and the
// micro-batch losses and, summed over the ranks on the device, the loss sum and the
// target count together), with one rank or several. The preference step (training.stage
// dpo: DPO with either reference, ORPO, SimPO) on the device equals the CPU's, and two ranks
// at ZeRO-3 over NCCL equal one. Only the engine traces, so any other build reports SKIPPED.
#include "gpu/gpu_skip.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#ifndef DTRAIN_CUDA_EMU

EMU_ONLY_SUITE("train step")

#else

#include "gpu/train_runs.h"

using namespace dtrain;
using namespace dtrain::train;
using namespace train_runs;

TEST_CASE("train step: one device-to-host read per step on one rank (fp32, bf16, fp16)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  for (const char* dt : {"fp32", "bf16", "fp16"}) {
    CAPTURE(dt);
    std::vector<std::string> extra;
    if (std::string(dt) != "fp32") extra.push_back(std::string(dt) + ".enabled=true");
    CHECK(per_step(1, extra) == std::vector<size_t>{1});
  }
}

TEST_CASE("train step: two ranks at ZeRO stage 1 agree on the norm on the device (NCCL)") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  if (device::cuda_count() < 2) {
    MESSAGE("one CUDA device: the two-rank case needs two");
    return;
  }
  // The read-back alone: the norm, the overflow flag, the target count (before the
  // backward) and the loss sum (for the log) are summed over the ranks by NCCL.
  CHECK(per_step(2, {"zero_optimization.stage=1"}) == std::vector<size_t>{1, 1});
}

#endif

#ifdef DTRAIN_CUDA_EMU
namespace {

// The first 12 of the held-out preference pairs (alpaca-shaped JSONL): few enough that the
// precomputed reference's pass over every pair stays short on the engine.
std::string pairs_file() {
  static const std::string path = [] {
    const std::string out =
        (fs::temp_directory_path() / ("dtrain_gpu_pairs_" + std::to_string(getpid()) + ".jsonl")).string();
    std::ifstream in("configs/data/preference/valid.jsonl");
    std::ofstream o(out);
    std::string line;
    for (int i = 0; i < 12 && std::getline(in, line); ++i) o << line << "\n";
    return out;
  }();
  static const struct Remove {
    std::string p;
    ~Remove() {
      std::error_code ec;
      fs::remove(p, ec);
    }
  } remove{path};
  return path;
}

// A stage-dpo job on those pairs.
std::vector<std::string> dpo(std::vector<std::string> extra) {
  std::vector<std::string> s{"data.train=" + pairs_file(), "data.format=pairwise",  "data.pack=false",
                             "data.seq_len=128",           "model.max_seq_len=128", "training.stage=dpo",
                             "training.pref_beta=0.5"};
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}

// The same job on the CPU (train_run without a device): rank 0's losses.
std::vector<double> cpu_losses(int steps, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = extra;
  sets.push_back("training.max_steps=" + std::to_string(steps));
  config::TrainConfig cfg = config::config_load_string(kTiny, "tiny.yaml", sets).cfg;
  config::config_resolve_batch(cfg, 1);
  TrainerEnv env;
  env.print = false;
  return train_run(cfg, env).losses;
}

}  // namespace

TEST_CASE(
    "preference steps on the CUDA device: DPO (LoRA, adapters-off reference; full, precomputed), ORPO, "
    "SimPO equal the CPU's losses; two ranks at ZeRO-3 over NCCL equal one") {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  struct Case {
    std::vector<std::string> sets;
    bool two_ranks;  // the distributed part is the same for every objective: DPO's two references
  };
  const std::vector<Case> cases{
      {dpo({"lora.r=4", "lora.alpha=8", "lora.target_modules=[q_proj,v_proj,down_proj]"}), true},
      {dpo({"training.pref_reference=precomputed"}), true},
      {dpo({"training.pref_loss=orpo", "training.pref_ftx=0.3"}), false},
      {dpo({"training.pref_loss=simpo", "training.pref_beta=2.0", "training.simpo_gamma=0.5"}), false},
  };
  const int steps = 4;
  for (const auto& [obj, two_ranks] : cases) {
    CAPTURE(obj.back());
    const std::vector<double> cpu = cpu_losses(steps, obj);
    const Run one = train_ranks(1, steps, obj);
    const std::vector<double>& gpu = one.res[0].losses;
    REQUIRE(gpu.size() == cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      INFO("step " << i + 1 << ": device " << gpu[i] << " vs CPU " << cpu[i]);
      CHECK(std::isfinite(gpu[i]));
      CHECK(std::fabs(gpu[i] - cpu[i]) <= 1e-4 * std::fabs(cpu[i]) + 1e-6);
    }
    if (!two_ranks || device::cuda_count() < 2) continue;
    std::vector<std::string> z3 = obj;
    z3.push_back("zero_optimization.stage=3");
    z3.push_back("train_micro_batch_size_per_gpu=1");
    const Run two = train_ranks(2, steps, z3);
    REQUIRE(two.res[0].losses.size() == gpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      INFO("step " << i + 1 << ": 2 ranks " << two.res[0].losses[i] << " vs 1 " << gpu[i]);
      CHECK(std::fabs(two.res[0].losses[i] - gpu[i]) <= 1e-4 * std::fabs(gpu[i]) + 1e-6);
    }
  }
}
#endif
