// GPU profiles, blocks per SM, wave quantisation and the attention kernels' register table for
// the --plan budget. The registers come from ptxas -v over kernels/attention_mma*.cu and
// attention_hopper.cu (plan_kernel_resources.inc, written by scripts/kernel_resources.py
// --plan-table and held to the build by kernels_plan_resources_test).
#include "plan/plan_occupancy.h"

#include "core/check.h"

#include <algorithm>
#include <cmath>

namespace dtrain::plan {

namespace {

// Datasheets: H100 SXM5 989 TFLOP/s dense bf16, 67 TFLOP/s fp32, 3.35 TB/s HBM3; H200 SXM the
// same GH100 compute with 4.8 TB/s HBM3e. Per-SM limits of compute capability 9.0: 64 K
// registers, 228 KB shared memory (227 KB per block opt-in, 1 KB reserved per block), 2048
// threads, 32 blocks.
const std::vector<PlanGpu>& profiles() {
  static const std::vector<PlanGpu> p = [] {
    PlanGpu h100;
    h100.name = "h100";
    h100.label = "H100 SXM";
    PlanGpu h200 = h100;
    h200.name = "h200";
    h200.label = "H200 SXM";
    h200.hbm_tbps = 4.8;
    return std::vector<PlanGpu>{h100, h200};
  }();
  return p;
}

struct KernelRegs {
  const char* kernel;
  int hdp, stages, sm, regs;
};
constexpr KernelRegs kRegs[] = {
#include "plan/plan_kernel_resources.inc"
};

}  // namespace

const PlanGpu& plan_gpu(const std::string& name) {
  for (const PlanGpu& g : profiles())
    if (g.name == name) return g;
  std::string known;
  for (const PlanGpu& g : profiles()) known += (known.empty() ? "" : ", ") + g.name;
  DT_THROW(UsageError, "--gpu {}: no such GPU profile for the plan (known: {})", name, known);
}

std::vector<std::string> plan_gpu_names() {
  std::vector<std::string> out;
  for (const PlanGpu& g : profiles()) out.push_back(g.name);
  return out;
}

Occupancy blocks_per_sm(const PlanGpu& g, int regs_per_thread, int threads, size_t smem_per_block) {
  DT_ENFORCE(threads > 0 && threads <= 1024, InternalError, "blocks_per_sm: {} threads per block", threads);
  const int warps = (threads + 31) / 32;
  Occupancy o{g.max_blocks_per_sm, "blocks"};
  auto take = [&](int n, const char* why) {
    if (n < o.blocks_per_sm) o = {n, why};
  };
  take(g.max_threads_per_sm / (warps * 32), "threads");
  if (regs_per_thread > 0) {
    const int per_warp = (regs_per_thread * 32 + g.reg_alloc_unit - 1) / g.reg_alloc_unit * g.reg_alloc_unit;
    take(g.regs_per_sm / (per_warp * warps), "registers");
  }
  if (smem_per_block > g.smem_optin) {
    take(0, "shared memory");
  } else if (smem_per_block > 0) {
    take(static_cast<int>(g.smem_per_sm / (smem_per_block + g.smem_reserved)), "shared memory");
  }
  return o;
}

double wave_efficiency(int64_t blocks, int64_t slots) {
  if (blocks <= 0 || slots <= 0) return 1.0;
  const double waves = static_cast<double>(blocks) / static_cast<double>(slots);
  return waves / std::ceil(waves);
}

int plan_kernel_registers(const std::string& kernel, int hdp, int stages, int sm) {
  for (const KernelRegs& r : kRegs)
    if (kernel == r.kernel && r.hdp == hdp && r.stages == stages && r.sm == sm) return r.regs;
  return 0;
}

}  // namespace dtrain::plan
