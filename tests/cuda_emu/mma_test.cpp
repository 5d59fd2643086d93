// Tests of the CUDA execution engine's tensor-core warp instructions and asynchronous
// copies, through kernels/mma.cuh as the kernels use them (launched with DTK_LAUNCH):
// mma.sync m16n8k16 (bf16, fp16) against a double reference with fragments built from
// the PTX ISA's element formulas, ldmatrix x1/x2/x4 (.trans) against the documented
// per-lane mapping, the ldmatrix + mma tile product attention uses, cp.async groups and
// when their bytes land, and the misuse the engine reports where a GPU is undefined.
#include "kernels/common.cuh"
#include "kernels/mma.cuh"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace dtrain::kernels::detail;

namespace {

// ----------------------------------------------------------------------------
// Host helpers.
template <typename T>
uint16_t to_bits(float f) {
  if constexpr (std::is_same_v<T, bf16>) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  else return __half_as_ushort(__float2half_rn(f));
}
template <typename T>
float from_bits(uint16_t h) {
  if constexpr (std::is_same_v<T, bf16>) return __bfloat162float(__ushort_as_bfloat16(h));
  else return __half2float(__ushort_as_half(h));
}
template <typename T>
std::vector<T> to_t(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = to_bits<T>(v[i]);
    std::memcpy(&out[i], &h, 2);
  }
  return out;
}

// A device buffer holding a copy of host data (or n poisoned elements).
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) {
    REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

// The outcome of the launches before it; an error is cleared after it is read (a real
// context would be lost).
struct Outcome {
  cudaError_t err;
  std::string detail;
};
Outcome finish() {
  const cudaError_t e = cudaDeviceSynchronize();
  Outcome o{e, e == cudaSuccess ? "" : cuda_emu::last_error_detail()};
  if (e != cudaSuccess) cuda_emu::test_clear_errors();
  return o;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string at_line(int line) { return "mma_test.cpp:" + std::to_string(line); }

// Records the source line of the statement it wraps, for checking error reports.
#define AT_LINE(var, stmt)                            \
  do {                                                \
    (var).store(__LINE__, std::memory_order_relaxed); \
    stmt;                                             \
  } while (0)
std::atomic<int> g_line_a{0}, g_line_b{0};

// The reference D = A B + C of one m16n8 tile (A [16][16], B [16][8] as [k][n]) in
// double, with sum |a b| + |c| per element for the tolerance.
struct Ref {
  std::vector<double> d, mag;
};
Ref reference(const float* a, const float* b, const float* c, int M, int N, int K) {
  Ref r{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = c ? c[i * N + j] : 0.0, m = c ? std::fabs(c[i * N + j]) : 0.0;
      for (int k = 0; k < K; ++k) {
        const double p = static_cast<double>(a[i * K + k]) * b[k * N + j];
        s += p;
        m += std::fabs(p);
      }
      r.d[i * N + j] = s;
      r.mag[i * N + j] = m;
    }
  return r;
}

// ----------------------------------------------------------------------------
// Kernels.
__device__ uint32_t bits_pair(bf16 lo, bf16 hi) {
  return __bfloat16_as_ushort(lo) | static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16;
}
__device__ uint32_t bits_pair(fp16 lo, fp16 hi) {
  return __half_as_ushort(lo) | static_cast<uint32_t>(__half_as_ushort(hi)) << 16;
}

// Each warp computes one m16n8k16 tile; every lane builds its fragments element by
// element from the PTX ISA's formulas (groupID g = lane >> 2, threadID_in_group q = lane % 4):
//   a_i: row g (+8 for i in {2,3,6,7}), col 2q + (i & 1) (+8 for i >= 4)
//   b_i: row (k) 2q + (i & 1) (+8 for i >= 2), col (n) g
//   c_i: row g (+8 for i >= 2), col 2q + (i & 1)
// with elements 2j and 2j + 1 in register j (the even one in the low half).
template <typename T>
__global__ void mma_fragment_kernel(float* D, const T* A, const T* B, const float* C) {
  const int lane = threadIdx.x % 32, tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int g = lane >> 2, q = lane % 4;
  const T* a = A + tile * 256;
  const T* b = B + tile * 128;
  auto a_at = [&](int i) { return a[(g + ((i & 2) ? 8 : 0)) * 16 + 2 * q + (i & 1) + (i >= 4 ? 8 : 0)]; };
  auto b_at = [&](int i) { return b[(2 * q + (i & 1) + (i >= 2 ? 8 : 0)) * 8 + g]; };
  auto c_index = [&](int i) { return tile * 128 + (g + (i >= 2 ? 8 : 0)) * 8 + 2 * q + (i & 1); };
  uint32_t ra[4], rb[2];
  for (int j = 0; j < 4; ++j) ra[j] = bits_pair(a_at(2 * j), a_at(2 * j + 1));
  for (int j = 0; j < 2; ++j) rb[j] = bits_pair(b_at(2 * j), b_at(2 * j + 1));
  float d[4];
  for (int i = 0; i < 4; ++i) d[i] = C[c_index(i)];
  mma_m16n8k16<T>(d, ra, rb);
  for (int i = 0; i < 4; ++i) D[c_index(i)] = d[i];
}

// ldmatrix: logical row R = 8 m + r of matrix m is stored at slot (13 R + 5) % 32 of a
// shared buffer with a 24-element pitch (rows neither contiguous nor in order); element
// (R, c) holds 0x8000 | R << 8 | c and the padding 0x5a5a. Lanes the instruction does
// not use pass a null address. out[lane * 4 + m] = register m.
constexpr int LDSM_PITCH = 24;
__device__ __host__ inline int ldsm_slot(int R) { return (13 * R + 5) % 32; }
__device__ __host__ inline uint16_t ldsm_value(int R, int c) { return static_cast<uint16_t>(0x8000 | R << 8 | c); }

template <int X, bool TRANS>
__device__ void ldmatrix_run(uint32_t* out, uint16_t* smem) {
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 32 * LDSM_PITCH; i += 32) {
    const int slot = i / LDSM_PITCH, c = i % LDSM_PITCH;
    int R = 0;
    while (ldsm_slot(R) != slot) ++R;
    smem[i] = c < 8 ? ldsm_value(R, c) : static_cast<uint16_t>(0x5a5a);
  }
  __syncthreads();
  const void* p = lane < 8 * X ? smem + ldsm_slot(lane) * LDSM_PITCH : nullptr;
  uint32_t r[4] = {0, 0, 0, 0};
  if constexpr (X == 1) {
    static_assert(!TRANS, "mma.cuh has no ldmatrix_x1_trans");
    ldmatrix_x1(r[0], p);
  } else if constexpr (X == 2) {
    uint32_t r2[2];
    if constexpr (TRANS) ldmatrix_x2_trans(r2, p);
    else ldmatrix_x2(r2, p);
    r[0] = r2[0];
    r[1] = r2[1];
  } else {
    uint32_t r4[4];
    if constexpr (TRANS) ldmatrix_x4_trans(r4, p);
    else ldmatrix_x4(r4, p);
    for (int j = 0; j < 4; ++j) r[j] = r4[j];
  }
  for (int j = 0; j < 4; ++j) out[lane * 4 + j] = r[j];
}
template <int X, bool TRANS>
__global__ void ldmatrix_dynamic_kernel(uint32_t* out) {
  DTK_EXTERN_SHARED(uint16_t, smem);
  ldmatrix_run<X, TRANS>(out, smem);
}
template <int X, bool TRANS>
__global__ void ldmatrix_static_kernel(uint32_t* out) {
  alignas(16) __shared__ uint16_t smem[32 * LDSM_PITCH];
  ldmatrix_run<X, TRANS>(out, smem);
}

// D [16][16] = A [16][K] B [K][16] on one warp, the way attention does it: cp.async both
// operands into padded shared tiles, ldmatrix_x4 for A, ldmatrix_x4_trans for B stored
// [k][n], two m16n8k16 per 16-wide k step.
template <typename T>
__global__ void tile_product_kernel(float* D, const T* A, const T* B, int K) {
  DTK_EXTERN_SHARED(T, smem);
  const int lane = static_cast<int>(threadIdx.x), pa = K + 8, pb = 16 + 8;
  T* As = smem;
  T* Bs = smem + 16 * pa;
  for (int c = lane; c < 16 * K / 8; c += 32) {  // 16-byte chunks of A's rows
    const int row = c / (K / 8), col = c % (K / 8) * 8;
    cp_async_16(As + row * pa + col, A + row * K + col);
  }
  for (int c = lane; c < K * 2; c += 32) {  // B: two chunks per row of 16
    const int row = c / 2, col = c % 2 * 8;
    cp_async_16(Bs + row * pb + col, B + row * 16 + col);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  float d0[4] = {0, 0, 0, 0}, d1[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], b[4];
    ldmatrix_x4(a, As + (lane % 16) * pa + k0 + 8 * (lane / 16));
    ldmatrix_x4_trans(b, Bs + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * pb + 8 * (lane / 16));
    const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
    mma_m16n8k16<T>(d0, a, b_lo);
    mma_m16n8k16<T>(d1, a, b_hi);
  }
  const int g = lane >> 2, q = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
    D[row * 16 + col] = d0[i];
    D[row * 16 + 8 + col] = d1[i];
  }
}

// cp.async: thread t copies 16-byte chunk t of src to chunk (5 t + 3) % 64 of a shared
// buffer it first filled with a marker (dynamic shared memory keeps the engine's 0xff
// fill instead), then reads its own destination before the wait and after a barrier
// without one (the stale bytes both times), then after wait<0> + __syncthreads the chunk
// thread t + 1 copied. out[t * 12 + ...]: 4 words before, 4 after the barrier, 4 after.
constexpr uint32_t MARK = 0xa5a5a5a5u;
__device__ __host__ inline int cp_slot(int t) { return (5 * t + 3) % 64; }

__device__ void cp_async_run(uint32_t* out, const uint4* src, uint4* buf, bool mark) {
  const int t = static_cast<int>(threadIdx.x);
  uint4* mine = buf + cp_slot(t);
  if (mark) *mine = uint4{MARK, MARK, MARK, MARK};
  cp_async_16(mine, src + t);
  cp_async_commit();
  const uint4 before = *mine;
  __syncthreads();
  const uint4 barrier = *mine;
  cp_async_wait<0>();
  __syncthreads();
  const uint4 after = buf[cp_slot((t + 1) % 64)];
  const uint4 v[3] = {before, barrier, after};
  for (int k = 0; k < 3; ++k) {
    out[t * 12 + k * 4 + 0] = v[k].x;
    out[t * 12 + k * 4 + 1] = v[k].y;
    out[t * 12 + k * 4 + 2] = v[k].z;
    out[t * 12 + k * 4 + 3] = v[k].w;
  }
}
__global__ void cp_async_dynamic_kernel(uint32_t* out, const uint4* src) {
  DTK_EXTERN_SHARED(uint4, buf);
  cp_async_run(out, src, buf, false);
}
__global__ void cp_async_static_kernel(uint32_t* out, const uint4* src) {
  alignas(16) __shared__ uint4 buf[64];
  cp_async_run(out, src, buf, true);
}

// Groups: thread t copies chunks 3t, 3t + 1, 3t + 2 of src to its own three slots of
// dynamic shared memory: X in group 0, Y in group 1, then Z left uncommitted. It records
// the first word of a slot at each step: out[t * 6 + ...] =
//   X after wait<1>, Y after wait<1>, Y after wait<0>, Z after wait<0> (uncommitted),
//   Z after commit + wait<0>, X at the end.
__global__ void cp_async_groups_kernel(uint32_t* out, const uint4* src) {
  DTK_EXTERN_SHARED(uint4, buf);
  const int t = static_cast<int>(threadIdx.x);
  uint4* s = buf + 3 * t;
  cp_async_16(s + 0, src + 3 * t + 0);
  cp_async_commit();
  cp_async_16(s + 1, src + 3 * t + 1);
  cp_async_commit();
  cp_async_wait<1>();
  out[t * 6 + 0] = s[0].x;
  out[t * 6 + 1] = s[1].x;
  cp_async_16(s + 2, src + 3 * t + 2);
  cp_async_wait<0>();
  out[t * 6 + 2] = s[1].x;
  out[t * 6 + 3] = s[2].x;
  cp_async_commit();
  cp_async_wait<0>();
  out[t * 6 + 4] = s[2].x;
  out[t * 6 + 5] = s[0].x;
}

// Copies left in flight when the threads exit (no wait): PTX defines no error.
__global__ void cp_async_no_wait_kernel(const uint4* src) {
  DTK_EXTERN_SHARED(uint4, buf);
  cp_async_16(buf + threadIdx.x, src + threadIdx.x);
  if (threadIdx.x % 2) cp_async_commit();
}

// A half-warp shuffle some lanes do before the mma every lane reaches: the lanes that
// skip the shuffle may wait at the mma while the others still meet at the shuffle.
__global__ void shuffle_then_mma_kernel(float* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  float v = static_cast<float>(lane);
  if (lane < 16) v += __shfl_xor_sync(0x0000ffffu, v, 1);
  const uint32_t a[4] = {pack2<bf16>(1.0f, 1.0f), pack2<bf16>(1.0f, 1.0f), pack2<bf16>(1.0f, 1.0f),
                         pack2<bf16>(1.0f, 1.0f)};
  const uint32_t b[2] = {pack2<bf16>(1.0f, 1.0f), pack2<bf16>(1.0f, 1.0f)};
  float d[4] = {v, v, v, v};
  mma_m16n8k16<bf16>(d, a, b);
  out[threadIdx.x] = d[0];
}

// ---- misuse
__global__ void mma_lane_exits_kernel(float* out) {
  if (threadIdx.x == 5) return;
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float d[4] = {0, 0, 0, 0};
  AT_LINE(g_line_a, mma_m16n8k16<bf16>(d, a, b));
  out[threadIdx.x] = d[0];
}

__global__ void mma_two_sites_kernel(float* out) {
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float d[4] = {0, 0, 0, 0};
  if (threadIdx.x < 16) AT_LINE(g_line_a, mma_m16n8k16<fp16>(d, a, b));
  else AT_LINE(g_line_b, mma_m16n8k16<fp16>(d, a, b));
  out[threadIdx.x] = d[0];
}

__global__ void ldmatrix_partial_warp_kernel(uint32_t* out) {
  alignas(16) __shared__ uint16_t smem[64 * 8];
  uint32_t r[4];
  AT_LINE(g_line_a, ldmatrix_x4(r, smem + threadIdx.x % 32 * 8));
  out[threadIdx.x] = r[0];
}

__global__ void ldmatrix_misaligned_kernel(uint32_t* out) {
  DTK_EXTERN_SHARED(uint16_t, smem);
  const int lane = static_cast<int>(threadIdx.x);
  uint32_t r[2];
  AT_LINE(g_line_a, ldmatrix_x2_trans(r, smem + lane % 16 * 16 + (lane == 3 ? 4 : 0)));
  out[lane] = r[0];
}

__global__ void ldmatrix_global_kernel(uint32_t* out, const uint16_t* global) {
  uint32_t r[2];
  AT_LINE(g_line_a, ldmatrix_x2(r, global + threadIdx.x % 16 * 8));
  out[threadIdx.x] = r[0];
}

__global__ void ldmatrix_stack_kernel(uint32_t* out) {
  alignas(16) uint16_t local[8 * 8] = {};
  uint32_t r;
  AT_LINE(g_line_a, ldmatrix_x1(r, local + threadIdx.x % 8 * 8));
  out[threadIdx.x] = r;
}

__global__ void cp_async_bad_kernel(int which, const uint4* src, uint4* global_dst) {
  DTK_EXTERN_SHARED(uint4, buf);
  if (which == 0) AT_LINE(g_line_a, cp_async_16(buf + threadIdx.x, src + threadIdx.x));         // src: pinned host
  if (which == 1) AT_LINE(g_line_a, cp_async_16(global_dst + threadIdx.x, src + threadIdx.x));  // dst: global
  if (which == 2)                                                                               // src 8 bytes off
    AT_LINE(g_line_a, cp_async_16(buf + threadIdx.x, reinterpret_cast<const char*>(src + threadIdx.x) + 8));
  if (which == 3) AT_LINE(g_line_a, cp_async_16(buf + threadIdx.x, src + 1));  // src: 8 of 16 bytes exist
  cp_async_commit();
  cp_async_wait<0>();
}

}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE_TEMPLATE("mma m16n8k16: fragments from the PTX ISA formulas, D = A B + C", T, bf16, fp16) {
  constexpr int TILES = 4;  // 2 blocks x 2 warps
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-4, 4);
  std::uniform_real_distribution<float> real(-2.0f, 2.0f);
  std::vector<float> a(TILES * 256), b(TILES * 128), c(TILES * 128);
  // Tile 0: small integers, so every product and sum is exact and D must match exactly;
  // the others: random values (rounded to T; C stays fp32).
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>(small(rng));
  for (int i = 0; i < 128; ++i) b[i] = static_cast<float>(small(rng)), c[i] = static_cast<float>(small(rng) * 8);
  for (int i = 256; i < TILES * 256; ++i) a[i] = from_bits<T>(to_bits<T>(real(rng)));
  for (int i = 128; i < TILES * 128; ++i) b[i] = from_bits<T>(to_bits<T>(real(rng))), c[i] = 2.0f * real(rng);
  DevBuf<T> da(to_t<T>(a)), db(to_t<T>(b));
  DevBuf<float> dc(c), dd(TILES * 128);
  DTK_LAUNCH(2, 64, 0, 0, mma_fragment_kernel<T>)(dd.p, da.p, db.p, dc.p);
  const Outcome o = finish();
  REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
  const std::vector<float> d = dd.get();
  for (int t = 0; t < TILES; ++t) {
    const Ref r = reference(&a[t * 256], &b[t * 128], &c[t * 128], 16, 8, 16);
    for (int i = 0; i < 128; ++i) {
      // The products are exact in fp32; 16 fp32 additions each round by at most 2^-24
      // of a partial sum bounded by sum |terms|: |error| <= 16 * 2^-24 * mag < 1e-6 mag.
      const double tol = t == 0 ? 0.0 : 1e-6 * r.mag[i];
      CHECK_MESSAGE(std::fabs(d[t * 128 + i] - r.d[i]) <= tol,
                    "tile " << t << " D[" << i / 8 << "][" << i % 8 << "] = " << d[t * 128 + i] << ", want " << r.d[i]);
    }
  }
}

TEST_CASE_TEMPLATE("mma m16n8k16: inf and NaN inputs propagate", T, bf16, fp16) {
  std::vector<float> a(256), b(128, 0.0f), c(128, 0.5f);
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>(i % 5) - 2.0f;
  for (int i = 0; i < 128; ++i) b[i] = static_cast<float>(1 + i % 3);  // positive: inf * b stays inf
  a[3 * 16 + 5] = INFINITY;
  a[7 * 16 + 0] = NAN;
  a[12 * 16 + 9] = -INFINITY;
  DevBuf<T> da(to_t<T>(a)), db(to_t<T>(b));
  DevBuf<float> dc(c), dd(128);
  DTK_LAUNCH(1, 32, 0, 0, mma_fragment_kernel<T>)(dd.p, da.p, db.p, dc.p);
  const Outcome o = finish();
  REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
  const std::vector<float> d = dd.get();
  const Ref r = reference(a.data(), b.data(), c.data(), 16, 8, 16);
  for (int i = 0; i < 128; ++i) {
    const int row = i / 8;
    if (row == 3) CHECK(d[i] == INFINITY);
    else if (row == 7) CHECK(std::isnan(d[i]));
    else if (row == 12) CHECK(d[i] == -INFINITY);
    else CHECK(d[i] == r.d[i]);  // small integers and halves: exact
  }
}

namespace {
// What register m of `lane` must hold for an ldmatrix of the layout ldmatrix_run builds.
uint32_t ldsm_expect(int lane, int m, bool trans) {
  const int g = lane / 4, q = lane % 4;
  if (trans) return ldsm_value(8 * m + 2 * q, g) | static_cast<uint32_t>(ldsm_value(8 * m + 2 * q + 1, g)) << 16;
  return ldsm_value(8 * m + g, 2 * q) | static_cast<uint32_t>(ldsm_value(8 * m + g, 2 * q + 1)) << 16;
}
template <int X, bool TRANS>
void ldmatrix_case(bool static_smem) {
  CAPTURE(X);
  CAPTURE(TRANS);
  CAPTURE(static_smem);
  DevBuf<uint32_t> out(32 * 4);
  if (static_smem) DTK_LAUNCH(1, 32, 0, 0, ldmatrix_static_kernel<X, TRANS>)(out.p);
  else DTK_LAUNCH(1, 32, 32 * LDSM_PITCH * sizeof(uint16_t), 0, ldmatrix_dynamic_kernel<X, TRANS>)(out.p);
  const Outcome o = finish();
  REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
  const std::vector<uint32_t> r = out.get();
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < X; ++m)
      if (r[lane * 4 + m] != ldsm_expect(lane, m, TRANS)) ++wrong;
  CHECK(wrong == 0);
}
}  // namespace

TEST_CASE("ldmatrix x1/x2/x4 (.trans): the documented per-lane mapping, from dynamic and static shared memory") {
  for (bool st : {false, true}) {
    ldmatrix_case<1, false>(st);
    ldmatrix_case<2, false>(st);
    ldmatrix_case<4, false>(st);
    ldmatrix_case<2, true>(st);
    ldmatrix_case<4, true>(st);
  }
}

TEST_CASE_TEMPLATE("a 16x16 tile product: cp.async, ldmatrix (B [k][n] via .trans) and mma, as attention does", T, bf16,
                   fp16) {
  for (int K : {16, 64}) {
    CAPTURE(K);
    std::mt19937 rng(11 + K);
    std::uniform_real_distribution<float> real(-1.0f, 1.0f);
    std::vector<float> a(16 * K), b(K * 16);
    for (float& x : a) x = from_bits<T>(to_bits<T>(real(rng)));
    for (float& x : b) x = from_bits<T>(to_bits<T>(real(rng)));
    DevBuf<T> da(to_t<T>(a)), db(to_t<T>(b));
    DevBuf<float> dd(256);
    const size_t smem = (16 * (K + 8) + K * 24) * sizeof(T);
    DTK_LAUNCH(1, 32, smem, 0, tile_product_kernel<T>)(dd.p, da.p, db.p, K);
    const Outcome o = finish();
    REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
    const std::vector<float> d = dd.get();
    const Ref r = reference(a.data(), b.data(), nullptr, 16, 16, K);
    for (int i = 0; i < 256; ++i) {
      // K exact products added one by one in fp32: |error| <= K * 2^-24 * mag.
      const double tol = K * 6e-8 * r.mag[i];
      CHECK_MESSAGE(std::fabs(d[i] - r.d[i]) <= tol,
                    "D[" << i / 16 << "][" << i % 16 << "] = " << d[i] << ", want " << r.d[i]);
    }
  }
}

TEST_CASE("cp.async: bytes land at the wait, not before it and not at a barrier; dynamic and static shared memory") {
  std::vector<uint32_t> src(64 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0x10000000u + static_cast<uint32_t>(i) * 7919u;
  DevBuf<uint32_t> dsrc(src), out(64 * 12);
  for (bool st : {false, true}) {
    CAPTURE(st);
    const auto* s = reinterpret_cast<const uint4*>(dsrc.p);
    if (st) DTK_LAUNCH(1, 64, 0, 0, cp_async_static_kernel)(out.p, s);
    else DTK_LAUNCH(1, 64, 64 * 16, 0, cp_async_dynamic_kernel)(out.p, s);
    const Outcome o = finish();
    REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
    const std::vector<uint32_t> r = out.get();
    const uint32_t stale = st ? MARK : 0xffffffffu;  // dynamic shared memory starts as 0xff bytes
    int early = 0, wrong = 0;
    for (int t = 0; t < 64; ++t)
      for (int w = 0; w < 4; ++w) {
        early += r[t * 12 + w] != stale;      // read before the wait
        early += r[t * 12 + 4 + w] != stale;  // after a barrier, still before the wait
        wrong += r[t * 12 + 8 + w] != src[((t + 1) % 64) * 4 + w];
      }
    CHECK(early == 0);
    CHECK(wrong == 0);
  }
}

TEST_CASE("cp.async groups: wait<1> retires all but the newest group; uncommitted copies wait for their commit") {
  std::vector<uint32_t> src(64 * 3 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0x20000000u + static_cast<uint32_t>(i);
  DevBuf<uint32_t> dsrc(src), out(64 * 6);
  DTK_LAUNCH(1, 64, 64 * 3 * 16, 0, cp_async_groups_kernel)(out.p, reinterpret_cast<const uint4*>(dsrc.p));
  const Outcome o = finish();
  REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
  const std::vector<uint32_t> r = out.get();
  const uint32_t stale = 0xffffffffu;
  for (int t = 0; t < 64; ++t) {
    CAPTURE(t);
    const uint32_t x = src[(3 * t) * 4], y = src[(3 * t + 1) * 4], z = src[(3 * t + 2) * 4];
    CHECK(r[t * 6 + 0] == x);      // group 0 retired by wait<1>
    CHECK(r[t * 6 + 1] == stale);  // group 1 is the newest: still pending
    CHECK(r[t * 6 + 2] == y);      // wait<0>
    CHECK(r[t * 6 + 3] == stale);  // Z was not committed: wait<0> does not wait for it
    CHECK(r[t * 6 + 4] == z);
    CHECK(r[t * 6 + 5] == x);
  }
}

TEST_CASE("cp.async: threads may exit with copies in flight (PTX defines no error)") {
  std::vector<uint32_t> src(64 * 4, 1u);
  DevBuf<uint32_t> dsrc(src);
  DTK_LAUNCH(3, 64, 64 * 16, 0, cp_async_no_wait_kernel)(reinterpret_cast<const uint4*>(dsrc.p));
  const Outcome o = finish();
  CHECK_MESSAGE(o.err == cudaSuccess, o.detail);
}

TEST_CASE("a half-warp shuffle before an mma that every lane reaches is no conflict") {
  // Run a few times: the engine's seeded thread order interleaves the lanes differently.
  DevBuf<float> out(64);
  for (int i = 0; i < 8; ++i) DTK_LAUNCH(4, 64, 0, 0, shuffle_then_mma_kernel)(out.p);
  const Outcome o = finish();
  REQUIRE_MESSAGE(o.err == cudaSuccess, o.detail);
  const std::vector<float> r = out.get();
  // D[g][2q] = C + sum_k 1 * 1 = v + 16, where lane l's own C is v (lanes < 16: l + (l ^ 1)).
  for (int t = 0; t < 64; ++t) {
    const int l = t % 32;
    CHECK(r[t] == static_cast<float>(l < 16 ? l + (l ^ 1) : l) + 16.0f);
  }
}

// ----------------------------------------------------------------------------
TEST_CASE("error: a lane skips the mma and exits") {
  DevBuf<float> out(32);
  DTK_LAUNCH(1, 32, 0, 0, mma_lane_exits_kernel)(out.p);
  const Outcome o = finish();
  CHECK(o.err == cudaErrorLaunchFailure);
  CHECK(has(o.detail, "mma_lane_exits_kernel"));
  CHECK(has(o.detail, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "thread (5,0,0)"));
  CHECK(has(o.detail, "exited"));
}

TEST_CASE("error: lanes of a warp at mma calls on different lines") {
  DevBuf<float> out(32);
  DTK_LAUNCH(1, 32, 0, 0, mma_two_sites_kernel)(out.p);
  const Outcome o = finish();
  CHECK(o.err == cudaErrorLaunchFailure);
  CHECK(has(o.detail, "different warp instructions"));
  CHECK(has(o.detail, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, at_line(g_line_b)));
}

TEST_CASE("error: ldmatrix in the partial last warp of a 48-thread block") {
  DevBuf<uint32_t> out(48);
  DTK_LAUNCH(1, 48, 0, 0, ldmatrix_partial_warp_kernel)(out.p);
  const Outcome o = finish();
  CHECK(o.err == cudaErrorLaunchFailure);
  CHECK(has(o.detail, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "partial warp"));
  CHECK(has(o.detail, "warp 1 has only lanes 0-15"));
}

TEST_CASE("error: a misaligned ldmatrix row address") {
  DevBuf<uint32_t> out(32);
  DTK_LAUNCH(1, 32, 16 * 16 * sizeof(uint16_t), 0, ldmatrix_misaligned_kernel)(out.p);
  const Outcome o = finish();
  CHECK(o.err == cudaErrorMisalignedAddress);
  CHECK(has(o.detail, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"));
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "thread (3,0,0)"));
  CHECK(has(o.detail, "not 16-byte aligned"));
}

TEST_CASE("error: ldmatrix row addresses in global memory or on the stack") {
  DevBuf<uint16_t> global(16 * 8);
  DevBuf<uint32_t> out(32);
  DTK_LAUNCH(1, 32, 0, 0, ldmatrix_global_kernel)(out.p, global.p);
  Outcome o = finish();
  CHECK(o.err == cudaErrorIllegalAddress);
  CHECK(has(o.detail, "ldmatrix_global_kernel"));
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "is in global memory"));
  CHECK(has(o.detail, "not shared memory"));
  DTK_LAUNCH(1, 32, 0, 0, ldmatrix_stack_kernel)(out.p);
  o = finish();
  CHECK(o.err == cudaErrorIllegalAddress);
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "on the thread's stack"));
}

TEST_CASE("error: cp.async from pinned host memory, into global memory, from a misaligned or too short source") {
  uint4* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 32 * sizeof(uint4)) == cudaSuccess);
  DevBuf<uint32_t> dev(32 * 4), global(32 * 4);
  const auto* src = reinterpret_cast<const uint4*>(dev.p);
  auto* dst = reinterpret_cast<uint4*>(global.p);

  DTK_LAUNCH(1, 32, 32 * 16, 0, cp_async_bad_kernel)(0, pinned, dst);
  Outcome o = finish();
  CHECK(o.err == cudaErrorIllegalAddress);
  CHECK(has(o.detail, "cp.async.cg.shared.global"));
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "global source"));
  CHECK(has(o.detail, "pinned host memory"));

  DTK_LAUNCH(1, 32, 32 * 16, 0, cp_async_bad_kernel)(1, src, dst);
  o = finish();
  CHECK(o.err == cudaErrorIllegalAddress);
  CHECK(has(o.detail, "shared destination"));
  CHECK(has(o.detail, "is in global memory"));

  DTK_LAUNCH(1, 32, 32 * 16, 0, cp_async_bad_kernel)(2, src, dst);
  o = finish();
  CHECK(o.err == cudaErrorMisalignedAddress);
  CHECK(has(o.detail, "global source"));
  CHECK(has(o.detail, "not 16-byte aligned"));

  DevBuf<uint8_t> short_src(24);  // a 16-byte copy from offset 16 crosses its end
  DTK_LAUNCH(1, 32, 32 * 16, 0, cp_async_bad_kernel)(3, reinterpret_cast<const uint4*>(short_src.p), dst);
  o = finish();
  CHECK(o.err == cudaErrorIllegalAddress);
  CHECK(has(o.detail, at_line(g_line_a)));
  CHECK(has(o.detail, "fewer than 16 readable bytes (offset 16 of a 24-byte allocation)"));
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
}
