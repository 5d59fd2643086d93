// Tests of the CUDA execution engine's kernel executor: barriers, warp intrinsics,
// shared memory, the errors it reports where a GPU is undefined, memory faults, big
// grids and parallel_for. Kernels are called through kernel_run directly.
#include "engine.h"

#include <doctest/doctest.h>

#include <atomic>
#include <numeric>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

using cuda_emu::KernelLaunch;

namespace {

// ----------------------------------------------------------------------------
// Helpers.
struct Result {
  cudaError_t err;
  std::string detail;
  int launch_line;
};

template <typename F>
Result run(const char* name, dim3 grid, dim3 block, size_t smem, F body,
           std::source_location at = std::source_location::current()) {
  KernelLaunch k;
  k.name = name;
  k.file = at.file_name();
  k.line = static_cast<int>(at.line());
  k.grid = grid;
  k.block = block;
  k.dynamic_smem = smem;
  k.body = body;
  std::string detail;
  const cudaError_t e = cuda_emu::kernel_run(k, &detail);
  return Result{e, detail, k.line};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string at_line(int line) { return "kernel_exec_test.cpp:" + std::to_string(line); }

// Records the source line of the statement it wraps, for checking error reports.
#define AT_LINE(var, stmt)                            \
  do {                                                \
    (var).store(__LINE__, std::memory_order_relaxed); \
    stmt;                                             \
  } while (0)

unsigned linear_tid() { return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y; }

// ----------------------------------------------------------------------------
// Kernels.
__global__ void block_reduce_kernel(long long* out, const int* in) {
  __shared__ long long buf[1024];
  const unsigned n = blockDim.x * blockDim.y * blockDim.z, t = linear_tid();
  buf[t] = in[blockIdx.x * n + t];
  __syncthreads();
  for (unsigned s = n / 2; s > 0; s /= 2) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}

__global__ void vote_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x);
  out[t * 4 + 0] = __syncthreads_or(t == 77);
  out[t * 4 + 1] = __syncthreads_and(t < 1000);
  out[t * 4 + 2] = __syncthreads_and(t >= 0);
  out[t * 4 + 3] = __syncthreads_count(t % 3 == 0);
}

__global__ void shuffle_kernel(float* sum, float* bcast, int* up, int* down, int* seg, double* dsum) {
  const unsigned t = threadIdx.x, lane = t % 32, g = blockIdx.x * blockDim.x + t;
  float v = static_cast<float>(t);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[g] = v;
  bcast[g] = __shfl_sync(0xffffffffu, static_cast<float>(t) * 2.0f, 7);
  up[g] = __shfl_up_sync(0xffffffffu, static_cast<int>(t), 3);
  down[g] = __shfl_down_sync(0xffffffffu, static_cast<int>(t), 5);
  seg[g] = __shfl_sync(0xffffffffu, static_cast<int>(lane), 3, 16);  // lane 3 of each 16-lane segment
  double d = 1e10 + lane;
  for (int o = 8; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o, 16);
  dsum[g] = d;
}

__global__ void ballot_kernel(unsigned* out) {
  out[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 2 == 1);
  __syncwarp();
}

__global__ void shared_tag_kernel(unsigned* out) {
  __shared__ unsigned tag;
  __shared__ unsigned sum[64];
  if (threadIdx.x == 0) tag = blockIdx.x;
  __syncthreads();
  unsigned seen = tag;
  for (int round = 0; round < 4; ++round) {
    sum[threadIdx.x] = tag + threadIdx.x;
    __syncthreads();
    seen += sum[(threadIdx.x + 1) % blockDim.x] - tag - (threadIdx.x + 1) % blockDim.x;  // adds 0 unless corrupted
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = seen;
}

__global__ void dynamic_smem_kernel(int* out, int n) {
  auto* smem = static_cast<unsigned char*>(cuda_emu::dynamic_smem());
  const int t = static_cast<int>(threadIdx.x);
  int poisoned = 1;
  for (int i = t; i < n; i += blockDim.x) poisoned &= smem[i] == 0xff;
  poisoned = __syncthreads_and(poisoned);
  int* vals = reinterpret_cast<int*>(smem);
  vals[t] = t * 3;
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = vals[blockDim.x - 1 - t] + (poisoned ? 0 : 1000000);
  if (t == 0) out[gridDim.x * blockDim.x + blockIdx.x] = static_cast<int>(reinterpret_cast<uintptr_t>(smem) % 16);
}

__global__ void grid_stride_kernel(int* out, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] += 1;
}

__global__ void grid3d_kernel(int* out) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * blockDim.x + threadIdx.x] = static_cast<int>(blockIdx.x * 100 + blockIdx.y * 10 + blockIdx.z);
}

std::atomic<int> g_line_a{0}, g_line_b{0};

__global__ void exit_before_barrier_kernel() {
  if (threadIdx.x == 5) return;
  AT_LINE(g_line_a, __syncthreads());
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 16) AT_LINE(g_line_a, __syncthreads());
  else AT_LINE(g_line_b, __syncthreads());
}

__global__ void shuffle_exited_lane_kernel(float* out) {
  if (threadIdx.x == 3) return;
  float v = 1.0f;
  AT_LINE(g_line_a, v = __shfl_xor_sync(0xffffffffu, v, 1));
  out[threadIdx.x] = v;
}

__global__ void partial_warp_kernel(float* out) {
  float v = 1.0f;
  AT_LINE(g_line_a, v = __shfl_xor_sync(0xffffffffu, v, 1));
  out[threadIdx.x] = v;
}

__global__ void lane_not_in_mask_kernel() {
  if (threadIdx.x == 0) AT_LINE(g_line_a, __syncwarp(0xfffffffeu));
}

__global__ void mixed_intrinsics_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) AT_LINE(g_line_a, v = __shfl_xor_sync(0xffffffffu, v, 1));
  else AT_LINE(g_line_b, v = __shfl_down_sync(0xffffffffu, v, 1));
  out[threadIdx.x] = v;
}

__global__ void source_outside_mask_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  AT_LINE(g_line_a, out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 20));
}

__global__ void deadlock_kernel(int* out) {
  int v = 0;
  if (threadIdx.x == 0) AT_LINE(g_line_a, v = __shfl_sync(0xffffffffu, 1, 0));
  else AT_LINE(g_line_b, __syncthreads());
  out[threadIdx.x] = v;
}

__global__ void throw_free_kernel(int* out) { out[threadIdx.x] = 1; }

__global__ void overrun_kernel(float* p, int index) {
  if (threadIdx.x == 1) AT_LINE(g_line_a, p[index] = 1.0f);
}

__global__ void smem_overrun_kernel(int n) {
  auto* smem = static_cast<float*>(cuda_emu::dynamic_smem());
  if (threadIdx.x == 2) AT_LINE(g_line_a, smem[n + 4] = 1.0f);
}

}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE("barriers: a 1024-thread shared-memory tree reduction over 3-D blocks") {
  const dim3 block(8, 8, 16);
  const unsigned blocks = 6, n = 1024;
  std::vector<int> in(blocks * n);
  std::iota(in.begin(), in.end(), -1000);
  std::vector<long long> out(blocks, -1);
  const int* pin = in.data();
  long long* pout = out.data();
  const Result r = run("block_reduce_kernel", blocks, block, 0, [=] { block_reduce_kernel(pout, pin); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (unsigned b = 0; b < blocks; ++b) {
    long long want = 0;
    for (unsigned i = 0; i < n; ++i) want += in[b * n + i];
    CHECK(out[b] == want);
  }
}

TEST_CASE("barriers: __syncthreads_or / _and / _count") {
  std::vector<int> out(1024 * 4, -1);
  int* p = out.data();
  const Result r = run("vote_kernel", 1, 1024, 0, [=] { vote_kernel(p); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (int t = 0; t < 1024; ++t) {
    CHECK(out[t * 4 + 0] == 1);
    CHECK(out[t * 4 + 1] == 0);
    CHECK(out[t * 4 + 2] == 1);
    CHECK(out[t * 4 + 3] == 342);
  }
}

TEST_CASE("warp shuffles: xor butterfly, broadcast, up/down, width-16 segments, doubles") {
  const int n = 128;
  std::vector<float> sum(n), bcast(n);
  std::vector<int> up(n), down(n), seg(n);
  std::vector<double> dsum(n);
  float *ps = sum.data(), *pb = bcast.data();
  int *pu = up.data(), *pd = down.data(), *pg = seg.data();
  double* pds = dsum.data();
  const Result r = run("shuffle_kernel", 2, n / 2, 0, [=] { shuffle_kernel(ps, pb, pu, pd, pg, pds); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < n / 2; ++t) {
      const int i = b * n / 2 + t, lane = t % 32, warp0 = t - lane;
      float want = 0.0f;
      for (int l = 0; l < 32; ++l) want += static_cast<float>(warp0 + l);
      CHECK(sum[i] == want);
      CHECK(bcast[i] == static_cast<float>(warp0 + 7) * 2.0f);
      CHECK(up[i] == (lane >= 3 ? t - 3 : t));
      CHECK(down[i] == (lane + 5 < 32 ? t + 5 : t));
      CHECK(seg[i] == (lane < 16 ? 3 : 19));
      double dwant = 0.0;
      for (int l = lane & 16; l < (lane & 16) + 16; ++l) dwant += 1e10 + l;
      CHECK(dsum[i] == dwant);
    }
  }
}

TEST_CASE("warp vote: __ballot_sync and __syncwarp") {
  std::vector<unsigned> out(64);
  unsigned* p = out.data();
  const Result r = run("ballot_kernel", 1, 64, 0, [=] { ballot_kernel(p); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (unsigned v : out) CHECK(v == 0xaaaaaaaau);
}

TEST_CASE("static __shared__ is per block across many concurrently running blocks") {
  const unsigned blocks = 3000, threads = 64;
  std::vector<unsigned> out(blocks * threads);
  unsigned* p = out.data();
  const Result r = run("shared_tag_kernel", blocks, threads, 0, [=] { shared_tag_kernel(p); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) CHECK(out[b * threads + t] == b);
}

TEST_CASE("dynamic shared memory: sized by the launch, 16-byte aligned, poisoned at block start") {
  const unsigned blocks = 40, threads = 256;
  const int bytes = 5000;
  std::vector<int> out(blocks * threads + blocks, -1);
  int* p = out.data();
  const Result r = run("dynamic_smem_kernel", blocks, threads, bytes, [=] { dynamic_smem_kernel(p, bytes); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) CHECK(out[b * threads + t] == static_cast<int>(threads - 1 - t) * 3);
    CHECK(out[blocks * threads + b] == 0);
  }
}

TEST_CASE("a 70000-block grid runs every block once") {
  const size_t blocks = 70000, threads = 32, n = blocks * threads * 2 + 17;
  std::vector<int> out(n, 0);
  int* p = out.data();
  const Result r = run("grid_stride_kernel", static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0,
                       [=] { grid_stride_kernel(p, n); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  size_t wrong = 0;
  for (int v : out) wrong += v != 1;
  CHECK(wrong == 0);
}

TEST_CASE("3-D grids: blockIdx and gridDim") {
  const dim3 grid(3, 4, 5);
  std::vector<int> out(60 * 2, -1);
  int* p = out.data();
  const Result r = run("grid3d_kernel", grid, 2, 0, [=] { grid3d_kernel(p); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (unsigned z = 0; z < 5; ++z)
    for (unsigned y = 0; y < 4; ++y)
      for (unsigned x = 0; x < 3; ++x)
        for (unsigned t = 0; t < 2; ++t)
          CHECK(out[(x + 3 * (y + 4 * z)) * 2 + t] == static_cast<int>(x * 100 + y * 10 + z));
}

// ----------------------------------------------------------------------------
TEST_CASE("error: a thread exits while the others wait at a barrier") {
  const Result r = run("exit_before_barrier_kernel", 2, 64, 0, [] { exit_before_barrier_kernel(); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, "exit_before_barrier_kernel"));
  CHECK(has(r.detail, at_line(r.launch_line)));
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, "thread (5,0,0)"));
  CHECK(has(r.detail, "exited"));
}

TEST_CASE("error: threads wait at barriers on different lines") {
  const Result r = run("divergent_barrier_kernel", 1, 32, 0, [] { divergent_barrier_kernel(); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, "divergent_barrier_kernel"));
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, at_line(g_line_b)));
}

TEST_CASE("error: a shuffle mask names an exited lane") {
  std::vector<float> out(32);
  float* p = out.data();
  const Result r = run("shuffle_exited_lane_kernel", 1, 32, 0, [=] { shuffle_exited_lane_kernel(p); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, "shuffle_exited_lane_kernel"));
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, "exited"));
}

TEST_CASE("error: a full mask in a partial last warp") {
  std::vector<float> out(48);
  float* p = out.data();
  const Result r = run("partial_warp_kernel", 1, 48, 0, [=] { partial_warp_kernel(p); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, "lanes 16-31 that do not exist"));
}

TEST_CASE("error: the calling lane is not in its mask") {
  const Result r = run("lane_not_in_mask_kernel", 1, 32, 0, [] { lane_not_in_mask_kernel(); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, "does not include its lane"));
}

TEST_CASE("error: lanes of one mask at different intrinsics") {
  std::vector<int> out(32);
  int* p = out.data();
  const Result r = run("mixed_intrinsics_kernel", 1, 32, 0, [=] { mixed_intrinsics_kernel(p); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, at_line(g_line_b)));
  CHECK(has(r.detail, "different warp intrinsics"));
}

TEST_CASE("error: a shuffle reads a lane outside its mask") {
  std::vector<int> out(32);
  int* p = out.data();
  const Result r = run("source_outside_mask_kernel", 1, 32, 0, [=] { source_outside_mask_kernel(p); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, "reads lane 20"));
}

TEST_CASE("error: deadlock between a warp shuffle and a barrier") {
  std::vector<int> out(64);
  int* p = out.data();
  const Result r = run("deadlock_kernel", 1, 64, 0, [=] { deadlock_kernel(p); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, "deadlock"));
  CHECK(has(r.detail, "deadlock_kernel"));
  CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(has(r.detail, at_line(g_line_b)));
}

TEST_CASE("the executor keeps working after failed launches") {
  std::vector<int> out(256, 0);
  int* p = out.data();
  const Result r = run("throw_free_kernel", 1, 256, 0, [=] { throw_free_kernel(p); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  for (int v : out) CHECK(v == 1);
}

// ----------------------------------------------------------------------------
TEST_CASE("fault: a write past the end of a cudaMalloc allocation") {
  float* buf = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), 4096) == cudaSuccess);
  const Result r = run("overrun_kernel", 1, 32, 0, [=] { overrun_kernel(buf, 1024 + 100); });
  CHECK(r.err == cudaErrorIllegalAddress);
  CHECK(has(r.detail, "overrun_kernel"));
  CHECK(has(r.detail, at_line(r.launch_line)));
  CHECK(has(r.detail, "thread (1,0,0)"));
  CHECK(has(r.detail, "wrote"));
  CHECK(has(r.detail, "offset 4496 of a 4096-byte allocation"));
  CHECK(has(r.detail, "400 bytes past its end"));
  // addr2line names the faulting line when the test is built with debug info.
  MESSAGE(r.detail);
  if (has(r.detail, "kernel_exec_test.cpp:")) CHECK(has(r.detail, at_line(g_line_a)));
  CHECK(cudaFree(buf) == cudaSuccess);
  cuda_emu::test_clear_errors();
}

TEST_CASE("fault: an overrun of dynamic shared memory") {
  const int n = 1000;  // floats
  const Result r = run("smem_overrun_kernel", 3, 32, n * sizeof(float), [=] { smem_overrun_kernel(n); });
  CHECK(r.err == cudaErrorIllegalAddress);
  CHECK(has(r.detail, "smem_overrun_kernel"));
  CHECK(has(r.detail, "thread (2,0,0)"));
  CHECK(has(r.detail, "offset 4016 of 4000 bytes of dynamic shared memory"));
  // The guard page is closed again: a correct launch on the same workers still passes.
  std::vector<int> out(256 * 4 + 4);
  int* p = out.data();
  const Result ok = run("dynamic_smem_kernel", 4, 256, 4000, [=] { dynamic_smem_kernel(p, 4000); });
  CHECK_MESSAGE(ok.err == cudaSuccess, ok.detail);
}

// ----------------------------------------------------------------------------
TEST_CASE("parallel_for covers [0, n) once, nested and from several threads") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{100000}}) {
    std::vector<std::atomic<int>> hits(n);
    cuda_emu::parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (auto& h : hits) CHECK(h.load() == 1);
  }
  std::atomic<long long> total{0};
  cuda_emu::parallel_for(8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      cuda_emu::parallel_for(1000, [&](size_t b2, size_t e2) { total += static_cast<long long>(e2 - b2); });
  });
  CHECK(total.load() == 8000);
  std::atomic<long long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        cuda_emu::parallel_for(5000, [&](size_t b, size_t e) {
          long long s = 0;
          for (size_t i = b; i < e; ++i) s += static_cast<long long>(i);
          sum += s;
        });
    });
  for (auto& t : callers) t.join();
  CHECK(sum.load() == 3LL * 20 * (4999LL * 5000 / 2));
}

TEST_CASE("kernels from several host threads at once") {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 5; ++rep) {
        const unsigned blocks = 200, threads = 64;
        std::vector<unsigned> out(blocks * threads);
        unsigned* p = out.data();
        const Result r = run("shared_tag_kernel", blocks, threads, 0, [=] { shared_tag_kernel(p); });
        if (r.err != cudaSuccess) ++failures;
        for (unsigned b = 0; b < blocks; ++b)
          for (unsigned t = 0; t < threads; ++t) failures += out[b * threads + t] != b;
      }
    });
  for (auto& t : callers) t.join();
  CHECK(failures.load() == 0);
}

// ----------------------------------------------------------------------------
// Named barriers: bar.sync / bar.arrive id, count (kernel_namedbar.cpp).
#define NB_SYNC(id, n) ::cuda_emu::named_barrier_sync(__FILE__, __LINE__, (id), (n))
#define NB_ARRIVE(id, n) ::cuda_emu::named_barrier_arrive(__FILE__, __LINE__, (id), (n))

namespace {

// Two 128-thread groups take `rounds` turns each, strictly alternating: group g waits at
// barrier 1 + g for its turn and ends it by arriving at the other group's barrier (both
// barriers count 256: one group's bar.sync and the other's bar.arrive). Group 1 opens
// group 0's first turn. In its turn every warp of the group appends its group to `log`
// once, after a warp-level sync (a scheduling point). `balanced`: group 1 skips the arrive
// after its last turn, which no turn of group 0 would consume.
void turns_kernel(int* log, int* pos, int rounds, bool balanced) {
  const unsigned t = threadIdx.x, g = t / 128;
  if (g == 1) NB_ARRIVE(1, 256);
  for (int r = 0; r < rounds; ++r) {
    NB_SYNC(1 + g, 256);
    __syncwarp();
    if (t % 32 == 0) log[(*pos)++] = static_cast<int>(g);
    __syncwarp();
    if (!balanced || g == 0 || r + 1 < rounds) NB_ARRIVE(2 - g, 256);
  }
}

}  // namespace

TEST_CASE("named barriers: two warpgroups take strict turns with bar.sync / bar.arrive") {
  const int rounds = 6;
  std::vector<int> log(2 * rounds * 4, -1);
  int pos = 0;
  int *p = log.data(), *ppos = &pos;
  const Result r = run("turns_kernel", 1, 256, 0, [=] { turns_kernel(p, ppos, rounds, true); });
  REQUIRE_MESSAGE(r.err == cudaSuccess, r.detail);
  REQUIRE(pos == 2 * rounds * 4);
  // Each turn is one group's 4 warps, in turn order 0, 1, 0, 1, ...
  for (int i = 0; i < pos; ++i) CHECK(log[i] == (i / 4) % 2);
}

TEST_CASE("named barriers: a phase left partly arrived fails the block at its end") {
  std::vector<int> log(64, -1);
  int pos = 0;
  int *p = log.data(), *ppos = &pos;
  const Result r = run("turns_kernel", 1, 256, 0, [=] { turns_kernel(p, ppos, 3, false); });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, "the block exits with 128 of 256 threads arrived at barrier 1"));
  CHECK(has(r.detail, "unbalanced"));
}

TEST_CASE("named barriers: a bar.sync nobody completes is a deadlock naming the barrier") {
  int line = 0;
  int* pl = &line;
  const Result r = run("nbar_deadlock_kernel", 1, 256, 0, [=] {
    if (threadIdx.x < 128) {
      *pl = __LINE__ + 1;
      NB_SYNC(3, 256);
    }
  });
  CHECK(r.err == cudaErrorLaunchFailure);
  CHECK(has(r.detail, "deadlock"));
  INFO(r.detail);
  CHECK(has(r.detail, "wait at bar.sync at "));
  CHECK(has(r.detail, at_line(line) + " (barrier 3"));
  CHECK(has(r.detail, "barrier 3, count 256: 128 of 256 threads arrived"));
}

TEST_CASE("named barriers: misuse fails the launch naming the call site") {
  struct Case {
    const char* name;
    unsigned threads;
    int kind;
    const char* expect;
  };
  const Case cases[] = {
      {"barrier 0", 64, 0, "barrier 0 is the one __syncthreads uses"},
      {"barrier 16", 64, 1, "barrier id 16 (a block has barriers 0-15)"},
      {"count 48", 64, 2, "thread count 48 (must be a non-zero multiple of 32"},
      {"count past the block", 64, 3, "thread count 96"},
      {"lanes at different barriers", 64, 4, "other lanes of its warp wait at bar.sync"},
      {"warps with different counts", 96, 5, "threads; warps arriving at one phase must name the same count"},
      {"lanes diverge and some exit", 64, 6, "exited"},
      {"a partial warp", 48, 7, "is a partial warp"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    int line = 0;
    int* pl = &line;
    const int kind = c.kind;
    const Result r = run("nbar_misuse_kernel", 1, c.threads, 0, [=] {
#define NB_SYNC_AT(id, n) (*pl = __LINE__, NB_SYNC(id, n))
      const unsigned t = threadIdx.x;
      switch (kind) {
        case 0: NB_SYNC_AT(0, 64); break;
        case 1: NB_SYNC_AT(16, 64); break;
        case 2: NB_SYNC_AT(1, 48); break;
        case 3: NB_SYNC_AT(1, 96); break;
        case 4: NB_SYNC_AT(t % 32 < 16 ? 1 : 2, 64); break;
        case 5: NB_SYNC_AT(1, t < 32 ? 64 : 96); break;
        case 6:
          if (t % 32 < 16) NB_SYNC_AT(1, 64);
          break;
        default: NB_SYNC_AT(1, 32); break;
      }
#undef NB_SYNC_AT
    });
    INFO(r.detail);
    CHECK(r.err == cudaErrorLaunchFailure);
    CHECK(has(r.detail, c.expect));
    CHECK(has(r.detail, at_line(line)));
  }
}
