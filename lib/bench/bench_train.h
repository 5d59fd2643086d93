// `dtrain bench train`: training throughput of one device on synthetic random tokens for
// the model, batch, precision and LoRA settings of a training config: tokens/s, step time,
// model FLOPs per token, MFU against the device's dense bf16 peak, peak memory. The GPU
// figure needs a CUDA build and a device; --device cpu measures the CPU reference model.
#pragma once

#include "device/kind.h"
#include "model/config.h"
#include "train/step_shape.h"
#include "train/zero_engine.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::bench {

struct BenchTrainOptions {
  std::string config_path;
  std::vector<std::string> sets;             ///< "key.path=value" overrides, as --set
  int steps = 20;                            ///< timed optimizer steps
  int warmup = 5;                            ///< untimed steps first (cuBLASLt plans, allocator)
  device::Kind device = device::Kind::CUDA;  ///< or CPU: the CPU model, always fp32
};

struct BenchTrainResult : train::StepShape {
  std::string device_name;
  device::Kind device = device::Kind::CUDA;
  int steps = 0, warmup = 0;
  double step_ms = 0, tokens_per_s = 0;
  double flops_per_token = 0;  ///< see flops_formula
  std::string flops_formula;
  double achieved_tflops = 0;
  double peak_tflops = 0;  ///< NaN: unknown device (MFU not available)
  double mfu = 0;          ///< fraction; NaN when peak_tflops is unknown
  size_t arena_bytes = 0, workspace_bytes = 0, device_used_bytes = 0, device_total_bytes = 0;
  /// The memory plan's device bytes for this job on one GPU (train::memory_plan, as the
  /// dry run prints it), and the device allocator's peak in use and bytes held after the
  /// timed steps (Device::memory_stats: the default pool's cudaMemPoolAttrUsedMemHigh and
  /// ReservedMemCurrent), which the GPU check holds against it.
  double planned_device_bytes = 0;
  size_t pool_peak_bytes = 0, pool_reserved_bytes = 0;
  double final_loss = 0;
  std::vector<double> losses;  ///< every step's loss, warm-up steps included
  /// Every step's wall time (ms), warm-up steps included: the first step's cost (cuBLASLt
  /// plans, allocator growth) beside the timed steps' mean, step_ms.
  std::vector<double> step_ms_each;
  std::vector<std::string> notes;  ///< settings the bench changed or ignored
  /// ZeRO-Offload (offload_optimizer): the last step's schedule (train::OffloadTraceEntry:
  /// gradients landing on the host, the host AdamW per bucket or after the backward),
  /// and the host memory the engine holds.
  std::vector<train::OffloadTraceEntry> offload_trace;
  size_t offload_host_bytes = 0;
  double setup_s = 0;  ///< model build, device copy and engine construction, before the first step
};

/// The H100 SXM's dense bf16/fp16 tensor-core peak (TFLOPS, datasheet, no sparsity): the
/// MFU denominator of a timed run on it and the device `--plan` budgets (PlanBudgetTable).
inline constexpr double H100_SXM_BF16_TFLOPS = 989.0;

/// Dense bf16 tensor-core peak (TFLOPS, no sparsity) for a cudaDeviceProp name: H100 SXM
/// 989, H100 PCIe 756, H200 989, A100 312; NaN for any other device.
double gpu_peak_bf16_tflops(const std::string& device_name);

/// Runs the benchmark. device "cuda" throws DeviceError (exit code 8) in a CPU-only build
/// or without a visible GPU; ConfigError / IoError for the config.
BenchTrainResult bench_train_run(const BenchTrainOptions& opts);

/// The human-readable table, or one JSON object (json = true; null for unknown figures).
std::string bench_train_format(const BenchTrainResult& r, bool json);

}  // namespace dtrain::bench
