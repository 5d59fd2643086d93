// INTERNAL to the kernel executor (test-only): a block's state for the sm_90 instructions,
// mbarrier objects and the bulk copies that complete on them (kernel_hopper.cpp) and the
// warpgroups' wgmma state (kernel_wgmma.cpp). Part of Block (kernel_exec_internal.h).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

namespace cuda_emu {

// What the engine keeps in a CUtensorMap's 128 bytes (cuTensorMapEncodeTiled,
// tensor_map.cpp): a tag, the global address, per dimension (dim 0 innermost) the size and,
// for dims 1.., the stride in bytes; the box; the element size and the swizzle (0 none,
// 3 128B: CUtensorMapSwizzle's values).
struct TensorMapDesc {
  static constexpr uint64_t TAG = 0x746d61705f656d75ull;  // "tmap_emu"
  uint64_t tag;
  uint64_t addr;
  uint64_t dim[5];
  uint64_t stride[5];  // stride[d] for d >= 1; stride[0] = the element size
  uint16_t box[5];
  uint8_t rank, elem_bytes, swizzle, pad;
};
static_assert(sizeof(TensorMapDesc) <= 128);
// The decoded map of a CUtensorMap's bytes, or null when they are not one the engine made.
const TensorMapDesc* tensor_map_decode(const void* map);

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: one copy in flight.
// Its bytes count against its barrier's tx-count when it completes (`done`, at a wait on
// the barrier or when nothing else can run); they land in shared memory (and its source
// is read) when the phase it completed in completes.
struct BulkCopy {
  char* dst;
  const char* src;  // a 1D copy's source; null for a tensor copy
  uint32_t bytes;
  const char* file;
  int line;
  uintptr_t pc;
  bool done;
  // cp.async.bulk.tensor (tile mode): the map and the box's first coordinates; the box
  // lands swizzled, elements out of bounds as zeros.
  TensorMapDesc map;
  int32_t coord[5];
};

// An mbarrier object: the PTX ISA's state (phase, pending arrivals, expected arrivals,
// tx-count) kept beside the 8 bytes of shared memory it lives in, which hold a tag the
// engine checks at every use (so ordinary stores over a live barrier are caught).
struct MBarrier {
  char* addr;
  uint32_t expected, pending;
  int32_t tx;
  uint32_t phase;  // phases completed since init
  const char* file;
  int line;         // its mbarrier.init
  unsigned init_t;  // the initialising thread
  bool fenced;      // that thread ran fence.mbarrier_init / fence.proxy.async since
  std::vector<BulkCopy> copies;
  std::vector<unsigned> waiters;  // threads parked in try_wait for the current phase
};

// One wgmma.mma_async of a warpgroup, issued and not yet retired: its operands as read
// at issue (A 64x16, B Nx16, C 64xN as fp32), the shared memory it read (16-byte rows,
// and their bytes then, checked at retirement), every thread's accumulator array and, for
// A from registers, every thread's 4 A registers and their values then (checked likewise).
struct WgmmaOp {
  int n = 0;
  bool scale_d = false;
  bool trans_b = false;  // B MN-major (imm-trans-b 1)
  bool chained = false;  // C is the result of an earlier pending op on the same accumulators
  unsigned group = ~0u;
  const char* file = nullptr;
  int line = 0;
  std::vector<float> a, b, c, d;
  std::vector<const char*> rows;
  std::vector<uint8_t> row_bytes;
  std::array<float*, 128> acc{};
  std::array<const uint32_t*, 128> areg{};  // all null: A from a descriptor
  std::vector<uint32_t> areg_vals;
};

// A warpgroup (4 consecutive warps, the first a multiple of 4): the instruction its
// threads gather at and its wgmma groups.
struct WarpGroupState {
  std::array<uint32_t, 4> arrived{};  // per warp
  unsigned count = 0;
  int op = -1;
  const char* file = nullptr;
  int line = 0;
  bool fenced = false;  // a wgmma.fence since the last wait_group (or the block's start)
  unsigned committed = 0;
  std::deque<WgmmaOp> ops;  // oldest first
};

struct HopperState {
  bool used = false;  // anything here since hopper_block_start
  std::vector<MBarrier> mbars;
  std::vector<WarpGroupState> wgs;
};

}  // namespace cuda_emu
