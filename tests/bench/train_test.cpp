// bench_train: the CPU figure on the tiny config (fields, formula, JSON), the device
// error without a GPU, the peak table and the FLOPs formula.
#include "core/error.h"
#include "device/device.h"
#include "bench/bench_train.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace dtrain;

TEST_CASE("bench train: peak table and FLOPs formula") {
  CHECK(bench::gpu_peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0);
  CHECK(bench::gpu_peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0);
  CHECK(bench::gpu_peak_bf16_tflops("NVIDIA H200") == 989.0);
  CHECK(bench::gpu_peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0);
  CHECK(std::isnan(bench::gpu_peak_bf16_tflops("NVIDIA GeForce RTX 4090")));
  model::ModelConfig c;
  c.n_layer = 12;
  c.d_model = 768;
  CHECK(train::model_flops_per_token(c, 124000000, 1024, false) ==
        doctest::Approx(6.0 * 124e6 + 12.0 * 12 * 1024 * 768));
  CHECK(train::model_flops_per_token(c, 124000000, 1024, true) ==
        doctest::Approx(4.0 * 124e6 + 12.0 * 12 * 1024 * 768));
}

TEST_CASE("bench train: CPU figure on the tiny config, labelled as CPU, table and JSON") {
  bench::BenchTrainOptions o;
  o.config_path = "configs/tiny-cpu.yaml";
  o.sets = {"train_micro_batch_size_per_gpu=2", "data.seq_len=32"};
  o.steps = 2;
  o.warmup = 1;
  o.device = device::Kind::CPU;
  const bench::BenchTrainResult r = bench::bench_train_run(o);
  CHECK(r.device == device::Kind::CPU);
  CHECK(r.micro_batch == 2);
  CHECK(r.seq_len == 32);
  CHECK(r.grad_accum == 2);  // tiny-cpu.yaml sets gradient_accumulation_steps: 2
  CHECK(r.tokens_per_s > 0);
  CHECK(std::isfinite(r.final_loss));
  CHECK(std::isnan(r.mfu));
  const std::string table = bench::bench_train_format(r, false);
  CHECK(table.find("CPU") != std::string::npos);
  CHECK(table.find("MFU          N/A") != std::string::npos);
  CHECK(table.find("6N + 12*L*T*d_model") != std::string::npos);
  const auto j = nlohmann::json::parse(bench::bench_train_format(r, true));
  CHECK(j["device"] == "cpu");
  CHECK(j["mfu"].is_null());
  CHECK(j["tokens_per_step"] == 2 * 32 * 2);
  CHECK(j["params"].get<int64_t>() == r.params);
  // Every step's loss, the warm-up's first: the last is the final loss.
  REQUIRE(r.losses.size() == 3);
  CHECK(r.losses.back() == r.final_loss);
  REQUIRE(j["losses"].size() == 3);
  CHECK(j["losses"][2].get<double>() == r.final_loss);

  // The CPU figure is the trainer's own optimizer (the ZeRO engine at stage 0): it learns
  // the 4 synthetic batches it cycles through.
  o.steps = 30;
  const bench::BenchTrainResult longer = bench::bench_train_run(o);
  INFO("loss after 2 steps " << r.final_loss << ", after 30 " << longer.final_loss);
  CHECK(longer.final_loss < r.final_loss - 0.5);
}

TEST_CASE("bench train: --device cuda trains on a device, and is a DeviceError without one") {
  bench::BenchTrainOptions o;
  o.config_path = "configs/tiny-cpu.yaml";
  o.steps = 2;
  o.warmup = 1;
  if (device::cuda_count() == 0) {
    CHECK_THROWS_AS(bench::bench_train_run(o), DeviceError);
    return;
  }
  // A device (a GPU, or the CPU execution engine): a real figure from the device trainer.
  o.sets = {"train_micro_batch_size_per_gpu=2", "data.seq_len=32"};
  o.device = device::Kind::CUDA;
  const bench::BenchTrainResult r = bench::bench_train_run(o);
  CHECK(r.device != device::Kind::CPU);
  CHECK(std::isfinite(r.final_loss));
  CHECK(r.tokens_per_s > 0);
}

TEST_CASE("bench train: LoRA on the GPU-style config and a bad device name") {
  bench::BenchTrainOptions o;
  o.config_path = "configs/tiny-cpu.yaml";
  o.sets = {"lora.r=4", "train_micro_batch_size_per_gpu=1", "data.seq_len=16"};
  o.steps = 1;
  o.warmup = 0;
  o.device = device::Kind::CPU;
  const bench::BenchTrainResult r = bench::bench_train_run(o);
  CHECK(r.lora_rank == 4);
  CHECK(r.trainable_params < r.params);
  CHECK(r.flops_formula.rfind("4N", 0) == 0);
  // The device is a device::Kind past the CLI; a bad name fails its parse, naming it.
  CHECK_THROWS_WITH_AS(device::kind_parse("tpu", "--device"), doctest::Contains("\"tpu\""), UsageError);
}
