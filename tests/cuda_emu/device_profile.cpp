// The cards the engine can pose as (CUDA_EMU_DEVICE) and their documented limits. The
// shared-memory, register, thread and block limits are the CUDA C Programming Guide's
// ("Compute Capabilities", table "Technical Specifications per Compute Capability", for
// 8.0, 8.9, 9.0 and 10.0): shared memory per SM 164 / 100 / 228 / 228 KB, per block with
// opt-in 163 / 99 / 227 / 227 KB, 64 K 32-bit registers per SM and per block, at most 255
// per thread, 1024 threads per block, resident threads per SM 2048 / 1536 / 2048 / 2048,
// resident blocks per SM 32 / 24 / 32 / 32. SM counts, memory sizes, L2 and clocks are
// NVIDIA's product datasheets and architecture whitepapers (A100 SXM4 80 GB, L40S, H100
// SXM5, H200 SXM, B200).
#include "device_profile.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cuda_emu::rt {

namespace {

constexpr size_t KB = 1024;
constexpr size_t GB = 1ull << 30;

// clang-format off
constexpr DeviceProfile PROFILES[] = {
  // key     name                       cc     SMs  smem/blk  opt-in    per SM    regs/SM regs/blk r/thr thr/blk thr/SM blk/SM memory     L2        bus   clock    mem clock
  {"a100",  "NVIDIA A100-SXM4-80GB",    8, 0,  108, 48 * KB,  163 * KB, 164 * KB, 65536,  65536,   255,  1024,   2048,  32,    80 * GB,   40 << 20, 5120, 1410000, 1593000},
  {"l40s",  "NVIDIA L40S",              8, 9,  142, 48 * KB,   99 * KB, 100 * KB, 65536,  65536,   255,  1024,   1536,  24,    48 * GB,   96 << 20,  384, 2520000, 9001000},
  {"h100",  "NVIDIA H100 80GB HBM3",    9, 0,  132, 48 * KB,  227 * KB, 228 * KB, 65536,  65536,   255,  1024,   2048,  32,    80 * GB,   50 << 20, 5120, 1980000, 2619000},
  {"h200",  "NVIDIA H200",              9, 0,  132, 48 * KB,  227 * KB, 228 * KB, 65536,  65536,   255,  1024,   2048,  32,   141 * GB,   50 << 20, 6144, 1980000, 3201000},
  {"b200",  "NVIDIA B200",             10, 0,  148, 48 * KB,  227 * KB, 228 * KB, 65536,  65536,   255,  1024,   2048,  32,   180 * GB,  126 << 20, 8192, 1965000, 4000000},
};
// clang-format on

const DeviceProfile* profile_from_env() {
  const char* e = std::getenv("CUDA_EMU_DEVICE");
  if (!e || !*e) e = "h100";
  for (const DeviceProfile& p : PROFILES)
    if (std::strcmp(p.key, e) == 0) return &p;
  std::fprintf(stderr,
               "cuda_emu: CUDA_EMU_DEVICE=%s is not a known card (a100, l40s, h100, h200, b200): the engine "
               "reports no CUDA device\n",
               e);
  return nullptr;
}

}  // namespace

const DeviceProfile* device_profile() {
  static const DeviceProfile* p = profile_from_env();
  return p;
}

}  // namespace cuda_emu::rt
