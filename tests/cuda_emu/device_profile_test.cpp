// The card profiles (CUDA_EMU_DEVICE): each reports its documented limits through
// cudaGetDeviceProperties and cudaDeviceGetAttribute, and enforces its shared-memory opt-in
// limit as the runtime does (cudaFuncSetAttribute above it and a launch above the function's
// allowance fail with cudaErrorInvalidValue). ctest runs this suite once per profile, and
// once with an unknown name, which must leave the process without devices.
#include <cuda_runtime.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#define LAUNCH(grid, block, smem, stream, ...) \
  ::cuda_emu::launch(#__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream, __VA_ARGS__)

namespace {

__global__ void smem_kernel(float* out) {
  float* s = static_cast<float*>(::cuda_emu::dynamic_smem());
  s[threadIdx.x] = 2.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[blockDim.x - 1];
}

// What the CUDA C Programming Guide's per-compute-capability table documents (opt-in
// shared memory per block, shared memory per SM, resident threads and blocks per SM) and
// the datasheets' SM counts: written out here independently of device_profile.cpp.
struct Expect {
  const char* key;
  int major, minor, sms, optin, per_sm, threads_sm, blocks_sm;
};
constexpr Expect EXPECT[] = {
    {"a100", 8, 0, 108, 166912, 167936, 2048, 32},  {"l40s", 8, 9, 142, 101376, 102400, 1536, 24},
    {"h100", 9, 0, 132, 232448, 233472, 2048, 32},  {"h200", 9, 0, 132, 232448, 233472, 2048, 32},
    {"b200", 10, 0, 148, 232448, 233472, 2048, 32},
};

const char* profile_env() {
  const char* e = std::getenv("CUDA_EMU_DEVICE");
  return e && *e ? e : "h100";
}

const Expect* expected() {
  for (const Expect& x : EXPECT)
    if (std::strcmp(x.key, profile_env()) == 0) return &x;
  return nullptr;
}

int attr(cudaDeviceAttr a) {
  int v = -1;
  REQUIRE(cudaDeviceGetAttribute(&v, a, 0) == cudaSuccess);
  return v;
}

}  // namespace

TEST_CASE("cuda_emu profile: the card's documented limits, from properties and attributes") {
  const Expect* x = expected();
  if (!x) {
    // An unknown CUDA_EMU_DEVICE: no device at all, never a silent default.
    int n = -1;
    CHECK(cudaGetDeviceCount(&n) == cudaErrorNoDevice);
    CHECK(n == 0);
    int v = 0;
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaErrorNoDevice);
    (void)cudaGetLastError();
    return;
  }
  INFO("CUDA_EMU_DEVICE=", x->key);
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(std::string(p.name).find("cuda_emu") != std::string::npos);
  CHECK(p.major == x->major);
  CHECK(p.minor == x->minor);
  CHECK(p.multiProcessorCount == x->sms);
  CHECK(p.sharedMemPerBlock == 48 * 1024);
  CHECK(p.sharedMemPerBlockOptin == static_cast<size_t>(x->optin));
  CHECK(p.sharedMemPerMultiprocessor == static_cast<size_t>(x->per_sm));
  CHECK(p.regsPerMultiprocessor == 65536);
  CHECK(p.regsPerBlock == 65536);
  CHECK(p.maxThreadsPerBlock == 1024);
  CHECK(p.maxThreadsPerMultiProcessor == x->threads_sm);
  CHECK(p.maxBlocksPerMultiProcessor == x->blocks_sm);
  size_t free_b = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total) == cudaSuccess);
  CHECK(total == p.totalGlobalMem);
  // cudaDeviceGetAttribute answers the same numbers.
  CHECK(attr(cudaDevAttrMaxSharedMemoryPerBlockOptin) == x->optin);
  CHECK(attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor) == x->per_sm);
  CHECK(attr(cudaDevAttrMaxSharedMemoryPerBlock) == 48 * 1024);
  CHECK(attr(cudaDevAttrMultiProcessorCount) == x->sms);
  CHECK(attr(cudaDevAttrComputeCapabilityMajor) == x->major);
  CHECK(attr(cudaDevAttrComputeCapabilityMinor) == x->minor);
  CHECK(attr(cudaDevAttrMaxThreadsPerMultiProcessor) == x->threads_sm);
  CHECK(attr(cudaDevAttrMaxBlocksPerMultiprocessor) == x->blocks_sm);
  CHECK(attr(cudaDevAttrMaxRegistersPerMultiprocessor) == 65536);
  CHECK(attr(cudaDevAttrMaxRegistersPerBlock) == 65536);
  CHECK(attr(cudaDevAttrMaxThreadsPerBlock) == 1024);
  CHECK(attr(cudaDevAttrWarpSize) == 32);
  int v = 0;
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 99) == cudaErrorInvalidDevice);
  CHECK(cudaDeviceGetAttribute(nullptr, cudaDevAttrWarpSize, 0) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_CASE("cuda_emu profile: dynamic shared memory up to the card's opt-in limit and no further") {
  const Expect* x = expected();
  if (!x) return;  // no device (the case above checks that)
  INFO("CUDA_EMU_DEVICE=", x->key);
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)) == cudaSuccess);
  // Above the opt-in limit the attribute itself is refused, and the allowance stays 48 KB.
  CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, x->optin + 1) ==
        cudaErrorInvalidValue);
  (void)cudaGetLastError();
  LAUNCH(1, 64, 48 * 1024 + 4, nullptr, smem_kernel)(d);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  // At the limit: allowed once raised, and the kernel runs.
  REQUIRE(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, x->optin) == cudaSuccess);
  LAUNCH(1, 64, x->optin, nullptr, smem_kernel)(d);
  CHECK(cudaGetLastError() == cudaSuccess);
  float h = 0;
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h == 2.0f);
  // More than the function's allowance is refused at launch.
  REQUIRE(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess);
  LAUNCH(1, 64, 64 * 1024 + 4, nullptr, smem_kernel)(d);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(std::string(cuda_emu::last_error_detail()).find("smem_kernel") != std::string::npos);
  cuda_emu::test_clear_errors();
  cudaFree(d);
}
