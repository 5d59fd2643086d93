// `dtrain bench train --plan`: a GPU speed budget tied to the code, since no GPU measures
// one here. The step `dtrain bench train` times runs through the real model and ZeRO
// engine on a PlanDevice (lib/device: nothing executes; every launch the CUDA device would
// issue is listed with its FLOPs, bytes and unit); each launch gets a roofline time on an
// H100 SXM from PlanBudgetTable, and their sum is the predicted step time. Needs no GPU
// and works in a CPU-only build.
#pragma once

#include "device/plan_device.h"
#include "bench/bench_step.h"
#include "bench/bench_train.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::bench {

/// The budget's hardware figures and efficiency caps, in one table to adjust.
struct PlanBudgetTable {
  std::string gpu = "H100 SXM";
  double tensor_tflops = H100_SXM_BF16_TFLOPS;  ///< dense bf16/fp16 tensor cores (datasheet, no sparsity)
  double fp32_tflops = 67.0;                    ///< fp32 on CUDA cores
  double hbm_tbps = 3.35;                       ///< HBM3
  double pcie_gbps = 64.0;                      ///< PCIe Gen5 x16, one direction (host <-> device copies)
  /// cuBLASLt bf16/fp16 GEMMs: the best bf16 matmul rate measured on an H100 (~790 of 989).
  double gemm_eff = 0.80;
  /// Flash attention on tensor cores through mma.sync (kernels/attention_mma.cu), forward /
  /// backward (the backward's plan FLOPs count its 7 tile products). Measured on an H200 (the
  /// GPU check at e8d83a4, ncu over the timed step; same dense peak as the H100 SXM): forward
  /// 0.17 (GPT-2 124M, T 1024, head dim 64) to 0.19 (Llama 1B, T 2048), backward 0.12 to 0.14.
  /// FlashAttention-2 on the same instruction class reaches about a third at head dim 128.
  double attn_fwd_eff = 0.18;
  double attn_bwd_eff = 0.13;
  double cuda_core_eff = 1.0;    ///< fp32 CUDA-core arithmetic (cuBLASLt fp32 GEMMs too)
  double hbm_eff = 0.80;         ///< achievable share of HBM bandwidth
  double pcie_eff = 0.80;        ///< achievable share of the PCIe bandwidth
  double launch_floor_us = 2.0;  ///< per launch: launch latency and a short kernel's tail
};

/// The parts of one entry's roofline time, in seconds: compute = FLOPs / (peak of its unit
/// x cap), memory = bytes / (bandwidth x cap), floor = launches x launch_floor_us; the
/// entry takes max(compute, memory) + floor.
struct PlanTime {
  double compute = 0, memory = 0, floor = 0;
  double total() const { return (compute > memory ? compute : memory) + floor; }
};
PlanTime plan_entry_time(const device::PlanEntry& e, const PlanBudgetTable& t);

/// One steady-state step of s on a PlanDevice: the model (LoRA and recompute as set) and
/// the trainer's step (train::TrainStep) run one unrecorded warm-up step (the activation arena is allocated on the
/// first forward), then the recorded step. Allocates no model-sized memory.
struct PlanStep {
  std::vector<device::PlanEntry> entries;
  int64_t params = 0, trainable_params = 0;
};
PlanStep plan_step(const BenchSetup& s);

/// Entries grouped by (op, kernel, unit), longest first.
struct PlanRow {
  std::string op, kernel, unit;
  std::string bound;  ///< "compute", "memory" or "launches": the largest of the group's time terms
  bool gemm = false;  ///< cuBLASLt matmuls
  bool attn = false;  ///< flash attention on tensor cores (mma.sync)
  int64_t launches = 0;
  double gflop = 0, gbytes = 0, ms = 0, share = 0;  ///< share: fraction of the step
};

struct BenchPlanResult {
  std::string config, arch, dtype;
  std::string driver;  ///< what ran on the plan device
  int64_t params = 0, trainable_params = 0;
  int lora_rank = 0, n_layer = 0, d_model = 0, micro_batch = 0, seq_len = 0, grad_accum = 0;
  bool recompute = false;
  PlanBudgetTable table;
  std::vector<PlanRow> rows;
  int64_t launches = 0;
  double gemm_ms = 0, attn_ms = 0, other_ms = 0, step_ms = 0, tokens_per_s = 0;  ///< other = the rest
  double gemm_gflop = 0, attn_gflop = 0, total_gflop = 0;  ///< executed FLOPs (GEMMs; attention; all)
  double flops_per_token = 0;                              ///< model FLOPs (model_flops_per_token)
  std::string flops_formula;
  double mfu = 0;              ///< model FLOPs per step / (step time x tensor peak)
  std::string top_other;       ///< the longest row that is neither GEMM nor attention, "op: kernel"
  double top_other_share = 0;  ///< its fraction of the step
  std::vector<std::string> notes;
};

/// The budget of the config's step (o.config_path, o.sets; o.device must be CUDA, the
/// device the plan describes; steps and warmup do not apply). UsageError for --device cpu.
BenchPlanResult bench_plan_run(const BenchTrainOptions& o);

/// The table (kernel rows, GEMM vs non-GEMM totals, step time, tokens/s, MFU), or one JSON
/// object with the same figures (json = true).
std::string bench_plan_format(const BenchPlanResult& r, bool json);

}  // namespace dtrain::bench
