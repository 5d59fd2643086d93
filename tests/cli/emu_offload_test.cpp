// LLaMA-Factory's stock ZeRO-Offload configs run unchanged through dtrain-emu (dtrain's
// CUDA, cuBLASLt and NCCL code on the CPU execution engine): ds_z2_offload_config.json
// and ds_z3_offload_config.json as LLaMA-Factory ships them ("auto" values included),
// with the job's own keys given by --set, on two local CUDA ranks; the ranks report the
// offloaded host state, and the stage-3 run resumes from its checkpoint without offload;
// with LoRA both train as the same job without offload. Built only in the EMU tree.
#include "cli_harness.h"
#include "run_readers.h"
#include "tiny_job.h"

#include <cmath>
#include <fstream>

using namespace dtrain::cli_test;

namespace {

const char* kZ2 = R"({
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "zero_allow_untested_optimizer": true,
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "allgather_partitions": true,
    "allgather_bucket_size": 5e8,
    "overlap_comm": false,
    "reduce_scatter": true,
    "reduce_bucket_size": 5e8,
    "contiguous_gradients": true,
    "round_robin_gradients": true
  }
})";

const char* kZ3 = R"({
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "zero_allow_untested_optimizer": true,
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true},
    "overlap_comm": false,
    "contiguous_gradients": true,
    "sub_group_size": 1e9,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true
  }
})";

// The job around a DeepSpeed config: what LLaMA-Factory's own arguments would give.
std::vector<std::string> job_sets(const std::string& run_dir, int max_steps) {
  return {"--set",        "model.architecture=llama",
          "--set",        "model.vocab_size=264",
          "--set",        "model.n_layer=2",
          "--set",        "model.n_head=2",
          "--set",        "model.n_kv_head=1",
          "--set",        "model.d_model=32",
          "--set",        "model.d_ff=64",
          "--set",        "model.max_seq_len=32",
          "--set",        "data.train=" + shipped_data_dir() + "/train.jsonl",
          "--set",        "data.format=alpaca",
          "--set",        "data.tokenizer=byte",
          "--set",        "data.seq_len=32",
          "--set",        "data.neat_packing=false",  // the task records outrun 32 tokens
          "--set",        "train_micro_batch_size_per_gpu=2",
          "--set",        "bf16.enabled=true",
          "--set",        "training.device=cuda",
          "--set",        "training.cuda_graph=false",
          "--set",        "training.max_steps=" + std::to_string(max_steps),
          "--set",        "training.save_steps=2",
          "--set",        "fault_tolerance.max_retries=0",
          "--set",        "steps_per_print=1",
          "--output-dir", run_dir};
}

}  // namespace

TEST_CASE("dtrain-emu: LLaMA-Factory's stock offload configs run unchanged on two CUDA ranks") {
  const std::string bin = dtrain_bin();
  REQUIRE_MESSAGE(!bin.empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  TempDir tmp("dtrain-emu-offload");
  REQUIRE(!tmp.path().empty());
  for (const auto& [name, text] :
       {std::pair{"ds_z2_offload_config.json", kZ2}, std::pair{"ds_z3_offload_config.json", kZ3}}) {
    const std::string config_name = name;
    CAPTURE(config_name);
    const std::string config = tmp.path() + "/" + name;
    std::ofstream(config) << text;
    const std::string run_dir = tmp.path() + "/run-" + std::string(name).substr(0, 5);
    std::vector<std::string> argv{bin, "launch", "--config", config, "--nproc-per-node", "2", "--master-port", "0"};
    for (const auto& s : job_sets(run_dir, 4)) argv.push_back(s);
    auto r = run(argv, {{"CUDA_EMU_DEVICE_COUNT", "2"}}, 300s);
    INFO("launch output:\n" << r.out);
    REQUIRE(!r.timed_out);
    REQUIRE(r.rc == 0);
    CHECK_FALSE(
        contains(r.out, "not acted on by dtrain (DeepSpeed features it does not have): zero_optimization.offload"));
    CHECK(contains(r.out, "offload_optimizer"));  // the ranks' memory report: host state, pinned
    const auto losses = metric_losses(run_dir);
    REQUIRE(losses.size() == 4);
    for (const auto& [step, loss] : losses) CHECK(std::isfinite(loss));
  }
  // The stage-3 offloaded run's checkpoint resumes without offload (stage 1, on the CPU).
  const std::string run_dir = tmp.path() + "/run-ds_z3";
  auto r = run({bin, "resume", run_dir, "--set", "training.max_steps=6", "--set", "training.device=cpu", "--set",
                "zero_optimization.stage=1", "--set", "zero_optimization.offload_optimizer.device=none", "--set",
                "zero_optimization.offload_param.device=none", "--set", "steps_per_print=1"},
               {{"CUDA_EMU_DEVICE_COUNT", "2"}}, 300s);
  INFO("resume output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(metric_losses(run_dir).size() == 6);
}

TEST_CASE("dtrain-emu: the stock offload configs with LoRA train as the same LoRA run without offload") {
  // Under LoRA only the adapters train: the offloaded host state is theirs, the frozen base
  // stays on the device (stage 2) or, with offload_param at stage 3, its 16-bit shards move
  // to the host. Each run's losses against the same job with offload off.
  const std::string bin = dtrain_bin();
  REQUIRE_MESSAGE(!bin.empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  TempDir tmp("dtrain-emu-offload-lora");
  REQUIRE(!tmp.path().empty());
  for (const auto& [name, text] :
       {std::pair{"ds_z2_offload_config.json", kZ2}, std::pair{"ds_z3_offload_config.json", kZ3}}) {
    const std::string config_name = name;
    CAPTURE(config_name);
    const std::string config = tmp.path() + "/" + name;
    std::ofstream(config) << text;
    std::vector<std::vector<double>> runs;
    for (bool offload : {true, false}) {
      CAPTURE(offload);
      const std::string run_dir = tmp.path() + "/run-" + std::string(name).substr(0, 5) + (offload ? "-off" : "-dev");
      std::vector<std::string> argv{bin, "launch", "--config", config, "--nproc-per-node", "2", "--master-port", "0"};
      for (const auto& s : job_sets(run_dir, 4)) argv.push_back(s);
      for (const char* kv : {"lora.r=8", "lora.target_modules=[q_proj,v_proj,down_proj]"}) {
        argv.push_back("--set");
        argv.push_back(kv);
      }
      if (!offload)
        for (const char* kv :
             {"zero_optimization.offload_optimizer.device=none", "zero_optimization.offload_param.device=none"}) {
          argv.push_back("--set");
          argv.push_back(kv);
        }
      auto r = run(argv, {{"CUDA_EMU_DEVICE_COUNT", "2"}}, 300s);
      INFO("launch output:\n" << r.out);
      REQUIRE(!r.timed_out);
      REQUIRE(r.rc == 0);
      CHECK(contains(r.out, "offload_optimizer") == offload);  // the ranks' memory report: host state
      std::vector<double> losses;
      for (const auto& [step, loss] : metric_losses(run_dir)) {
        CHECK(std::isfinite(loss));
        losses.push_back(loss);
      }
      REQUIRE(losses.size() == 4);
      runs.push_back(losses);
    }
    for (size_t i = 0; i < runs[0].size(); ++i) {
      INFO("step " << i + 1 << ": offloaded " << runs[0][i] << ", on the device " << runs[1][i]);
      CHECK(std::fabs(runs[0][i] - runs[1][i]) <= 1e-5 * std::fabs(runs[1][i]));
    }
  }
}
