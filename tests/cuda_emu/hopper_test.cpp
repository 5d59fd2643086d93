// Tests of the CUDA execution engine's sm_90 instructions through kernels/hopper.cuh:
// mbarrier phases, arrivals and tx-count with the 1D bulk copy (bytes land when the phase
// completes, not before), wgmma m64nNk16 with no-swizzle and 128B-swizzle descriptors
// against a host fp32 product, and the misuse the engine reports where a GPU is undefined
// or hangs. On a device profile below compute capability 9.0 (ctest runs this suite again
// with CUDA_EMU_DEVICE=a100) every case checks that the instruction fails the launch; on
// the b200's 10.0 (CUDA_EMU_DEVICE=b200) the wgmma cases must (wgmma is sm_90a only).
#include "device_profile.h"
#include "engine.h"
#include "kernels/hopper.cuh"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

using namespace dtrain::kernels::detail;

namespace {

struct Result {
  cudaError_t err;
  std::string detail;
};

template <typename F>
Result run(dim3 block, size_t smem, F body, std::source_location at = std::source_location::current()) {
  cuda_emu::KernelLaunch k;
  k.name = "hopper_kernel";
  k.file = at.file_name();
  k.line = static_cast<int>(at.line());
  k.grid = dim3(1);
  k.block = block;
  k.dynamic_smem = smem;
  k.body = body;
  std::string detail;
  const cudaError_t e = cuda_emu::kernel_run(k, &detail);
  return Result{e, detail};
}

bool sm90() { return cuda_emu::rt::device_profile()->major >= 9; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
// The source line of this file that the engine's report names contains `code` (the call
// site: checked against the file itself, so formatting cannot break it).
bool names_line(const std::string& detail, const std::string& code) {
  const std::string key = "hopper_test.cpp:";
  for (size_t at = detail.find(key); at != std::string::npos; at = detail.find(key, at + 1)) {
    const int line = std::atoi(detail.c_str() + at + key.size());
    std::ifstream f(HOPPER_TEST_SOURCE);
    std::string text;
    for (int i = 0; i < line && std::getline(f, text); ++i) {
    }
    if (text.find(code) != std::string::npos) return true;
  }
  return false;
}

// wgmma is sm_90a: compute capability 9.0 only.
bool sm90a() {
  const auto* p = cuda_emu::rt::device_profile();
  return p->major == 9 && p->minor == 0;
}

// A launch that works on sm_90 (`ok`) must fail with an illegal instruction elsewhere.
void check_runs(const Result& r, bool ok) {
  INFO(r.detail);
  if (ok) {
    REQUIRE(r.err == cudaSuccess);
  } else {
    CHECK(r.err == cudaErrorIllegalInstruction);
    CHECK(has(r.detail, "but the device is"));
    CHECK(has(r.detail, "a GPU raises an illegal instruction"));
  }
}
#define CHECK_RUNS(r) check_runs((r), sm90())
#define CHECK_RUNS_A(r) check_runs((r), sm90a())

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n;
  explicit Dev(size_t count) : n(count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)) == cudaSuccess);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // kernel_run reads it outside the stream
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

uint64_t* smem_bar(size_t offset = 0) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(cuda_emu::dynamic_smem()) + offset);
}
void wait_phase(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Thread 0 initialises the barrier at smem offset 0 with `count` and fences; all sync.
void init_bar(uint32_t count, bool fence = true) {
  if (threadIdx.x == 0) {
    mbarrier_init(smem_bar(), count);
    if (fence) fence_mbarrier_init();
  }
  __syncthreads();
}

// A misuse launch: on sm_90 it fails with e, its report says `part` and names the source
// line holding `code` (when given); below 9.0 the first sm_90 instruction fails it.
void expect(const Result& r, const std::string& part, const std::string& code, cudaError_t e = cudaErrorLaunchFailure) {
  INFO(r.detail);
  if (!sm90()) {
    CHECK(r.err == cudaErrorIllegalInstruction);
    return;
  }
  CHECK(r.err == e);
  CHECK(has(r.detail, part));
  if (!code.empty()) CHECK(names_line(r.detail, code));
}

// ----------------------------------------------------------------------------
TEST_CASE("mbarrier and bulk copy: bytes land when the phase completes, the parity flips each phase") {
  const int n = 4 * 64;  // four phases of 64 floats
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f - 3.0f;
  Dev<float> src(h), out(n);
  float* s = src.p;
  float* o = out.p;
  CHECK_RUNS(run(dim3(64), 16 + 256, [=] {
    init_bar(1);
    float* buf = reinterpret_cast<float*>(static_cast<char*>(cuda_emu::dynamic_smem()) + 16);
    for (uint32_t phase = 0; phase < 4; ++phase) {
      if (threadIdx.x == 0) {
        // Issued before the arrival: the phase stays open (reading the destination now
        // fails the launch, below).
        bulk_copy_g2s(buf, s + 64 * phase, 128, smem_bar());
        bulk_copy_g2s(buf + 32, s + 64 * phase + 32, 128, smem_bar());
        mbarrier_arrive_expect_tx(smem_bar(), 256);
      }
      wait_phase(smem_bar(), phase & 1u);
      o[64 * phase + threadIdx.x] = buf[threadIdx.x];
      __syncthreads();
    }
  }));
  if (!sm90()) return;
  CHECK(out.get() == h);
}

TEST_CASE("mbarrier.try_wait: false before the phase completes (once, then it suspends), true after") {
  Dev<unsigned> answers(3);
  unsigned* a = answers.p;
  CHECK_RUNS(run(dim3(64), 16, [=] {
    init_bar(1);
    if (threadIdx.x == 32) a[0] = mbarrier_try_wait_parity(smem_bar(), 0);  // nobody arrived yet
    if (threadIdx.x == 33) a[1] = mbarrier_try_wait_parity(smem_bar(), 1);  // the phase before phase 0
    __syncthreads();
    if (threadIdx.x == 0) mbarrier_arrive(smem_bar());
    wait_phase(smem_bar(), 0);
    if (threadIdx.x == 32) a[2] = mbarrier_try_wait_parity(smem_bar(), 0);
  }));
  if (!sm90()) return;
  CHECK(answers.get() == std::vector<unsigned>{0u, 1u, 1u});
}

TEST_CASE("bulk copy under the racecheck: the landed bytes replace earlier stores for the waiters") {
  // Warp 1 stores into the buffer, hands it over through barrier A; thread 0 refills it by a
  // bulk copy on barrier B, and every thread reads it after B's phase. All in one barrier
  // interval: the copy's bytes, not warp 1's stores, are what the readers see.
  std::vector<float> h(32);
  for (int i = 0; i < 32; ++i) h[static_cast<size_t>(i)] = static_cast<float>(i) + 0.25f;
  Dev<float> src(h), out(64);
  float* s = src.p;
  float* o = out.p;
  CHECK_RUNS(run(dim3(64), 16 + 128, [=] {
    float* buf = reinterpret_cast<float*>(smem_bar(16));
    if (threadIdx.x == 0) {
      mbarrier_init(smem_bar(0), 32);
      mbarrier_init(smem_bar(8), 1);
      fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x >= 32) {
      buf[threadIdx.x - 32] = -1.0f;
      fence_proxy_async();
      mbarrier_arrive(smem_bar(0));
    }
    if (threadIdx.x == 0) {
      wait_phase(smem_bar(0), 0);
      mbarrier_arrive_expect_tx(smem_bar(8), 128);
      bulk_copy_g2s(buf, s, 128, smem_bar(8));
    }
    wait_phase(smem_bar(8), 0);
    o[threadIdx.x] = buf[threadIdx.x % 32];
  }));
  if (!sm90()) return;
  const auto v = out.get();
  for (int i = 0; i < 64; ++i) CHECK(v[static_cast<size_t>(i)] == h[static_cast<size_t>(i % 32)]);
}

TEST_CASE("mbarrier: arrivals by many threads complete a phase; arrive returns the phase's state") {
  Dev<unsigned long long> st(2 * 128);
  unsigned long long* s = st.p;
  CHECK_RUNS(run(dim3(128), 16, [=] {
    init_bar(128);
    for (uint32_t phase = 0; phase < 2; ++phase) {
      s[phase * 128 + threadIdx.x] = mbarrier_arrive(smem_bar());
      wait_phase(smem_bar(), phase & 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) mbarrier_inval(smem_bar());
  }));
  if (!sm90()) return;
  const auto v = st.get();
  for (int i = 1; i < 128; ++i) CHECK(v[static_cast<size_t>(i)] == v[0]);
  CHECK(v[128] != v[0]);  // another phase
}

TEST_CASE("mbarrier misuse: placement, init, arrivals, tx-count, fences, bulk operands, exits") {
  Dev<float> src(64);
  float* s = src.p;
  expect(run(dim3(32), 16, [] { mbarrier_init(smem_bar(4), 1); }), "is not 8-byte aligned", "mbarrier_init(smem_bar(4)",
         cudaErrorMisalignedAddress);
  expect(run(dim3(32), 16, [=] { mbarrier_init(reinterpret_cast<uint64_t*>(s), 1); }), "is in global memory",
         "mbarrier_init(reinterpret_cast", cudaErrorIllegalAddress);
  expect(run(dim3(32), 16, [] { mbarrier_arrive(smem_bar()); }), "is used before mbarrier.init",
         "mbarrier_arrive(smem_bar())");
  expect(run(dim3(1), 16,
             [] {
               init_bar(1);
               mbarrier_arrive_expect_tx(smem_bar(), 16);
               mbarrier_arrive(smem_bar());
             }),
         "one arrival more than the count", "mbarrier_arrive(smem_bar())");
  expect(run(dim3(1), 16,
             [] {
               init_bar(2);
               mbarrier_arrive_expect_tx(smem_bar(), 1u << 20);
             }),
         "tx-count leaves the PTX ISA's range", "mbarrier_arrive_expect_tx(smem_bar(), 1u << 20)");
  expect(run(dim3(1), 16 + 64,
             [=] {
               init_bar(1);
               bulk_copy_g2s(smem_bar(16), s, 64, smem_bar());
               mbarrier_arrive_expect_tx(smem_bar(), 48);
               wait_phase(smem_bar(), 0);
             }),
         "bytes more than expect_tx announced", "mbarrier_try_wait_parity");
  // Too few bytes: the phase never completes and every thread waits on it.
  expect(run(dim3(64), 16 + 64,
             [=] {
               init_bar(1);
               if (threadIdx.x == 0) {
                 mbarrier_arrive_expect_tx(smem_bar(), 80);
                 bulk_copy_g2s(smem_bar(16), s, 64, smem_bar());
               }
               wait_phase(smem_bar(), 0);
             }),
         "deadlock", "");
  {
    const Result r = run(dim3(64), 16 + 64, [=] {
      init_bar(1);
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(smem_bar(), 80);
        bulk_copy_g2s(smem_bar(16), s, 64, smem_bar());
      }
      wait_phase(smem_bar(), 0);
    });
    if (sm90()) {
      CHECK(has(r.detail, "64 thread(s) wait at mbarrier.try_wait.parity"));
      CHECK(has(r.detail, "waits for the phase of parity 0: phase 0, 0 of 1 arrivals pending, tx-count 16"));
    }
  }
  expect(run(dim3(1), 16 + 64,
             [=] {
               mbarrier_init(smem_bar(), 1);
               bulk_copy_g2s(smem_bar(16), s, 64, smem_bar());
             }),
         "ran no fence.mbarrier_init", "bulk_copy_g2s");
  expect(run(dim3(1), 16 + 64,
             [=] {
               init_bar(1);
               bulk_copy_g2s(smem_bar(16), s + 1, 64, smem_bar());
             }),
         "is not 16-byte aligned", "bulk_copy_g2s(smem_bar(16), s + 1", cudaErrorMisalignedAddress);
  expect(run(dim3(1), 16 + 64, [=] { init_bar(1), bulk_copy_g2s(smem_bar(16), s, 40, smem_bar()); }),
         "is not a non-zero multiple of 16", "bulk_copy_g2s");
  expect(run(dim3(1), 16 + 256, [=] { init_bar(1), bulk_copy_g2s(smem_bar(16), s + 32, 256, smem_bar()); }),
         "is not device memory", "bulk_copy_g2s", cudaErrorIllegalAddress);
  std::vector<float> host(64);
  float* hp = host.data();
  expect(run(dim3(1), 16 + 64, [=] { init_bar(1), bulk_copy_g2s(smem_bar(16), hp, 64, smem_bar()); }),
         "is not device memory", "bulk_copy_g2s", cudaErrorIllegalAddress);
  expect(run(dim3(1), 16 + 64, [=] { init_bar(1), bulk_copy_g2s(smem_bar(32), s, 64, smem_bar()); }),
         "runs past the end", "bulk_copy_g2s", cudaErrorIllegalAddress);
  expect(run(dim3(1), 16 + 64,
             [=] {
               init_bar(1);
               bulk_copy_g2s(smem_bar(16), s, 64, smem_bar());
               bulk_copy_g2s(smem_bar(48), s, 32, smem_bar());
             }),
         "overlaps that of the bulk copy", "bulk_copy_g2s(smem_bar(48)");
  expect(run(dim3(1), 16 + 64, [=] { init_bar(1), bulk_copy_g2s(smem_bar(16), s, 64, smem_bar()); }),
         "the block exits with the bulk copy issued at", "");
  // Under the racecheck (this file is compiled with it) a load of a destination in flight.
  expect(run(dim3(1), 16 + 64,
             [=] {
               init_bar(1);
               mbarrier_arrive_expect_tx(smem_bar(), 64);
               bulk_copy_g2s(smem_bar(16), s, 64, smem_bar());
               volatile float* early = reinterpret_cast<float*>(smem_bar(24));
               (void)*early;
               wait_phase(smem_bar(), 0);
             }),
         "reads shared offset 24 at", "(void)*early");
  expect(run(dim3(1), 16,
             [] {
               init_bar(1);
               *smem_bar() = 0;
               mbarrier_arrive(smem_bar());
             }),
         "was overwritten by an ordinary store", "mbarrier_arrive(smem_bar())");
  expect(run(dim3(1), 16, [] { init_bar(1), mbarrier_init(smem_bar(), 1); }), "is live: mbarrier.inval it",
         "mbarrier_init(smem_bar(), 1)");
  expect(run(dim3(1), 16, [] { init_bar(1), mbarrier_try_wait_parity(smem_bar(), 2); }), "must be 0 or 1",
         "mbarrier_try_wait_parity");
}

// ----------------------------------------------------------------------------
// wgmma. Host side: operands placed in the K-major layouts of kernels/hopper.cuh.
float host_round(float x, bool bf) {
  if (bf) return __bfloat162float(__float2bfloat16_rn(x));
  return __half2float(__float2half_rn(x));
}
uint16_t host_bits(float x, bool bf) {
  return bf ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}
// Byte offset of element (r, k) of a rows x K operand (K a multiple of 16; 64 with 128B).
size_t place(int r, int k, bool swz, int rows) {
  if (swz) return static_cast<size_t>((r / 8) * 1024 + (r % 8) * 128 + (((k / 8) ^ (r % 8)) * 16) + (k % 8) * 2);
  // no swizzle: per k16 slice s, core matrices (r / 8, c) at (r / 8) 256 + c 128, slices
  // after one another (rows / 8 * 256 bytes each)
  return static_cast<size_t>((k / 16) * (rows / 8) * 256 + (r / 8) * 256 + ((k % 16) / 8) * 128 + (r % 8) * 16 +
                             (k % 8) * 2);
}

struct Gemm {
  int n, k;
  bool swz, bf;
};

// D (64 x n) = A (64 x k) B^T (n x k) with the operands staged by the host in shared memory
// through one bulk copy, k / 16 wgmma per group. Returns the launch result; d is 64 x n.
template <typename T, int N>
Result gemm_run(const Gemm& g, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& d) {
  const size_t abytes = 64 * static_cast<size_t>(g.k) * 2, bbytes = static_cast<size_t>(N) * g.k * 2;
  std::vector<uint8_t> stage(abytes + bbytes);
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < g.k; ++k) {
      const uint16_t h = host_bits(a[static_cast<size_t>(r * g.k + k)], g.bf);
      std::memcpy(&stage[place(r, k, g.swz, 64)], &h, 2);
    }
  for (int r = 0; r < N; ++r)
    for (int k = 0; k < g.k; ++k) {
      const uint16_t h = host_bits(b[static_cast<size_t>(r * g.k + k)], g.bf);
      std::memcpy(&stage[abytes + place(r, k, g.swz, N)], &h, 2);
    }
  Dev<uint8_t> src(stage);
  Dev<float> out(64 * static_cast<size_t>(N));
  const uint8_t* sp = src.p;
  float* op = out.p;
  const Gemm gg = g;
  const Result r = run(dim3(128), 1024 + stage.size(), [=] {
    char* base = static_cast<char*>(cuda_emu::dynamic_smem()) + 1024;  // 1024-byte aligned offset
    init_bar(1);
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(smem_bar(), static_cast<uint32_t>(abytes + bbytes));
      bulk_copy_g2s(base, sp, static_cast<uint32_t>(abytes + bbytes), smem_bar());
    }
    wait_phase(smem_bar(), 0);
    float acc[N / 2];
    wgmma_fence();
    for (int s = 0; s < gg.k / 16; ++s) {
      const WgmmaSwizzle sw = gg.swz ? WgmmaSwizzle::B128 : WgmmaSwizzle::NONE;
      const size_t step_a = gg.swz ? 32u * s : static_cast<size_t>(s) * 8 * 256;
      const size_t step_b = gg.swz ? 32u * s : static_cast<size_t>(s) * (N / 8) * 256;
      const uint64_t ad = wgmma_desc(base + step_a, 128, gg.swz ? 1024 : 256, sw);
      const uint64_t bd = wgmma_desc(base + abytes + step_b, 128, gg.swz ? 1024 : 256, sw);
      wgmma_m64k16<T, N>(acc, ad, bd, s > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    const unsigned t = threadIdx.x, w = t / 32, gq = (t % 32) / 4, q = t % 4;
    for (int i = 0; i < N / 2; ++i)
      op[(16 * w + gq + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * q + (i & 1)] = acc[i];
  });
  if (r.err == cudaSuccess) d = out.get();
  return r;
}

template <typename T, int N>
void gemm_check(bool swz, int k) {
  const bool bf = std::is_same_v<T, __nv_bfloat16>;
  std::mt19937 rng(static_cast<unsigned>(N * 7 + k + swz));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> a(64 * static_cast<size_t>(k)), b(static_cast<size_t>(N) * k), d;
  for (auto& x : a) x = host_round(u(rng), bf);
  for (auto& x : b) x = host_round(u(rng), bf);
  CAPTURE(N);
  CAPTURE(k);
  CAPTURE(swz);
  CAPTURE(bf);
  CHECK_RUNS_A((gemm_run<T, N>(Gemm{N, k, swz, bf}, a, b, d)));
  if (!sm90a()) return;
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int kk = 0; kk < k; ++kk)
        ref += static_cast<double>(a[static_cast<size_t>(r * k + kk)]) * b[static_cast<size_t>(n * k + kk)];
      const float got = d[static_cast<size_t>(r * N + n)];
      REQUIRE(std::fabs(got - ref) <= 1e-5 * (1 + std::fabs(ref)) * k);
    }
}

TEST_CASE("wgmma m64nNk16: bf16 and f16, N 64/128/256, no swizzle and 128B swizzle, chained over K") {
  gemm_check<__nv_bfloat16, 64>(false, 16);
  gemm_check<__nv_bfloat16, 64>(true, 64);
  gemm_check<__half, 64>(false, 32);
  gemm_check<__half, 128>(true, 64);
  gemm_check<__nv_bfloat16, 128>(false, 16);
  gemm_check<__nv_bfloat16, 256>(true, 64);
  gemm_check<__half, 256>(false, 16);
}
}  // namespace

// ----------------------------------------------------------------------------
// wgmma misuse: one small m64n64k16 kernel (no swizzle, operands filled by the threads
// themselves), each `bug` breaks one rule.
enum WgBug {
  WG_OK,
  WG_NO_FENCE,
  WG_WARP_ELSEWHERE,
  WG_ACC_WRITE,
  WG_SMEM_WRITE,
  WG_SWIZZLE_64B,
  WG_NO_WAIT,
  WG_DESC_DIFFERS
};

Result wg_run(WgBug bug, float* out, unsigned threads = 128) {
  return run(dim3(threads), 2048 + 8192, [=] {
    char* base = static_cast<char*>(cuda_emu::dynamic_smem());
    auto* h = reinterpret_cast<uint16_t*>(base);  // A (64x16) then B (64x16), no swizzle
    for (unsigned i = threadIdx.x; i < 2 * 64 * 16; i += blockDim.x) h[i] = 0x3f80;  // bf16 1.0
    fence_proxy_async();
    __syncthreads();
    float acc[32];
    for (float& x : acc) x = 0.5f;
    if (bug != WG_NO_FENCE) wgmma_fence();
    uint64_t bd = wgmma_desc(base + 2048, 128, 256, bug == WG_SWIZZLE_64B ? WgmmaSwizzle::B64 : WgmmaSwizzle::NONE);
    if (bug == WG_DESC_DIFFERS && threadIdx.x == 77) bd += 1;
    if (bug == WG_WARP_ELSEWHERE && threadIdx.x / 32 == 3) {
      wgmma_commit();
    } else {
      wgmma_m64k16<__nv_bfloat16, 64>(acc, wgmma_desc(base, 128, 256, WgmmaSwizzle::NONE), bd, true);
      wgmma_commit();
    }
    if (bug == WG_ACC_WRITE && threadIdx.x == 5) acc[3] = 1.0f;
    if (bug == WG_SMEM_WRITE && threadIdx.x == 0) h[17] = 0;
    out[threadIdx.x] = acc[0];  // before the wait: the engine's NaN tag
    if (bug != WG_NO_WAIT) wgmma_wait<0>();
    out[128 + threadIdx.x] = acc[0];
  });
}

TEST_CASE("wgmma misuse: fence, warpgroup, accumulators and shared memory before the wait, descriptors") {
  Dev<float> out(256);
  float* o = out.p;
  CHECK_RUNS_A(wg_run(WG_OK, o));
  if (!sm90a()) return;
  const auto v = out.get();
  CHECK(std::isnan(v[0]));        // read before wait_group
  CHECK(v[128] == 16.0f + 0.5f);  // 16 products of 1 x 1, plus C
  auto expect = [&](WgBug bug, const std::string& part, unsigned threads = 128) {
    const Result r = wg_run(bug, o, threads);
    INFO(r.detail);
    CHECK(r.err == cudaErrorLaunchFailure);
    CHECK(has(r.detail, part));
  };
  expect(WG_NO_FENCE, "no wgmma.fence since the warpgroup's last wgmma.wait_group");
  expect(WG_WARP_ELSEWHERE, "other threads of its warpgroup wait at");
  expect(WG_ACC_WRITE, "accumulator d[3] of the wgmma.mma_async issued at");
  expect(WG_SMEM_WRITE, "was written before this wait_group retired it");
  expect(WG_SWIZZLE_64B, "B descriptor: its swizzle mode (64B or 32B) is not modelled");
  expect(WG_NO_WAIT, "exits with the wgmma.mma_async issued at");
  expect(WG_DESC_DIFFERS, "its shape, type, descriptors, scale-d, A's source or imm-trans-b differ");
  expect(WG_OK, "so warpgroup 0 lacks threads 96-127", 96);
}

// ----------------------------------------------------------------------------
// wgmma with A from registers (the m64nNk16 A fragment) and B MN-major (imm-trans-b 1) or
// K-major, against a host product. B (k x N, row k holds N values) is placed by the host in
// the PTX ISA's canonical MN-major layouts (kernels/hopper.cuh): no swizzle, core matrices
// of 8 k rows x 16 bytes, LBO the step between 8-k groups, SBO between 8-column blocks;
// 128B swizzle, 128-byte rows of 64 columns XORed by k % 8, SBO 1024 between 8-k groups,
// LBO between 64-column blocks.
namespace {
size_t place_mn(int k, int n, bool swz, int N, int K) {
  if (swz)
    return static_cast<size_t>((n / 64) * (K / 8) * 1024 + (k / 8) * 1024 + (k % 8) * 128 +
                               ((((n / 8) % 8) ^ (k % 8)) * 16) + (n % 8) * 2);
  return static_cast<size_t>((k / 8) * (N / 8) * 128 + (n / 8) * 128 + (k % 8) * 16 + (n % 8) * 2);
}

enum RsBug { RS_OK, RS_A_WRITTEN, RS_TRANS_DIFFERS };

// D (64 x N) = A (64 x K) B (K x N), A from each thread's registers (the test gathers its
// fragment from A in global memory by the PTX ISA table), B staged by one bulk copy.
template <typename T, int N>
Result rs_run(bool swz, bool mn, int K, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& d,
              RsBug bug = RS_OK) {
  const bool bf = std::is_same_v<T, __nv_bfloat16>;
  std::vector<uint8_t> stage(static_cast<size_t>(N) * K * 2);
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) {
      const uint16_t h = host_bits(b[static_cast<size_t>(k * N + n)], bf);
      std::memcpy(&stage[mn ? place_mn(k, n, swz, N, K) : place(n, k, swz, N)], &h, 2);
    }
  std::vector<uint16_t> ah(a.size());
  for (size_t i = 0; i < a.size(); ++i) ah[i] = host_bits(a[i], bf);
  Dev<uint8_t> src(stage);
  Dev<uint16_t> adev(ah);
  Dev<float> out(64 * static_cast<size_t>(N));
  const uint8_t* sp = src.p;
  const uint16_t* ap = adev.p;
  float* op = out.p;
  const auto bytes = static_cast<uint32_t>(stage.size());
  const Result r = run(dim3(128), 1024 + stage.size(), [=] {
    char* base = static_cast<char*>(cuda_emu::dynamic_smem()) + 1024;
    init_bar(1);
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(smem_bar(), bytes);
      bulk_copy_g2s(base, sp, bytes, smem_bar());
    }
    wait_phase(smem_bar(), 0);
    const unsigned t = threadIdx.x, w = t / 32, gq = (t % 32) / 4, q = t % 4;
    float acc[N / 2];
    uint32_t af[16][4];  // K / 16 slices, each live until the wait
    const WgmmaSwizzle sw = swz ? WgmmaSwizzle::B128 : WgmmaSwizzle::NONE;
    for (int s = 0; s < K / 16; ++s)
      for (int i = 0; i < 8; i += 2) {
        auto at = [&](int e) {
          return ap[(16 * w + gq + 8 * ((e >> 1) & 1)) * K + 16 * s + 8 * (e >> 2) + 2 * q + (e & 1)];
        };
        af[s][i / 2] = static_cast<uint32_t>(at(i)) | static_cast<uint32_t>(at(i + 1)) << 16;
      }
    wgmma_fence();
    for (int s = 0; s < K / 16; ++s) {
      uint64_t bd;
      if (mn)  // slice s: k rows 16 s.. (two 8-k groups)
        bd = swz ? wgmma_desc(base + 2048 * s, static_cast<uint32_t>(K / 8) * 1024, 1024, sw)
                 : wgmma_desc(base + static_cast<size_t>(2 * s) * (N / 8) * 128, (N / 8) * 128, 128, sw);
      else bd = wgmma_desc(base + (swz ? 32u * s : static_cast<size_t>(s) * (N / 8) * 256), 128, swz ? 1024 : 256, sw);
      if (bug == RS_TRANS_DIFFERS)  // the engine's entry point: one call site, imm-trans-b per thread
        cuda_emu::wgmma_m64k16(__FILE__, __LINE__, bf ? cuda_emu::MMA_BF16 : cuda_emu::MMA_F16, N, acc, 0, bd, s > 0,
                               af[s], t != 70);
      else if (mn) wgmma_m64k16_rs<T, N, 1>(acc, af[s], bd, s > 0);
      else wgmma_m64k16_rs<T, N, 0>(acc, af[s], bd, s > 0);
    }
    wgmma_commit();
    if (bug == RS_A_WRITTEN && t == 9) af[0][2] ^= 1u;
    wgmma_wait<0>();
    for (int i = 0; i < N / 2; ++i)
      op[(16 * w + gq + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * q + (i & 1)] = acc[i];
  });
  if (r.err == cudaSuccess) d = out.get();
  return r;
}

template <typename T, int N>
void rs_check(bool swz, bool mn, int K) {
  const bool bf = std::is_same_v<T, __nv_bfloat16>;
  std::mt19937 rng(static_cast<unsigned>(N * 11 + K + 2 * swz + mn));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> a(64 * static_cast<size_t>(K)), b(static_cast<size_t>(K) * N), d;
  for (auto& x : a) x = host_round(u(rng), bf);
  for (auto& x : b) x = host_round(u(rng), bf);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(swz);
  CAPTURE(mn);
  CAPTURE(bf);
  CHECK_RUNS_A((rs_run<T, N>(swz, mn, K, a, b, d)));
  if (!sm90a()) return;
  int bad = 0;
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k)
        ref += static_cast<double>(a[static_cast<size_t>(r * K + k)]) * b[static_cast<size_t>(k * N + n)];
      bad += !(std::fabs(d[static_cast<size_t>(r * N + n)] - ref) <= 1e-5 * (1 + std::fabs(ref)) * K);
    }
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("wgmma m64nNk16 with A from registers: B MN-major (imm-trans-b) and K-major, no swizzle and 128B") {
  rs_check<__nv_bfloat16, 64>(true, true, 64);
  rs_check<__half, 128>(true, true, 32);
  rs_check<__nv_bfloat16, 128>(false, true, 32);
  rs_check<__half, 64>(false, true, 16);
  rs_check<__nv_bfloat16, 64>(true, false, 64);
  rs_check<__half, 128>(false, false, 16);
}

TEST_CASE("wgmma with A from registers, misuse: an A register written before the wait, imm-trans-b not uniform") {
  std::vector<float> a(64 * 16, 1.0f), b(16 * 64, 1.0f), d;
  auto expect = [&](RsBug bug, const std::string& part, const std::string& code) {
    const Result r = rs_run<__nv_bfloat16, 64>(true, true, 16, a, b, d, bug);
    INFO(r.detail);
    if (!sm90a()) {
      CHECK(r.err == cudaErrorIllegalInstruction);
      return;
    }
    CHECK(r.err == cudaErrorLaunchFailure);
    CHECK(has(r.detail, part));
    CHECK(names_line(r.detail, code));
  };
  expect(RS_A_WRITTEN, "A register 2 of the wgmma.mma_async issued at", "wgmma_m64k16_rs<T, N, 1>");
  expect(RS_A_WRITTEN, "(A from registers) was written before the wait_group that retires it", "wgmma_wait<0>()");
  expect(RS_TRANS_DIFFERS, "A's source or imm-trans-b differ", "cuda_emu::wgmma_m64k16(__FILE__");
}

// ----------------------------------------------------------------------------
// Tensor maps (cuTensorMapEncodeTiled, reached as dtrain reaches it: through
// cudaGetDriverEntryPointByVersion) and the Tensor Memory Accelerator's tile copy.
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encoder() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  REQUIRE(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess);
  REQUIRE(q == cudaDriverEntryPointSuccess);
  REQUIRE(p != nullptr);
  return reinterpret_cast<EncodeTiled>(p);
}

// A [2][10][80] uint16 tensor with rows padded to 96 elements (192-byte rows): element
// (b, t, c) = 1000 b + 100 t + c + 1 (never 0, so a zero is an out-of-bounds fill).
struct Tensor3 {
  static constexpr int B = 2, T = 10, C = 80, PITCH = 96;
  std::vector<uint16_t> h;
  Tensor3() : h(static_cast<size_t>(B) * T * PITCH, 0xffff) {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c)
          h[(static_cast<size_t>(b) * T + t) * PITCH + c] = static_cast<uint16_t>(1000 * b + 100 * t + c + 1);
  }
  CUresult encode(CUtensorMap* m, void* base, cuuint32_t rows, CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_128B,
                  cuuint64_t dim0 = C) const {
    const cuuint64_t dim[3] = {dim0, T, B}, strides[2] = {PITCH * 2, PITCH * 2 * T};
    const cuuint32_t box[3] = {64, rows, 1}, es[3] = {1, 1, 1};
    return encoder()(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, base, dim, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     sw, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
};

}  // namespace

TEST_CASE("tensor maps: the driver entry point, and cuTensorMapEncodeTiled's documented requirements") {
  void* p = reinterpret_cast<void*>(1);
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &p, 12000, cudaEnableDefault, &q) == cudaSuccess);
  CHECK(q == cudaDriverEntryPointSymbolNotFound);
  CHECK(p == nullptr);
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 11080, cudaEnableDefault, &q) == cudaSuccess);
  CHECK(q == cudaDriverEntryPointVersionNotSufficent);
  const Tensor3 x;
  Dev<uint16_t> g(x.h);
  CUtensorMap m;
  if (!sm90()) {  // tensor maps are sm_90 and later
    CHECK(x.encode(&m, g.p, 16) == CUDA_ERROR_NOT_SUPPORTED);
    return;
  }
  CHECK(x.encode(&m, g.p, 16) == CUDA_SUCCESS);
  const EncodeTiled enc = encoder();
  struct Case {
    const char* what;
    cuuint32_t rank;
    int addr_off;  // elements
    cuuint64_t stride0;
    cuuint32_t box0, box1;
    CUtensorMapSwizzle sw;
    CUtensorMapInterleave il;
    CUtensorMapFloatOOBfill oob;
    CUresult want;
  };
  const auto S128 = CU_TENSOR_MAP_SWIZZLE_128B;
  const auto IL0 = CU_TENSOR_MAP_INTERLEAVE_NONE;
  const auto Z = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
  const Case cases[] = {
      {"the base 16-byte aligned", 3, 0, 192, 64, 16, S128, IL0, Z, CUDA_SUCCESS},
      {"a base 2 bytes off 16", 3, 1, 192, 64, 16, S128, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"a stride not a multiple of 16", 3, 0, 184, 64, 16, S128, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"a box of 257 rows", 3, 0, 192, 64, 257, S128, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"a box row of 8 bytes", 3, 0, 192, 4, 16, CU_TENSOR_MAP_SWIZZLE_NONE, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"a box row of 256 bytes under the 128B swizzle", 3, 0, 192, 128, 16, S128, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"rank 0", 0, 0, 192, 64, 16, S128, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"rank 6", 6, 0, 192, 64, 16, S128, IL0, Z, CUDA_ERROR_INVALID_VALUE},
      {"the 64B swizzle (not modelled)", 3, 0, 192, 32, 16, CU_TENSOR_MAP_SWIZZLE_64B, IL0, Z,
       CUDA_ERROR_NOT_SUPPORTED},
      {"an interleaved layout (not modelled)", 3, 0, 192, 64, 16, CU_TENSOR_MAP_SWIZZLE_32B,
       CU_TENSOR_MAP_INTERLEAVE_32B, Z, CUDA_ERROR_NOT_SUPPORTED},
      {"the NaN fill (not modelled)", 3, 0, 192, 64, 16, S128, IL0, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
       CUDA_ERROR_NOT_SUPPORTED},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.what));
    const cuuint64_t dim[6] = {80, 10, 2, 1, 1, 1}, strides[5] = {c.stride0, c.stride0 * 10, 3840, 3840, 3840};
    const cuuint32_t box[6] = {c.box0, c.box1, 1, 1, 1, 1}, es[6] = {1, 1, 1, 1, 1, 1};
    CHECK(enc(&m, CU_TENSOR_MAP_DATA_TYPE_UINT16, c.rank, g.p + c.addr_off, dim, strides, box, es, c.il, c.sw,
              CU_TENSOR_MAP_L2_PROMOTION_NONE, c.oob) == c.want);
  }
}

TEST_CASE("tensor copy: a 3-D box lands 128B-swizzled, elements out of bounds zero, the whole box's bytes counted") {
  const Tensor3 x;
  Dev<uint16_t> g(x.h);
  CUtensorMap m;
  const bool ok = sm90() && x.encode(&m, g.p, 16) == CUDA_SUCCESS;
  if (!sm90()) {
    CHECK(x.encode(&m, g.p, 16) == CUDA_ERROR_NOT_SUPPORTED);
    std::memset(&m, 0, sizeof m);  // the copy must still fail as an illegal instruction first
  }
  REQUIRE((ok || !sm90()));
  // Box (64 columns, 16 rows, 1) at (24, 4, 1): columns 80.. and rows 10.. are out of bounds.
  constexpr int BYTES = 64 * 16 * 2;
  Dev<uint16_t> out(64 * 16);
  uint16_t* o = out.p;
  CHECK_RUNS(run(dim3(128), 1024 + BYTES, [=] {
    char* dst = static_cast<char*>(cuda_emu::dynamic_smem()) + 1024;
    init_bar(1);
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(smem_bar(), BYTES);  // the whole box, out-of-bounds part included
      tensor_copy_3d_g2s(dst, &m, 24, 4, 1, smem_bar());
    }
    wait_phase(smem_bar(), 0);
    for (int i = static_cast<int>(threadIdx.x); i < BYTES / 2; i += 128) o[i] = reinterpret_cast<uint16_t*>(dst)[i];
  }));
  if (!sm90()) return;
  const auto v = out.get();
  // Row r of the box is 128 bytes at r * 128; its 16-byte chunk j sits at chunk j ^ (r % 8)
  // (the 128B swizzle from a 1024-byte aligned start).
  int wrong = 0;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c) {
      const int t = 4 + r, col = 24 + c;
      const uint16_t want = t < Tensor3::T && col < Tensor3::C ? static_cast<uint16_t>(1000 + 100 * t + col + 1) : 0;
      const int at = r * 64 + (((c / 8) ^ (r % 8)) * 8) + c % 8;
      wrong += v[static_cast<size_t>(at)] != want;
    }
  CHECK(wrong == 0);
}

TEST_CASE("tensor copy misuse fails the launch naming the call site") {
  const Tensor3 x;
  Dev<uint16_t> g(x.h);
  CUtensorMap good, wide, bogus;
  std::memset(&bogus, 0, sizeof bogus);
  if (sm90()) {
    REQUIRE(x.encode(&good, g.p, 16) == CUDA_SUCCESS);
    // Columns up to 400: a box at column 300 of the last row reads past the allocation.
    REQUIRE(x.encode(&wide, g.p, 16, CU_TENSOR_MAP_SWIZZLE_128B, 400) == CUDA_SUCCESS);
  } else {
    good = wide = bogus;
  }
  constexpr size_t SM = 1024 + 2048 + 1024;
  auto smem_at = [](size_t off) { return static_cast<char*>(cuda_emu::dynamic_smem()) + off; };
  expect(run(dim3(1), SM, [=] { init_bar(1), tensor_copy_3d_g2s(smem_at(1024 + 16), &good, 0, 0, 0, smem_bar()); }),
         "is not 128-byte aligned", "tensor_copy_3d_g2s(smem_at(1024 + 16)", cudaErrorMisalignedAddress);
  expect(run(dim3(1), SM, [=] { init_bar(1), tensor_copy_3d_g2s(smem_at(1024), &bogus, 0, 0, 0, smem_bar()); }),
         "is not one cuTensorMapEncodeTiled made", "tensor_copy_3d_g2s(smem_at(1024), &bogus", cudaErrorIllegalAddress);
  expect(run(dim3(1), SM, [=] { init_bar(1), tensor_copy_3d_g2s(smem_at(1024), &wide, 300, 9, 1, smem_bar()); }),
         "is not device memory", "tensor_copy_3d_g2s(smem_at(1024), &wide", cudaErrorIllegalAddress);
  expect(run(dim3(1), SM,
             [=] {
               init_bar(1);
               tensor_copy_3d_g2s(smem_at(1024), &good, 0, 0, 0, smem_bar());
               tensor_copy_3d_g2s(smem_at(2048), &good, 0, 0, 0, smem_bar());
             }),
         "overlaps that of the bulk copy", "tensor_copy_3d_g2s(smem_at(2048)");
  // 16 bytes fewer announced than the box: the phase would complete early on a GPU.
  expect(run(dim3(1), SM,
             [=] {
               init_bar(1);
               mbarrier_arrive_expect_tx(smem_bar(), 2048 - 16);
               tensor_copy_3d_g2s(smem_at(1024), &good, 0, 0, 0, smem_bar());
               wait_phase(smem_bar(), 0);
             }),
         "bytes more than expect_tx announced", "mbarrier_try_wait_parity");
}
