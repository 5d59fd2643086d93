// `dtrain bench train --plan`: a GPU speed budget tied to the code, since no GPU measures
// one here. The step `dtrain bench train` times runs through the real model and ZeRO
// engine on a PlanDevice (lib/device: nothing executes; every launch the CUDA device would
// issue is listed with its FLOPs, bytes and unit); each launch gets two roofline times on a
// GPU profile (H100 SXM or H200 SXM): a slow end and a fast end from the budget table's
// bands, shape-dependent GEMM efficiency (plan_gemm.h), the attention kernels' blocks per SM
// and wave quantisation (plan_occupancy.h). Their sums bound the predicted step time and give
// a low/high MFU band. It is a model: see docs/gpu.md for what it ignores. Needs no GPU and
// works in a CPU-only build.
#pragma once

#include "device/kind.h"
#include "device/plan_device.h"
#include "plan/plan_occupancy.h"
#include "train/step_setup.h"
#include "train/step_shape.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::plan {

/// A cap given as a band: the slow end (the band's low MFU) and the fast end.
struct PlanBand {
  double slow = 0, fast = 0;
};

/// Which end of the band a time is for.
enum class PlanEnd { SLOW, FAST };

/// The budget's efficiency caps, in one table to adjust; the hardware figures are the GPU
/// profile's.
struct PlanBudgetTable {
  PlanGpu gpu = plan_gpu("h100");
  /// Flash attention on tensor cores through mma.sync (kernels/attention_mma.cu), forward /
  /// backward (the backward's plan FLOPs count its 7 tile products), as fractions of the tensor
  /// peak. Calibrated, not derived: the rates this kernel was measured at on an H200 (the GPU
  /// check at e8d83a4, ncu over the timed step), forward 0.17 (GPT-2 124M, T 1024, head dim 64)
  /// to 0.19 (Llama 1B, T 2048), backward 0.12 to 0.14; the band is that spread. They hold at
  /// the occupancy the kernels had then (sm_90, head dim 64: forward 4 blocks per SM, dK/dV 2,
  /// dQ 3); the budget scales them by resident warps below that (attn_*_ref_blocks).
  PlanBand attn_fwd_eff{0.17, 0.19};
  PlanBand attn_bwd_eff{0.12, 0.14};
  int attn_fwd_ref_blocks = 4, attn_dkdv_ref_blocks = 2, attn_dq_ref_blocks = 3;
  /// The hopper variant's forward (kernels/attention_hopper.cu: wgmma, 288 threads, one block
  /// per SM by design, so its reference is 1). Not measured: no GPU has timed it, so the
  /// mma.sync forward's band stands in until the GPU check's attention stage does.
  PlanBand attn_hopper_fwd_eff{0.17, 0.19};
  int attn_hopper_fwd_ref_blocks = 1;
  double cuda_core_eff = 1.0;  ///< fp32 CUDA-core arithmetic (cuBLASLt fp32 GEMMs too)
  /// Achievable share of HBM bandwidth for streaming kernels. An assumption (no published
  /// figure used): 75 to 90 %.
  PlanBand hbm_eff{0.75, 0.90};
  double pcie_eff = 0.80;        ///< achievable share of the PCIe bandwidth (assumed)
  double launch_floor_us = 2.0;  ///< per launch: launch latency and a short kernel's tail
};

/// The parts of one entry's roofline time at one end of the band, in seconds: compute = FLOPs
/// / (peak of its unit x cap), memory = bytes / (bandwidth x cap), floor = launches x
/// launch_floor_us; the entry takes max(compute, memory) + floor. cuBLASLt bf16/fp16 GEMMs
/// take their cap from gemm_efficiency (low / high); the tensor-core attention kernels their
/// band's cap x min(1, blocks per SM / reference blocks per SM), at the slow end also divided
/// by the wave efficiency and with the re-read tiles from HBM. `fit` (when not null) receives
/// an attention kernel's stages, registers, blocks per SM and waves.
struct PlanTime {
  double compute = 0, memory = 0, floor = 0;
  double total() const { return (compute > memory ? compute : memory) + floor; }
};
struct PlanKernelFit {
  int stages = 0, registers = 0;  ///< registers 0: no row in the register table
  Occupancy occupancy;
  double waves = 0;  ///< blocks / (SMs x blocks per SM)
};
PlanTime plan_entry_time(const device::PlanEntry& e, const PlanBudgetTable& t, PlanEnd end,
                         PlanKernelFit* fit = nullptr);

/// One steady-state step of s on a PlanDevice: the model (LoRA and recompute as set) and
/// the trainer's step (train::TrainStep) run one unrecorded warm-up step (the activation arena is allocated on the
/// first forward), then the recorded step, on a card with `smem_optin` bytes of opt-in shared
/// memory per block (PlanGpu::smem_optin; it picks the cross-entropy kernel) and compute
/// capability `sm` (x 10, PlanGpu::sm), which with the shared memory decide where the hopper
/// attention forward runs ($DTRAIN_ATTN_VARIANT=hopper). Allocates no model-sized memory.
struct PlanStep {
  std::vector<device::PlanEntry> entries;
  int64_t params = 0, trainable_params = 0;
  /// What the planned step left out or priced otherwise (ZeRO-Offload's host update; the
  /// attention variant when it is not legacy's kernels)
  std::vector<std::string> notes;
};
PlanStep plan_step(const train::StepSetup& s, size_t smem_optin, int sm);

/// Entries grouped by (op, kernel, unit), longest first (by the mid-band time).
struct PlanRow {
  std::string op, kernel, unit;
  std::string bound;  ///< "compute", "memory" or "launches": the largest time term (mid-band)
  bool gemm = false;  ///< cuBLASLt matmuls
  bool attn = false;  ///< flash attention on tensor cores (mma.sync; the hopper forward's wgmma)
  int64_t launches = 0;
  double gflop = 0, gbytes = 0;
  double ms_slow = 0, ms_fast = 0, ms = 0;  ///< ms: the mid-band time (the mean of the ends)
  double share = 0;                         ///< of the mid-band step
  std::string occupancy;                    ///< attention: "B blocks/SM (limit), W waves", else empty
};

/// The published rate the band is read beside.
struct PlanAnchor {
  std::string what;  ///< e.g. "llm.c GPT-2 124M on one H100"
  double tokens_per_s = 0;
  double mfu = 0;  ///< by this budget's model FLOPs formula
  std::string source;
};

struct BenchPlanResult : train::StepShape {
  std::string driver;  ///< what ran on the plan device
  int recompute_layers = 0;
  PlanBudgetTable table;
  std::vector<PlanRow> rows;
  int64_t launches = 0;
  double gemm_ms = 0, attn_ms = 0, other_ms = 0;                             ///< mid-band; other = the rest
  double step_ms = 0, step_ms_slow = 0, step_ms_fast = 0, tokens_per_s = 0;  ///< step_ms, tokens/s: mid-band
  double gemm_gflop = 0, attn_gflop = 0, total_gflop = 0;                    ///< executed FLOPs (GEMMs; attention; all)
  bool attn_hopper_fwd = false;  ///< the attention forward priced as the hopper variant's wgmma kernel
  double flops_per_token = 0;    ///< model FLOPs (model_flops_per_token)
  std::string flops_formula;
  double mfu = 0;                    ///< model FLOPs per step / (mid-band step time x tensor peak)
  double mfu_low = 0, mfu_high = 0;  ///< the band: at the slow and the fast step time
  std::vector<PlanAnchor> anchors;   ///< published rates for this model, if any
  std::string top_other;             ///< the longest row that is neither GEMM nor attention, "op: kernel"
  double top_other_share = 0;        ///< its fraction of the step
  std::vector<std::string> notes;
};

/// What `bench train --plan` plans: the config and its --set overrides, and the device
/// asked for (the plan describes the CUDA device).
struct BenchPlanOptions {
  std::string config_path;
  std::vector<std::string> sets;             ///< "key.path=value" overrides, as --set
  device::Kind device = device::Kind::CUDA;  ///< --device: CPU has no plan
};

/// The budget of the config's step (o.config_path, o.sets; o.device must be CUDA, the
/// device the plan describes) on the GPU profile `gpu` (plan_gpu_names()). UsageError for
/// --device cpu or an unknown profile.
BenchPlanResult bench_plan_run(const BenchPlanOptions& o, const std::string& gpu = "h100");

/// The table (kernel rows, GEMM vs non-GEMM totals, step time and MFU bands, the anchors), or
/// one JSON object with the same figures (json = true).
std::string bench_plan_format(const BenchPlanResult& r, bool json);

}  // namespace dtrain::plan
