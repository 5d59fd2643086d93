// The GPUs the --plan budget prices a step on, and the occupancy arithmetic it applies to the
// tensor-core attention's kernels: blocks per SM from registers, shared memory and threads
// (the CUDA occupancy rules), the registers ptxas gave each kernel (a table generated from
// the build's ptxas reports), and wave quantisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::plan {

/// One card: datasheet peaks and the per-SM limits of its compute capability (CUDA C++
/// Programming Guide, "Technical Specifications per Compute Capability").
struct PlanGpu {
  std::string name;   ///< the --gpu value, e.g. "h100"
  std::string label;  ///< e.g. "H100 SXM"
  int sm = 90;        ///< compute capability x 10: the ptxas architecture of the registers used
  int sms = 132;
  double tensor_tflops = 989;  ///< dense bf16/fp16 tensor cores (no sparsity)
  double fp32_tflops = 67;     ///< fp32 on CUDA cores
  double hbm_tbps = 3.35;
  double pcie_gbps = 64;  ///< one direction
  int regs_per_sm = 65536;
  int reg_alloc_unit = 256;  ///< registers are allocated per warp in units of this many
  size_t smem_per_sm = 233472;
  size_t smem_optin = 232448;   ///< the most dynamic shared memory one block may opt in to
  size_t smem_reserved = 1024;  ///< shared memory the system reserves per resident block
  int max_threads_per_sm = 2048;
  int max_blocks_per_sm = 32;
};

/// The profile named `name` ("h100", "h200"); UsageError naming the known ones otherwise.
const PlanGpu& plan_gpu(const std::string& name);
std::vector<std::string> plan_gpu_names();

/// Resident blocks per SM of a kernel: the smallest of the register, shared-memory, thread and
/// block limits (registers: per warp rounded up to reg_alloc_unit; shared memory: the block's
/// dynamic + static bytes plus the reserved 1 KB). `limit` names the binding one.
struct Occupancy {
  int blocks_per_sm = 0;
  const char* limit = "";
};
Occupancy blocks_per_sm(const PlanGpu& g, int regs_per_thread, int threads, size_t smem_per_block);

/// Wave quantisation of `blocks` equal blocks on `slots` resident places (SMs x blocks per
/// SM): the useful fraction of ceil(blocks / slots) full waves, (blocks / slots) / ceil(...).
double wave_efficiency(int64_t blocks, int64_t slots);

/// Registers per thread ptxas gave the kernel (bf16 instantiation) for padded head dim `hdp`,
/// `stages` and architecture `sm` (lib/plan/plan_kernel_resources.inc; the hopper forward,
/// "attn_fwd_hopper_kernel", at its head dim, 2 stages and sm 90, from its sm_90a image); 0
/// when the table has no such row.
int plan_kernel_registers(const std::string& kernel, int hdp, int stages, int sm);

}  // namespace dtrain::plan
