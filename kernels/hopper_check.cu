// The sm_90 tile-GEMM check (kernels/hopper_check.cuh). One block of one warpgroup: thread
// 0 initialises an mbarrier and announces the operands' bytes, every thread issues 16-byte
// bulk copies of A and B rows into the K-major shared layout (no swizzle: 8-row x 16-byte
// core matrices, LBO 128, SBO 256, one k16 slice after another; 128B swizzle: 128-byte rows
// of 64 k values whose 16-byte chunks are XORed with the row index mod 8, SBO 1024), all
// wait for the phase, then k / 16 chained wgmma m64nNk16 produce D, stored from the
// accumulator fragment (kernels/hopper.cuh). Built for sm_80 the kernel traps at its first
// instruction; for sm_90 (the compute_90 PTX) at its first wgmma (an sm_90a feature): only
// the sm_90a image, which kernels/CMakeLists.txt builds where 90 is configured (defining
// DTRAIN_ATTN_SM90A), and the CPU execution engine run it through.
#include "kernels/hopper_check.cuh"

#include "kernels/common.cuh"
#include "kernels/hopper.cuh"

namespace dtrain::kernels {

namespace {
using namespace detail;

constexpr int THREADS = 128;
constexpr size_t SMEM_PAD = 2048;  // the barrier, then the operands from a 1024-byte boundary

template <typename T, int N>
__global__ void __launch_bounds__(THREADS)
    hopper_tile_gemm_kernel(const T* __restrict__ a, const T* __restrict__ b, float* __restrict__ d, int k, bool swz) {
  DTK_EXTERN_SHARED(char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  char* ops = smem + (1024 - shared_addr(smem) % 1024) % 1024 + 1024;
  const uint32_t abytes = 64u * static_cast<uint32_t>(k) * 2, bbytes = static_cast<uint32_t>(N * k) * 2;
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, abytes + bbytes);
  const int chunks = k / 8;
  for (int i = static_cast<int>(threadIdx.x); i < (64 + N) * chunks; i += THREADS) {
    const bool is_a = i < 64 * chunks;
    const int j = is_a ? i : i - 64 * chunks, r = j / chunks, c = j % chunks, rows = is_a ? 64 : N;
    const T* src = (is_a ? a : b) + static_cast<size_t>(r) * k + 8 * c;
    // 16-byte chunk c (k = 8c..8c+7) of row r
    const int at = swz ? (c / 8) * rows * 128 + (r / 8) * 1024 + (r % 8) * 128 + ((c % 8) ^ (r % 8)) * 16
                       : (c / 2) * (rows / 8) * 256 + (r / 8) * 256 + (c % 2) * 128 + (r % 8) * 16;
    char* dst = ops + (is_a ? 0u : abytes) + at;
    bulk_copy_g2s(dst, src, 16, bar);
  }
  while (!mbarrier_try_wait_parity(bar, 0)) {
  }
  float acc[N / 2];
  const WgmmaSwizzle mode = swz ? WgmmaSwizzle::B128 : WgmmaSwizzle::NONE;
  const uint32_t sbo = swz ? 1024 : 256;
  wgmma_fence();
  for (int s = 0; s < k / 16; ++s) {
    // slice s: in the swizzled layout, 32 bytes into its 64-k atom column; else its own slab
    const uint32_t at_a = swz ? (s / 4) * 64 * 128 + (s % 4) * 32 : s * 8 * 256;
    const uint32_t at_b = swz ? (s / 4) * N * 128 + (s % 4) * 32 : s * (N / 8) * 256;
    wgmma_m64k16<T, N>(acc, wgmma_desc(ops + at_a, 128, sbo, mode), wgmma_desc(ops + abytes + at_b, 128, sbo, mode),
                       s > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  const int t = static_cast<int>(threadIdx.x), w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * q + (i & 1)] = acc[i];
  __syncthreads();
  if (threadIdx.x == 0) mbarrier_inval(bar);
}

template <typename T, int N>
void tile_gemm_launch(const void* a, const void* b, float* d, int k, bool swz, cudaStream_t stream) {
  const size_t bytes = SMEM_PAD + static_cast<size_t>(64 + N) * k * 2;
  auto kernel = hopper_tile_gemm_kernel<T, N>;
  if (bytes > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  DTK_LAUNCH(1, THREADS, bytes, stream, hopper_tile_gemm_kernel<T, N>)
  (static_cast<const T*>(a), static_cast<const T*>(b), d, k, swz);
  DT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void tile_gemm_dispatch(const void* a, const void* b, float* d, int n, int k, bool swz, cudaStream_t stream) {
  if (n == 64) tile_gemm_launch<T, 64>(a, b, d, k, swz, stream);
  if (n == 128) tile_gemm_launch<T, 128>(a, b, d, k, swz, stream);
  if (n == 256) tile_gemm_launch<T, 256>(a, b, d, k, swz, stream);
}

}  // namespace

bool hopper_tile_gemm_has_sm90a() {
#if defined(DTRAIN_CUDA_EMU) || defined(DTRAIN_ATTN_SM90A)
  return true;
#else
  return false;
#endif
}

void hopper_tile_gemm(const void* a, const void* b, float* d, int n, int k, DType dtype, bool swizzle128,
                      cudaStream_t stream) {
  DTK_REQUIRE(n == 64 || n == 128 || n == 256, UsageError, "hopper_tile_gemm: n must be 64, 128 or 256");
  DTK_REQUIRE(k > 0 && k <= 256 && k % (swizzle128 ? 64 : 16) == 0, UsageError,
              "hopper_tile_gemm: k must be a multiple of 16 (of 64 with swizzle128) up to 256");
  DTK_REQUIRE(dtype == DType::BF16 || dtype == DType::F16, UsageError, "hopper_tile_gemm: dtype must be bf16 or fp16");
  if (dtype == DType::BF16) tile_gemm_dispatch<bf16>(a, b, d, n, k, swizzle128, stream);
  else tile_gemm_dispatch<fp16>(a, b, d, n, k, swizzle128, stream);
}

}  // namespace dtrain::kernels
