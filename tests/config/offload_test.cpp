// ZeRO-Offload's config keys: DeepSpeed's offload_optimizer / offload_param sections and
// the older cpu_offload* booleans are read (no longer warned about as ignored), the stock
// LLaMA-Factory offload configs load unchanged, and what cannot run is refused by name
// and line: nvme, the optimizer offload at stage 0, the parameter offload below stage 3
// or without the optimizer offload.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::config;

namespace {

const std::string kJob =
    "train_micro_batch_size_per_gpu: 2\n"
    "model: {architecture: llama, vocab_size: 512, n_layer: 2, n_head: 4, d_model: 64, max_seq_len: 32}\n"
    "data: {train: x.jsonl}\n"
    "training: {max_steps: 10, device: cuda}\n";

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

std::string error_of(const std::string& text) {
  try {
    config_load_string(text, "t.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for:\n" << text);
  return "";
}

}  // namespace

TEST_CASE("offload: LLaMA-Factory's stock stage-2 and stage-3 offload configs load unchanged, \"auto\" included") {
  // ds_z2_offload_config.json and ds_z3_offload_config.json as LLaMA-Factory ships them
  // (examples/deepspeed), with a job around them.
  const std::string z2 = R"({
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto", "zero_allow_untested_optimizer": true,
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "allgather_partitions": true, "allgather_bucket_size": 5e8, "overlap_comm": false, "reduce_scatter": true,
    "reduce_bucket_size": 5e8, "contiguous_gradients": true, "round_robin_gradients": true}
})";
  const std::string z3 = R"({
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto", "zero_allow_untested_optimizer": true,
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": false, "contiguous_gradients": true,
    "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true}
})";
  const LoadedConfig a = config_load_string(z2, "ds_z2_offload_config.json");
  CHECK(a.cfg.zero.stage == 2);
  CHECK(a.cfg.zero.offload_optimizer_device == "cpu");
  CHECK(a.cfg.zero.offload_optimizer_pin_memory);
  CHECK(a.cfg.zero.offload_param_device == "none");
  const LoadedConfig b = config_load_string(z3, "ds_z3_offload_config.json");
  CHECK(b.cfg.zero.stage == 3);
  CHECK(b.cfg.zero.offload_optimizer_device == "cpu");
  CHECK(b.cfg.zero.offload_param_device == "cpu");
  CHECK(b.cfg.zero.offload_param_pin_memory);
  for (const LoadedConfig* l : {&a, &b})
    for (const auto& w : l->warnings) CHECK_MESSAGE(!has(w, "zero_optimization.offload"), w);
}

TEST_CASE("offload: the older cpu_offload booleans mean the offload sections") {
  const LoadedConfig l = config_load_string(
      kJob +
          "zero_optimization: {stage: 3, cpu_offload: true, cpu_offload_params: true, cpu_offload_use_pin_memory: "
          "true}\n",
      "t.yaml");
  CHECK(l.cfg.zero.offload_optimizer_device == "cpu");
  CHECK(l.cfg.zero.offload_param_device == "cpu");
  CHECK(l.cfg.zero.offload_optimizer_pin_memory);
  CHECK(l.cfg.zero.offload_param_pin_memory);
}

TEST_CASE("offload: what cannot run is refused by key and line") {
  std::string m = error_of(kJob + "zero_optimization:\n  stage: 2\n  offload_optimizer: {device: nvme}\n");
  CHECK(has(m, "t.yaml:7"));
  CHECK(has(m, "nvme"));
  CHECK(has(m, "device cpu"));
  m = error_of(kJob +
               "zero_optimization:\n  stage: 3\n  offload_optimizer: {device: cpu}\n  offload_param: "
               "{device: nvme, nvme_path: /local_nvme}\n");
  CHECK(has(m, "offload_param.device: nvme"));
  m = error_of(kJob + "zero_optimization:\n  stage: 0\n  offload_optimizer: {device: cpu}\n");
  CHECK(has(m, "stage 1, 2 or 3"));
  CHECK(has(m, "t.yaml:7"));
  m = error_of(kJob +
               "zero_optimization:\n  stage: 2\n  offload_optimizer: {device: cpu}\n  offload_param: "
               "{device: cpu}\n");
  CHECK(has(m, "zero_optimization.stage 3"));
  m = error_of(kJob + "zero_optimization:\n  stage: 3\n  offload_param: {device: cpu}\n");
  CHECK(has(m, "needs offload_optimizer.device cpu"));
  m = error_of(kJob + "zero_optimization:\n  stage: 2\n  offload_optimizer: {device: disk}\n");
  CHECK(has(m, "none, cpu, nvme"));
}
