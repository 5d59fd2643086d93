// INTERNAL to the engine: the card whose limits the emulated devices report and enforce,
// chosen by CUDA_EMU_DEVICE=a100|l40s|h100|h200|b200 (default h100). Every device of a
// process has the same profile (a machine's GPUs are one model).
#pragma once

#include <cstddef>

namespace cuda_emu::rt {

struct DeviceProfile {
  const char* key;   // CUDA_EMU_DEVICE's value
  const char* name;  // cudaDeviceProp::name
  int major, minor;  // compute capability
  int sm_count;
  size_t smem_per_block;        // without opt-in (48 KB on every card)
  size_t smem_per_block_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  size_t smem_per_sm;
  int regs_per_sm;
  int regs_per_block;
  int max_regs_per_thread;
  int max_threads_per_block;
  int max_threads_per_sm;
  int max_blocks_per_sm;
  size_t total_mem;
  size_t l2_bytes;
  int memory_bus_width;
  int clock_khz;
  int memory_clock_khz;
};

// The profile CUDA_EMU_DEVICE names, read once. An unknown value is reported on stderr
// naming the valid ones, and the process has no devices (cudaGetDeviceCount answers 0,
// every device call cudaErrorNoDevice), so a mistyped profile cannot pass as the default.
const DeviceProfile* device_profile();

}  // namespace cuda_emu::rt
