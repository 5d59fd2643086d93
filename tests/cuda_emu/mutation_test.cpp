// The CPU execution engine's mutation suite: each known class of GPU bug applied to a
// small kernel, and the engine must report it. Every row runs the correct kernel (which
// must pass, so the row cannot pass vacuously) and then its mutant, and checks the
// engine's message. The fragment rows check register contents against the PTX ISA's
// fragment tables written as CuTe-style (shape, stride) layouts (data, not the formulas
// the engine implements). Compiled with the racecheck's instrumentation (CMakeLists.txt).
#include "engine.h"
#include "kernels/hopper.cuh"
#include "kernels/mma.cuh"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <source_location>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace dtrain::kernels::detail;

namespace {

struct Result {
  cudaError_t err;
  std::string detail;
};

template <typename F>
Result run(const char* name, dim3 grid, dim3 block, size_t smem, F body,
           std::source_location at = std::source_location::current()) {
  cuda_emu::KernelLaunch k;
  k.name = name;
  k.file = at.file_name();
  k.line = static_cast<int>(at.line());
  k.grid = grid;
  k.block = block;
  k.dynamic_smem = smem;
  k.body = body;
  std::string detail;
  const cudaError_t e = cuda_emu::kernel_run(k, &detail);
  return Result{e, detail};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string here(int line) { return "mutation_test.cpp:" + std::to_string(line); }

// ----------------------------------------------------------------------------
// Kernels. `bug` selects the mutant.
__global__ void raw_kernel(float* out, bool bug) {  // warp 0 reads what warp 1 wrote
  __shared__ float s[32];
  const unsigned t = threadIdx.x;
  if (t >= 32) s[t - 32] = static_cast<float>(t);
  if (!bug) __syncthreads();
  if (t < 32) out[t] = s[t];
}
constexpr int L_RAW_W = __LINE__ - 4, L_RAW_R = __LINE__ - 2;  // the racing accesses' lines

__global__ void war_kernel(float* out, bool bug) {  // warp 0 reads what warp 1 then overwrites
  __shared__ float s[64];
  const unsigned t = threadIdx.x;
  s[t] = static_cast<float>(t);
  __syncthreads();
  float y = 0;
  if (t < 32) y = s[t + 32];
  if (!bug) __syncthreads();
  if (t >= 32) s[t] = -1.0f;
  __syncthreads();
  out[t] = y + s[t];
}
constexpr int L_WAR_R = __LINE__ - 6, L_WAR_W = __LINE__ - 4;

__global__ void waw_kernel(float* out, bool bug) {  // warp 0's store, then warp 1's
  __shared__ float s[1];
  const unsigned t = threadIdx.x;
  if (t == 0) s[0] = 1.0f;
  if (!bug) __syncthreads();
  if (t == 32) s[0] = 2.0f;
  __syncthreads();
  out[t] = s[0];
}
constexpr int L_WAW_1 = __LINE__ - 6, L_WAW_2 = __LINE__ - 4;

__global__ void lanes_kernel(float* out, bool bug) {  // lane 1 reads what lane 0 wrote
  __shared__ float s[1];
  const unsigned t = threadIdx.x;
  if (t == 0) s[0] = 7.0f;
  if (!bug) __syncwarp();
  if (t == 1) out[0] = s[0];
}
constexpr int L_LANE_W = __LINE__ - 4, L_LANE_R = __LINE__ - 2;

__global__ void divergent_barrier_kernel(float* out, bool bug) {
  const unsigned t = threadIdx.x;
  if (!bug || t < 32) __syncthreads();
  out[t] = 1.0f;
}

__global__ void partial_mask_kernel(float* out, bool bug) {  // a warp sum
  float v = static_cast<float>(threadIdx.x);
  const unsigned mask = bug ? 0x0000ffffu : 0xffffffffu;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  out[threadIdx.x] = v;
}

__global__ void copy_kernel(float* dst, const float* src, int n, bool bug) {  // bug: one past the end
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n + (bug ? 1 : 0)) dst[i] = src[i];
}

__global__ void smem_copy_kernel(float* out, int n, bool bug) {  // dynamic shared memory of n floats
  float* s = static_cast<float*>(cuda_emu::dynamic_smem());
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t);
  __syncthreads();
  out[t] = s[bug ? t + 1 : (t + 1) % n];
}

// For the schedules (racecheck off): values that differ from launch to launch, so stale
// static shared memory left by an earlier block cannot pass for this one's.
__global__ void order_kernel(float* out, float base, bool bug) {
  __shared__ float s[64];
  const unsigned t = threadIdx.x;
  s[t] = base + static_cast<float>(t);
  if (!bug) __syncthreads();
  out[t] = s[63 - t];
}

__global__ void fill_kernel(float* p, float v) { p[blockIdx.x * blockDim.x + threadIdx.x] = v; }
__global__ void plain_copy_kernel(float* dst, const float* src) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  dst[i] = src[i];
}

// ----------------------------------------------------------------------------
// The PTX ISA's fragment tables for mma.m16n8k16 (.bf16/.f16, fp32 accumulate) and
// ldmatrix.m8n8.b16, as CuTe writes them (cute/atom/mma_traits_sm80.hpp,
// copy_traits_sm75.hpp): a layout maps (lane, value) to an element index. Lane modes
// are (4, 8) (threadID_in_group, groupID); value v is register v / 2, half v % 2.
struct Mode {
  int shape, stride;
};
struct Layout {
  std::vector<Mode> lane, value;
  int operator()(int l, int v) const {  // colexicographic: the first mode varies fastest
    int idx = 0;
    for (const Mode& m : lane) idx += (l % m.shape) * m.stride, l /= m.shape;
    for (const Mode& m : value) idx += (v % m.shape) * m.stride, v /= m.shape;
    return idx;
  }
};
// A (16 x 16, index m + 16 k): ((4,8),(2,2,2)) : ((32,1),(16,8,128))
const Layout MMA_A{{{4, 32}, {8, 1}}, {{2, 16}, {2, 8}, {2, 128}}};
// B (8 x 16, index n + 8 k): ((4,8),(2,2)) : ((16,1),(8,64))
const Layout MMA_B{{{4, 16}, {8, 1}}, {{2, 8}, {2, 64}}};
// C/D (16 x 8, index m + 16 n): ((4,8),(2,2)) : ((32,1),(16,8))
const Layout MMA_C{{{4, 32}, {8, 1}}, {{2, 16}, {2, 8}}};
// ldmatrix x1 destination (8 x 8, index 8 row + col): (32,2) : (2,1); with .trans:
// ((4,8),2) : ((16,1),8).
const Layout LDSM_N{{{32, 2}}, {{2, 1}}};
const Layout LDSM_T{{{4, 16}, {8, 1}}, {{2, 8}}};

uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// One warp: fragments gathered from global memory through the tables, one mma, D
// scattered back. bug: a[1] and a[2] swapped.
__global__ void mma_kernel(float* D, const uint16_t* A, const uint16_t* B, const int* a_idx, const int* b_idx,
                           const int* c_idx, bool bug) {
  const int l = static_cast<int>(threadIdx.x);
  uint32_t a[4], b[2];
  float d[4];
  for (int j = 0; j < 4; ++j) a[j] = A[a_idx[l * 8 + 2 * j]] | static_cast<uint32_t>(A[a_idx[l * 8 + 2 * j + 1]]) << 16;
  for (int j = 0; j < 2; ++j) b[j] = B[b_idx[l * 4 + 2 * j]] | static_cast<uint32_t>(B[b_idx[l * 4 + 2 * j + 1]]) << 16;
  for (int i = 0; i < 4; ++i) d[i] = 0.0f;
  if (bug) {
    const uint32_t x = a[1];
    a[1] = a[2];
    a[2] = x;
  }
  mma_m16n8k16<__nv_bfloat16>(d, a, b);
  for (int i = 0; i < 4; ++i) D[c_idx[l * 4 + i]] = d[i];
}

// One warp: an 8x8 tile in shared memory, ldmatrix x1 (the mutant flips .trans), each
// lane's register stored as two halves.
__global__ void ldsm_kernel(uint16_t* out, const uint16_t* M, bool trans) {
  alignas(16) __shared__ uint16_t tile[64];
  const int l = static_cast<int>(threadIdx.x);
  tile[2 * l] = M[2 * l];
  tile[2 * l + 1] = M[2 * l + 1];
  __syncthreads();
  uint32_t r;
  if (trans) {
    uint32_t r2[2];
    ldmatrix_x2_trans(r2, &tile[8 * (l % 8)]);
    r = r2[0];
  } else {
    uint32_t r2[2];
    ldmatrix_x2(r2, &tile[8 * (l % 8)]);
    r = r2[0];
  }
  out[2 * l] = static_cast<uint16_t>(r);
  out[2 * l + 1] = static_cast<uint16_t>(r >> 16);
}

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(const std::vector<T>& h) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), h.size() * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get(size_t n) const {
    std::vector<T> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

// Host arrays run under kernel_run (the kernels read and write host memory directly).
struct Row {
  const char* bug;
  Result ok, mutant;
};
void report(const Row& r) { MESSAGE((std::string(r.bug) + " -> " + r.mutant.detail)); }

// ----------------------------------------------------------------------------
// sm_90: one warpgroup, two k16 steps of D (64 x 64) = A B^T, each step's A and B images
// (128B-swizzled, 8 KB each) staged by one bulk copy completing on one mbarrier, whose
// phase 0 then phase 1 the threads wait for. `bug` selects the mutant.
enum HopBug {
  HOP_OK,
  HOP_TX_SHORT,      // expect_tx announces 16 bytes too few
  HOP_TX_LONG,       // ... 16 bytes too many
  HOP_PARITY,        // waits on the other parity
  HOP_ACC_EARLY,     // rescales the accumulators between mma_async and wait_group
  HOP_ACC_READ,      // stores the accumulators before wait_group
  HOP_SWIZZLE_NONE,  // descriptors say no swizzle for 128B-swizzled operands
  HOP_SWIZZLE_32B,   // descriptors say 32B swizzle (not modelled)
  HOP_WARP_MISSING,  // warp 3 skips the mma_async
  HOP_NO_FENCE,      // no wgmma.fence before the first mma_async
  HOP_FRAGMENT,      // stores D with rows g + 8 (i & 1): the fragment misread
};
constexpr uint32_t HOP_STEP = 16384;  // one step's A and B images

__global__ void hopper_kernel(float* out, const uint8_t* img, HopBug bug) {
  char* smem = static_cast<char*>(cuda_emu::dynamic_smem());
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  char* stage = smem + 1024;
  const unsigned t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  float acc[32];
  const WgmmaSwizzle sw = bug == HOP_SWIZZLE_NONE  ? WgmmaSwizzle::NONE
                          : bug == HOP_SWIZZLE_32B ? WgmmaSwizzle::B32
                                                   : WgmmaSwizzle::B128;
  for (uint32_t step = 0; step < 2; ++step) {
    char* buf = stage + step * HOP_STEP;
    if (t == 0) {
      const uint32_t tx = HOP_STEP + (bug == HOP_TX_SHORT ? -16 : bug == HOP_TX_LONG ? 16 : 0);
      mbarrier_arrive_expect_tx(bar, tx);
      bulk_copy_g2s(buf, img + step * HOP_STEP, HOP_STEP, bar);
    }
    const uint32_t parity = (step + (bug == HOP_PARITY ? 1 : 0)) & 1;
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
    if (bug != HOP_NO_FENCE || step > 0) wgmma_fence();
    if (bug != HOP_WARP_MISSING || t / 32 != 3)
      wgmma_m64k16<__nv_bfloat16, 64>(acc, wgmma_desc(buf, 128, 1024, sw), wgmma_desc(buf + 8192, 128, 1024, sw),
                                      step > 0);
    wgmma_commit();
    if (bug == HOP_ACC_EARLY)
      for (float& x : acc) x *= 0.5f;
    if (bug == HOP_ACC_READ) out[t] = acc[0];
    wgmma_wait<0>();
  }
  const unsigned w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < 32; ++i) {
    const unsigned row = 16 * w + g + 8 * (bug == HOP_FRAGMENT ? (i & 1) : ((i >> 1) & 1));
    const unsigned col = 8 * (i >> 2) + 2 * q + (bug == HOP_FRAGMENT ? ((i >> 1) & 1) : (i & 1));
    if (bug != HOP_ACC_READ || t > 0 || i > 0) out[row * 64 + col] = acc[i];
  }
  __syncthreads();
  if (t == 0) mbarrier_inval(bar);
}

// sm_90, A from registers: one warpgroup, D (64 x 64) = A (64 x 16) B (16 x 64) by one
// wgmma m64n64k16 with A's fragment gathered from global memory through a_idx (the CuTe
// table: thread t's element i is A's entry a_idx[8 t + i], index m + 64 k) and B (row k
// holds 64 n values) staged MN-major, 128B-swizzled, by one bulk copy. `bug` selects the mutant.
enum RsBug {
  RS_OK,
  RS_A_WRITTEN,    // an A register rewritten between mma_async and wait_group
  RS_A_FRAGMENT,   // the fragment's registers 1 and 2 swapped (rows g + 8 and columns + 8 mixed up)
  RS_A_HALVES,     // each register's two elements swapped (the higher-indexed in the low half)
  RS_NO_TRANS,     // imm-trans-b 0 on the MN-major B
  RS_MN_NOSWIZZLE  // the MN-major B's descriptor says no swizzle
};
__global__ void hopper_rs_kernel(float* out, const uint16_t* a, const int* a_idx, const uint8_t* bimg, RsBug bug) {
  char* smem = static_cast<char*>(cuda_emu::dynamic_smem());
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  char* bs = smem + 1024;
  const unsigned t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
    mbarrier_arrive_expect_tx(bar, 2048);
    bulk_copy_g2s(bs, bimg, 2048, bar);
  }
  __syncthreads();
  while (!mbarrier_try_wait_parity(bar, 0)) {
  }
  uint32_t af[4];
  for (int r = 0; r < 4; ++r)
    af[r] = static_cast<uint32_t>(a[a_idx[8 * t + 2 * r]]) | static_cast<uint32_t>(a[a_idx[8 * t + 2 * r + 1]]) << 16;
  if (bug == RS_A_FRAGMENT) std::swap(af[1], af[2]);
  if (bug == RS_A_HALVES)
    for (uint32_t& r : af) r = r >> 16 | r << 16;
  float acc[32];
  const uint64_t bd = wgmma_desc(bs, 8192, 1024, bug == RS_MN_NOSWIZZLE ? WgmmaSwizzle::NONE : WgmmaSwizzle::B128);
  wgmma_fence();
  if (bug == RS_NO_TRANS) wgmma_m64k16_rs<__nv_bfloat16, 64, 0>(acc, af, bd, false);
  else wgmma_m64k16_rs<__nv_bfloat16, 64, 1>(acc, af, bd, false);
  wgmma_commit();
  if (bug == RS_A_WRITTEN && t == 33) af[0] ^= 1u;
  wgmma_wait<0>();
  const unsigned w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < 32; ++i) out[(16 * w + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * q + (i & 1)] = acc[i];
  __syncthreads();
  if (t == 0) mbarrier_inval(bar);
}
}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE(
    "mutation: a missing __syncthreads is a racecheck error (read-after-write, write-after-read, write-after-write)") {
  std::vector<float> out(64);
  float* o = out.data();
  // Which access comes second decides the hazard's name: each row pins the warp order.
  struct Case {
    const char* bug;
    void (*kernel)(float*, bool);
    cuda_emu::Schedule order;
    const char* kind;
    int line_now, line_prev;
  } cases[] = {
      {"missing barrier between a store and another warp's load", raw_kernel, cuda_emu::Schedule::WARP_BEHIND,
       "read-after-write", L_RAW_R, L_RAW_W},
      {"missing barrier between a load and another warp's store", war_kernel, cuda_emu::Schedule::WARP_AHEAD,
       "write-after-read", L_WAR_W, L_WAR_R},
      {"missing barrier between two warps' stores", waw_kernel, cuda_emu::Schedule::WARP_AHEAD, "write-after-write",
       L_WAW_2, L_WAW_1},
  };
  for (const Case& c : cases) {
    const std::string bug = c.bug;
    CAPTURE(bug);
    cuda_emu::exec_mode_set(cuda_emu::ExecMode{true, c.order});
    auto k = c.kernel;
    Row r{c.bug, run("race_kernel", 2, 64, 0, [=] { k(o, false); }), run("race_kernel", 2, 64, 0, [=] { k(o, true); })};
    CHECK_MESSAGE(r.ok.err == cudaSuccess, r.ok.detail);
    CHECK(r.mutant.err == cudaErrorLaunchFailure);
    CHECK(has(r.mutant.detail, std::string("racecheck: ") + c.kind + " hazard"));
    CHECK(has(r.mutant.detail, "static __shared__"));
    CHECK(has(r.mutant.detail, here(c.line_now)));
    CHECK(has(r.mutant.detail, here(c.line_prev)));
    report(r);
    // Under the default (seeded) order the same bug is caught, named by whichever access
    // came second.
    cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
    const Result seeded = run("race_kernel", 2, 64, 0, [=] { k(o, true); });
    CHECK(has(seeded.detail, " hazard at shared address"));
  }
}

TEST_CASE("racecheck first (CUDA_EMU_RACECHECK=first): each launch configuration's first launch is checked") {
  std::vector<float> out(64);
  float* o = out.data();
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{true, cuda_emu::Schedule::WARP_BEHIND, true});
  auto launch = [&](unsigned grid, std::source_location at = std::source_location::current()) {
    return run(
        "race_kernel", grid, 64, 0, [=] { raw_kernel(o, true); }, at);
  };
  // One call site: its first launch per grid is checked, a repeat of a configuration is not.
  std::vector<Result> r;
  for (unsigned grid : {2u, 2u, 3u, 3u, 2u}) r.push_back(launch(grid));
  CHECK(r[0].err == cudaErrorLaunchFailure);
  CHECK(has(r[0].detail, "racecheck: read-after-write hazard"));
  CHECK_MESSAGE(r[1].err == cudaSuccess, r[1].detail);
  CHECK(r[2].err == cudaErrorLaunchFailure);
  CHECK(has(r[2].detail, "racecheck: read-after-write hazard"));
  CHECK_MESSAGE(r[3].err == cudaSuccess, r[3].detail);
  CHECK_MESSAGE(r[4].err == cudaSuccess, r[4].detail);
  // The default: every launch checked.
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
  CHECK(launch(2).err == cudaErrorLaunchFailure);
  CHECK(launch(2).err == cudaErrorLaunchFailure);
}

TEST_CASE("mutation: a missing __syncwarp between two lanes of one warp is a racecheck error") {
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{true, cuda_emu::Schedule::WARP_AHEAD});
  std::vector<float> out(1);
  float* o = out.data();
  Row r{"missing __syncwarp between a lane's store and another lane's load",
        run("lanes_kernel", 1, 32, 0, [=] { lanes_kernel(o, false); }),
        run("lanes_kernel", 1, 32, 0, [=] { lanes_kernel(o, true); })};
  CHECK_MESSAGE(r.ok.err == cudaSuccess, r.ok.detail);
  CHECK(out[0] == 7.0f);
  CHECK(r.mutant.err == cudaErrorLaunchFailure);
  CHECK(has(r.mutant.detail, "racecheck: read-after-write hazard"));
  CHECK(has(r.mutant.detail, "no __syncwarp or other warp instruction of both lanes"));
  CHECK(has(r.mutant.detail, here(L_LANE_R)));
  CHECK(has(r.mutant.detail, here(L_LANE_W)));
  report(r);
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
}

TEST_CASE("mutation: ordering races change results under the warp-ahead and warp-behind schedules") {
  // The racecheck off: the schedules alone make the missing barrier visible in values.
  std::vector<float> out(64);
  float* o = out.data();
  float base = 0;
  for (auto s : {cuda_emu::Schedule::WARP_AHEAD, cuda_emu::Schedule::WARP_BEHIND}) {
    cuda_emu::exec_mode_set(cuda_emu::ExecMode{false, s});
    for (bool bug : {false, true}) {
      base += 100;
      const float b0 = base;
      CHECK(run("order_kernel", 1, 64, 0, [=] { order_kernel(o, b0, bug); }).err == cudaSuccess);
      int wrong = 0;
      for (int t = 0; t < 64; ++t) wrong += out[t] != b0 + static_cast<float>(63 - t);
      if (!bug) CHECK(wrong == 0);
      if (bug) CHECK_MESSAGE(wrong > 0, "the mutant computed the right values under schedule " << static_cast<int>(s));
      if (bug)
        MESSAGE((std::string("missing barrier, racecheck off, warp order ") +
                 (s == cuda_emu::Schedule::WARP_AHEAD ? "ahead" : "behind") + " -> " + std::to_string(wrong) +
                 " of 64 values wrong"));
    }
  }
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
}

TEST_CASE("mutation: divergent barrier, partial-mask shuffle, out-of-bounds global and shared accesses") {
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
  std::vector<float> out(64);
  float* o = out.data();
  {
    Row r{"__syncthreads in divergent code",
          run("divergent_barrier_kernel", 1, 64, 0, [=] { divergent_barrier_kernel(o, false); }),
          run("divergent_barrier_kernel", 1, 64, 0, [=] { divergent_barrier_kernel(o, true); })};
    CHECK(r.ok.err == cudaSuccess);
    CHECK(r.mutant.err == cudaErrorLaunchFailure);
    CHECK(has(r.mutant.detail, "every thread of a block must reach each __syncthreads"));
    report(r);
  }
  {
    Row r{"shuffle with a partial mask", run("partial_mask_kernel", 1, 32, 0, [=] { partial_mask_kernel(o, false); }),
          run("partial_mask_kernel", 1, 32, 0, [=] { partial_mask_kernel(o, true); })};
    CHECK(r.ok.err == cudaSuccess);
    CHECK(out[0] == 496.0f);
    CHECK(r.mutant.err == cudaErrorLaunchFailure);
    // Which lanes arrive first decides the message: either names the mask.
    CHECK((has(r.mutant.detail, "with a mask that does not include its lane") ||
           has(r.mutant.detail, "which is not in the mask")));
    report(r);
  }
  {
    const int n = 1024;
    float *src = nullptr, *dst = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&src), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dst), n * sizeof(float)) == cudaSuccess);
    Row r{"global load/store one past the end", run("copy_kernel", 5, 256, 0, [=] { copy_kernel(dst, src, n, false); }),
          run("copy_kernel", 5, 256, 0, [=] { copy_kernel(dst, src, n, true); })};
    CHECK(r.ok.err == cudaSuccess);
    CHECK(r.mutant.err == cudaErrorIllegalAddress);
    CHECK(has(r.mutant.detail, "past its end"));
    report(r);
    cudaFree(src);
    cudaFree(dst);
    cuda_emu::test_clear_errors();
  }
  {
    const int n = 1024;  // a page of floats: the guard page follows the last one
    std::vector<float> big(n);
    float* b = big.data();
    Row r{"shared load one past the end",
          run("smem_copy_kernel", 1, n, n * sizeof(float), [=] { smem_copy_kernel(b, n, false); }),
          run("smem_copy_kernel", 1, n, n * sizeof(float), [=] { smem_copy_kernel(b, n, true); })};
    CHECK(r.ok.err == cudaSuccess);
    CHECK(r.mutant.err == cudaErrorIllegalAddress);
    CHECK(has(r.mutant.detail, "bytes of dynamic shared memory"));
    report(r);
  }
}

TEST_CASE("mutation: a missing stream wait between two streams; use after cudaFreeAsync by a kernel and by a copy") {
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
  const int n = 256;
  cudaStream_t s1, s2;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t e;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  float *buf = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)) == cudaSuccess);
  // Producer on s1, consumer on s2; the mutant drops the event wait. Rounds of fresh
  // values: the adversarial stream scheduler runs the consumer first in some round.
  auto rounds = [&](bool bug) {
    int wrong = 0;
    for (int round = 1; round <= 16; ++round) {
      cuda_emu::launch("fill_kernel", __FILE__, __LINE__, 1, n, 0, s1, fill_kernel)(buf, static_cast<float>(round));
      if (!bug) {
        REQUIRE(cudaEventRecord(e, s1) == cudaSuccess);
        REQUIRE(cudaStreamWaitEvent(s2, e, 0) == cudaSuccess);
      }
      cuda_emu::launch("plain_copy_kernel", __FILE__, __LINE__, 1, n, 0, s2, plain_copy_kernel)(out, buf);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      std::vector<float> h(n);
      REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      wrong += h[0] != static_cast<float>(round);
    }
    return wrong;
  };
  CHECK(rounds(false) == 0);
  const int wrong = rounds(true);
  const char* sched = std::getenv("CUDA_EMU_SCHEDULE");
  if (!sched || std::string(sched) != "fifo") CHECK(wrong > 0);  // fifo runs in issue order
  MESSAGE("missing stream wait between two streams -> the consumer read stale data in " << wrong << " of 16 rounds");

  // Use after cudaFreeAsync: the kernel is ordered after the free on the same stream.
  float* victim = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&victim), n * sizeof(float)) == cudaSuccess);
  cuda_emu::launch("plain_copy_kernel", __FILE__, __LINE__, 1, n, 0, s1, plain_copy_kernel)(out, victim);
  REQUIRE(cudaFreeAsync(victim, s1) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s1) == cudaSuccess);  // the correct order
  // The engine holds stream work back until a sync, so the free is still queued when the
  // launch and the copy are checked and the fault comes from running them; under
  // CUDA_EMU_SCHEDULE=fifo the free may already have run, and the call itself is refused.
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&victim), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaFreeAsync(victim, s1) == cudaSuccess);
  cuda_emu::launch("plain_copy_kernel", __FILE__, __LINE__, 1, n, 0, s1, plain_copy_kernel)(out, victim);
  const cudaError_t at_launch = cudaGetLastError();
  const cudaError_t at_sync = cudaStreamSynchronize(s1);
  const std::string detail = cuda_emu::last_error_detail();
  CHECK(has(detail, "plain_copy_kernel"));
  if (at_launch == cudaSuccess) {
    CHECK(at_sync == cudaErrorIllegalAddress);
    CHECK(has(detail, "use after free"));
  } else {
    CHECK(has(detail, "freed"));
  }
  MESSAGE("use after cudaFreeAsync -> " << detail);
  cuda_emu::test_clear_errors();

  // The same bug in work that is not a kernel (a copy; NCCL collectives and GEMMs run the
  // same way): an engine report naming the op, not a SIGSEGV of the test process. Twice:
  // the freed pages are closed again after the first report.
  for (int pass = 0; pass < 2; ++pass) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&victim), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaFreeAsync(victim, s1) == cudaSuccess);
    const cudaError_t at_call = cudaMemcpyAsync(out, victim, n * sizeof(float), cudaMemcpyDeviceToDevice, s1);
    const cudaError_t copy_sync = cudaStreamSynchronize(s1);
    const std::string copy_detail = cuda_emu::last_error_detail();
    if (at_call == cudaSuccess) {
      CHECK(copy_sync == cudaErrorIllegalAddress);
      CHECK(has(copy_detail, "cudaMemcpyAsync (stream-ordered work on device 0) read address"));
      CHECK(has(copy_detail, "use after free"));
    } else {
      CHECK(!copy_detail.empty());
    }
    if (pass == 0) MESSAGE("use after cudaFreeAsync by a copy -> " << copy_detail);
    cuda_emu::test_clear_errors();
  }
  cudaFree(buf);
  cudaFree(out);
  cudaEventDestroy(e);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cuda_emu::test_clear_errors();
}

TEST_CASE("mutation: mma fragments (a[1]/a[2] swapped) and ldmatrix .trans, against the PTX ISA tables") {
  cuda_emu::exec_mode_set(cuda_emu::ExecMode{});
  // A 16x16 and B 16x8 of small integers (exact in bf16 and in the fp32 sums).
  std::vector<uint16_t> A(256), B(128);
  std::vector<float> Af(256), Bf(128);
  for (int i = 0; i < 256; ++i) A[i] = bf16_bits(Af[i] = static_cast<float>((i * 7) % 13 - 6));
  for (int i = 0; i < 128; ++i) B[i] = bf16_bits(Bf[i] = static_cast<float>((i * 5) % 11 - 5));
  // Element index -> (m, k) etc. from the tables: A is m + 16 k, B is n + 8 k, C is m + 16 n.
  std::vector<int> a_idx(256), b_idx(128), c_idx(128);
  for (int l = 0; l < 32; ++l) {
    for (int v = 0; v < 8; ++v) {
      const int x = MMA_A(l, v), m = x % 16, k = x / 16;
      a_idx[l * 8 + v] = m * 16 + k;  // A stored row-major [m][k]
    }
    for (int v = 0; v < 4; ++v) {
      const int x = MMA_B(l, v), n = x % 8, k = x / 8;
      b_idx[l * 4 + v] = k * 8 + n;  // B stored [k][n]
      const int y = MMA_C(l, v), m = y % 16, nn = y / 16;
      c_idx[l * 4 + v] = m * 8 + nn;  // D stored [m][n]
    }
  }
  Dev<uint16_t> dA(A), dB(B);
  Dev<int> dai(a_idx), dbi(b_idx), dci(c_idx);
  Dev<float> dD(std::vector<float>(128, 0.0f));
  auto mma_err = [&](bool bug) {
    cuda_emu::launch("mma_kernel", __FILE__, __LINE__, 1, 32, 0, nullptr, mma_kernel)(dD.p, dA.p, dB.p, dai.p, dbi.p,
                                                                                      dci.p, bug);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<float> D = dD.get(128);
    double worst = 0;
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double ref = 0;
        for (int k = 0; k < 16; ++k) ref += static_cast<double>(Af[m * 16 + k]) * Bf[k * 8 + n];
        worst = std::max(worst, std::fabs(D[m * 8 + n] - ref));
      }
    return worst;
  };
  CHECK(mma_err(false) == 0.0);
  const double bad = mma_err(true);
  CHECK(bad > 1.0);
  MESSAGE("mma fragment order a[1]/a[2] swapped -> D differs from A B by up to " << bad);

  // ldmatrix: register 0 of each lane against the table, without and with .trans.
  std::vector<uint16_t> M(64);
  for (int i = 0; i < 64; ++i) M[i] = static_cast<uint16_t>(1000 + i);
  Dev<uint16_t> dM(M), dO(std::vector<uint16_t>(64, 0));
  auto ldsm_wrong = [&](bool trans, const Layout& table) {
    cuda_emu::launch("ldsm_kernel", __FILE__, __LINE__, 1, 32, 0, nullptr, ldsm_kernel)(dO.p, dM.p, trans);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<uint16_t> o = dO.get(64);
    int wrong = 0;
    for (int l = 0; l < 32; ++l)
      for (int v = 0; v < 2; ++v) wrong += o[2 * l + v] != M[table(l, v)];
    return wrong;
  };
  CHECK(ldsm_wrong(false, LDSM_N) == 0);
  CHECK(ldsm_wrong(true, LDSM_T) == 0);
  const int wrong_n = ldsm_wrong(true, LDSM_N), wrong_t = ldsm_wrong(false, LDSM_T);
  CHECK(wrong_n > 0);
  CHECK(wrong_t > 0);
  MESSAGE("ldmatrix with the wrong .trans -> " << wrong_n << " and " << wrong_t
                                               << " of 64 elements differ from the PTX table");
}

// ----------------------------------------------------------------------------
// sm_90: each mutant of hopper_kernel against the correct kernel, which must reproduce
// D = A B^T over two k16 steps and store the accumulator fragment where the CuTe table
// for wgmma m64nNk16's D (cute/atom/mma_traits_sm90_gmma.hpp, CLayout_64xN: thread
// modes (4, 8, 4), value modes (2, 2, N / 8); index m + 64 n) puts it.
TEST_CASE("mutation: mbarrier tx-count and parity, wgmma accumulators, swizzle, warpgroup and fence (sm_90)") {
  const Layout WG_D{{{4, 128}, {8, 1}, {4, 16}}, {{2, 64}, {2, 8}, {8, 512}}};
  // Step s: A[m][k] and B[n][k] (k < 16), so that D[m][n] = m + 64 n over both steps:
  // step 0 gives m (A[m][0] = m, B[n][0] = 1), step 1 gives 64 n (A[m][0] = 1, B[n][0] = 64 n).
  std::vector<uint8_t> img(2 * HOP_STEP, 0);
  auto put = [&](uint32_t step, bool is_b, int r, int k, float v) {  // 128B-swizzled K-major
    const uint32_t at =
        step * HOP_STEP + (is_b ? 8192u : 0u) +
        static_cast<uint32_t>((r / 8) * 1024 + (r % 8) * 128 + (((k / 8) ^ (r % 8)) * 16) + (k % 8) * 2);
    const uint16_t h = bf16_bits(v);
    std::memcpy(&img[at], &h, 2);
  };
  for (int r = 0; r < 64; ++r) {
    put(0, false, r, 0, static_cast<float>(r));
    put(0, true, r, 0, 1.0f);
    put(1, false, r, 0, 1.0f);
    put(1, true, r, 0, static_cast<float>(64 * r));
  }
  Dev<uint8_t> dimg(img);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the pageable upload lands before kernel_run reads it
  std::vector<float> out(64 * 64);
  float* o = out.data();
  const uint8_t* ip = dimg.p;
  auto go = [&](HopBug bug) {
    return run("hopper_kernel", 1, 128, 1024 + 2 * HOP_STEP, [=] { hopper_kernel(o, ip, bug); });
  };
  auto wrong = [&] {  // elements off the table
    int n = 0;
    for (int m = 0; m < 64; ++m)
      for (int c = 0; c < 64; ++c) n += out[static_cast<size_t>(m * 64 + c)] != static_cast<float>(m + 64 * c);
    return n;
  };
  const Result ok = go(HOP_OK);
  REQUIRE_MESSAGE(ok.err == cudaSuccess, ok.detail);
  CHECK(wrong() == 0);
  int table_off = 0;  // the table itself: thread t's value i is element WG_D(t, i)
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 32; ++i) {
      const int x = WG_D(t, i), m = x % 64, n = x / 64;
      const unsigned w = static_cast<unsigned>(t) / 32, g = (static_cast<unsigned>(t) % 32) / 4,
                     q = static_cast<unsigned>(t) % 4;
      table_off += m != static_cast<int>(16 * w + g + 8 * ((i >> 1) & 1)) ||
                   n != static_cast<int>(8 * (i >> 2) + 2 * q + (i & 1));
    }
  CHECK(table_off == 0);
  struct Case {
    HopBug bug;
    const char* what;
    const char* expect;
  } cases[] = {
      {HOP_TX_SHORT, "expect_tx 16 bytes short", "bytes more than expect_tx announced"},
      {HOP_TX_LONG, "expect_tx 16 bytes long",
       "waits for the phase of parity 0: phase 0, 0 of 1 arrivals pending, tx-count 16"},
      {HOP_PARITY, "waiting on the wrong parity", "has not written yet"},
      {HOP_ACC_EARLY, "accumulators rescaled before wait_group", "was written before the wait_group that retires it"},
      {HOP_SWIZZLE_32B, "descriptor with 32B swizzle", "is not modelled"},
      {HOP_WARP_MISSING, "warp 3 of the warpgroup skips the mma_async", "other threads of its warpgroup wait at"},
      {HOP_NO_FENCE, "no wgmma.fence before the first mma_async", "no wgmma.fence since"},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    Row r{c.what, ok, go(c.bug)};
    CHECK(r.mutant.err == cudaErrorLaunchFailure);
    CHECK(has(r.mutant.detail, c.expect));
    CHECK(has(r.mutant.detail, "mutation_test.cpp:"));
    report(r);
  }
  // Mutants a GPU runs to wrong values: the engine's results show it.
  for (const auto& [bug, what] : {std::pair{HOP_ACC_READ, "accumulators stored before wait_group"},
                                  std::pair{HOP_SWIZZLE_NONE, "descriptor without swizzle on a 128B-swizzled tile"},
                                  std::pair{HOP_FRAGMENT, "accumulator fragment rows misread"}}) {
    std::fill(out.begin(), out.end(), 0.0f);
    const Result r = go(bug);
    CHECK_MESSAGE(r.err == cudaSuccess, r.detail);
    const int bad = wrong();
    CHECK(bad > 0);
    if (bug == HOP_ACC_READ) CHECK(std::isnan(out[0]));  // the engine's tag, not a stale value
    MESSAGE(std::string(what) << " -> " << bad << " of 4096 elements of D wrong");
  }
}

// sm_90, A from registers and B MN-major: each mutant of hopper_rs_kernel against the
// correct kernel, which must give D[m][n] = m + 64 n (A[m][0] = m, A[m][1] = 1, B[0][n] = 1,
// B[1][n] = 64 n, the rest 0) with A's fragment gathered through CuTe's table for the
// m64nNk16 A operand (cute/atom/mma_traits_sm90_gmma.hpp, ALayout_64x16: thread modes
// (4, 8, 4) : (128, 1, 16), value modes (2, 2, 2) : (64, 8, 512); index m + 64 k), which must
// also be kernels/hopper.cuh's formula for it.
TEST_CASE("mutation: wgmma with A from registers and B MN-major (imm-trans-b): fragment, transpose, swizzle (sm_90)") {
  const Layout WG_A{{{4, 128}, {8, 1}, {4, 16}}, {{2, 64}, {2, 8}, {2, 512}}};
  std::vector<int> a_idx(128 * 8);
  int table_off = 0;
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 8; ++i) {
      const int x = WG_A(t, i), m = x % 64, k = x / 64;
      a_idx[static_cast<size_t>(8 * t + i)] = m * 16 + k;  // A row-major 64 x 16
      table_off += m != 16 * (t / 32) + (t % 32) / 4 + 8 * ((i >> 1) & 1) || k != 8 * (i >> 2) + 2 * (t % 4) + (i & 1);
    }
  CHECK(table_off == 0);
  std::vector<uint16_t> a(64 * 16, bf16_bits(0.0f));
  for (int m = 0; m < 64; ++m) {
    a[static_cast<size_t>(m * 16)] = bf16_bits(static_cast<float>(m));
    a[static_cast<size_t>(m * 16 + 1)] = bf16_bits(1.0f);
  }
  std::vector<uint8_t> img(2048, 0);  // MN-major 128B: row k at (k / 8) 1024 + (k % 8) 128, chunks ^ k % 8
  auto put = [&](int k, int n, float v) {
    const uint16_t h = bf16_bits(v);
    std::memcpy(&img[static_cast<size_t>((k / 8) * 1024 + (k % 8) * 128 + (((n / 8) ^ (k % 8)) * 16) + (n % 8) * 2)],
                &h, 2);
  };
  for (int n = 0; n < 64; ++n) {
    put(0, n, 1.0f);
    put(1, n, static_cast<float>(64 * n));
  }
  Dev<uint16_t> da(a);
  Dev<int> di(a_idx);
  Dev<uint8_t> dimg(img);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> out(64 * 64);
  float* o = out.data();
  const uint16_t* ap = da.p;
  const int* ip = di.p;
  const uint8_t* bp = dimg.p;
  auto go = [&](RsBug bug) {
    return run("hopper_rs_kernel", 1, 128, 1024 + 2048, [=] { hopper_rs_kernel(o, ap, ip, bp, bug); });
  };
  auto wrong = [&] {
    int n = 0;
    for (int m = 0; m < 64; ++m)
      for (int c = 0; c < 64; ++c) n += out[static_cast<size_t>(m * 64 + c)] != static_cast<float>(m + 64 * c);
    return n;
  };
  const Result ok = go(RS_OK);
  REQUIRE_MESSAGE(ok.err == cudaSuccess, ok.detail);
  CHECK(wrong() == 0);
  // No swizzle reads the 8-k groups LBO (8192) apart, K-major B its 64 rows of 16 k values
  // 1024 bytes an 8-row group: either past the block's shared memory.
  for (const auto& [bug, what, expect] :
       {std::tuple{RS_A_WRITTEN, "A register rewritten before wait_group",
                   "(A from registers) was written before the wait_group that retires it"},
        std::tuple{RS_NO_TRANS, "imm-trans-b 0 on an MN-major B",
                   "its rows run past the block's dynamic shared memory"},
        std::tuple{RS_MN_NOSWIZZLE, "no-swizzle descriptor on a 128B-swizzled MN-major B",
                   "its rows run past the block's dynamic shared memory"}}) {
    Row r{what, ok, go(bug)};
    CHECK(r.mutant.err == cudaErrorLaunchFailure);
    CHECK(has(r.mutant.detail, expect));
    CHECK(has(r.mutant.detail, "mutation_test.cpp:"));
    report(r);
  }
  for (const auto& [bug, what] : {std::pair{RS_A_FRAGMENT, "A fragment registers 1 and 2 swapped"},
                                  std::pair{RS_A_HALVES, "A fragment elements swapped within each register"}}) {
    std::fill(out.begin(), out.end(), 0.0f);
    const Result r = go(bug);
    CHECK_MESSAGE(r.err == cudaSuccess, r.detail);
    const int bad = wrong();
    CHECK(bad > 0);
    MESSAGE(std::string(what) << " -> " << bad << " of 4096 elements of D wrong");
  }
}

// ----------------------------------------------------------------------------
// Named barriers: two warpgroups take turns as kernels/attention_hopper.cu's do
// (FlashAttention-3's ping-pong): warpgroup g waits at bar.sync 1 + g, 256 for its turn and
// ends it with bar.arrive 2 - g, 256; warpgroup 1 opens the first turn and skips the arrive
// after its last. In each turn every warp appends its warpgroup to out.
namespace {

enum TurnBug { TURN_OK, TURN_NOT_OPENED, TURN_EXTRA_ARRIVE, TURN_OWN_COUNT, TURN_WARP_SKIPS };

void turns_kernel(int* out, int* pos, TurnBug bug) {
  const unsigned t = threadIdx.x, g = t / 128;
  if (g == 1 && bug != TURN_NOT_OPENED) named_bar_arrive(1, 256);
  for (int r = 0; r < 4; ++r) {
    // TURN_OWN_COUNT: the count of the warpgroup's own threads, not of both warpgroups.
    if (!(bug == TURN_WARP_SKIPS && t / 32 == 5 && r == 2)) named_bar_sync(1 + g, bug == TURN_OWN_COUNT ? 128 : 256);
    __syncwarp();
    if (t % 32 == 0) out[(*pos)++] = static_cast<int>(g);
    __syncwarp();
    if (g == 0 || r < 3 || bug == TURN_EXTRA_ARRIVE) named_bar_arrive(2 - g, 256);
  }
}

}  // namespace

TEST_CASE("mutation: warpgroup turn-taking on named barriers (bar.sync / bar.arrive)") {
  std::vector<int> out(64, -1);
  int pos = 0;
  int *o = out.data(), *pp = &pos;
  auto go = [&](TurnBug bug) {
    pos = 0;
    std::fill(out.begin(), out.end(), -1);
    return run("turns_kernel", 1, 256, 0, [=] { turns_kernel(o, pp, bug); });
  };
  const Result ok = go(TURN_OK);
  REQUIRE_MESSAGE(ok.err == cudaSuccess, ok.detail);
  REQUIRE(pos == 32);
  for (int i = 0; i < 32; ++i) CHECK(out[static_cast<size_t>(i)] == (i / 4) % 2);  // 0,0,0,0,1,1,1,1,0,...
  struct Case {
    TurnBug bug;
    const char* what;
    std::vector<const char*> expect;  // one of them (which depends on the schedule)
  } cases[] = {
      {TURN_NOT_OPENED, "warpgroup 1 does not open the first turn", {"deadlock", "bar.sync"}},
      {TURN_EXTRA_ARRIVE, "warpgroup 1 arrives after its last turn", {"unbalanced"}},
      {TURN_OWN_COUNT,
       "bar.sync counts only its own warpgroup",
       {"must name the same count", "unbalanced", "deadlock"}},
      {TURN_WARP_SKIPS, "one warp skips a turn's bar.sync", {"deadlock", "must name the same count", "unbalanced"}},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    Row r{c.what, ok, go(c.bug)};
    CHECK(r.mutant.err == cudaErrorLaunchFailure);
    bool named = false;
    for (const char* e : c.expect) named = named || has(r.mutant.detail, e);
    CHECK(named);
    CHECK(has(r.mutant.detail, "mutation_test.cpp:"));
    report(r);
  }
}
