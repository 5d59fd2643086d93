// The engine's runtime semantics: poisoned allocations, copy-kind checks, stream order,
// the legacy default stream, events, launch limits, guard pages, and the adversarial
// scheduler exposing missing synchronisation (including the pageable-copy race that
// lib/gpu's arena upload had).
#include <cuda_runtime.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define LAUNCH(grid, block, smem, stream, ...) \
  ::cuda_emu::launch(#__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream, __VA_ARGS__)

namespace {

__global__ void fill_kernel(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
__global__ void copy_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
__global__ void write_at_kernel(float* p, int i, float v) { p[i] = v; }
__global__ void big_smem_kernel(float* out) {
  float* s = static_cast<float*>(::cuda_emu::dynamic_smem());
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[blockDim.x - 1];
}

std::vector<float> download(const float* d, int n) {
  std::vector<float> h(n);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

bool all_equal(const std::vector<float>& v, float x) {
  for (float f : v)
    if (!(f == x)) return false;
  return true;
}
bool all_nan(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isnan(f)) return false;
  return true;
}

// Clears what an error test left behind (a real context would be lost).
struct ClearErrors {
  ~ClearErrors() { cuda_emu::test_clear_errors(); }
};

}  // namespace

TEST_CASE("cuda_emu: devices report H100 limits and a name that says it is the engine") {
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  CHECK(n >= 2);
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(std::string(p.name).find("cuda_emu") != std::string::npos);
  CHECK(p.major == 9);
  CHECK(p.maxThreadsPerBlock == 1024);
  CHECK(p.maxGridSize[1] == 65535);
  CHECK(p.sharedMemPerBlockOptin == 227 * 1024);
  CHECK(cudaSetDevice(n) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky: read and reset
}

TEST_CASE("cuda_emu: fresh device memory is poisoned with NaN bytes, not zeroed") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 1000 * sizeof(float)) == cudaSuccess);
  CHECK(reinterpret_cast<uintptr_t>(d) % 256 == 0);
  CHECK(all_nan(download(d, 1000)));
  size_t free_b = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total) == cudaSuccess);
  CHECK(total - free_b >= 4000);
  REQUIRE(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);  // double free
}

TEST_CASE("cuda_emu: copies check their kind and extent") {
  ClearErrors clear;
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)) == cudaSuccess);
  std::vector<float> h(128, 1.0f);
  CHECK(cudaMemcpy(h.data(), d, 64 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // reversed
  CHECK(cudaMemcpy(d, h.data(), 65 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // past the end
  CHECK(cudaMemset(d + 60, 0, 5 * sizeof(float)) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h.data(), 64 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(all_equal(download(d, 64), 1.0f));
  (void)cudaGetLastError();
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("cuda_emu: work on one stream runs in order; 2-D copies and memsets") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float *a = nullptr, *b = nullptr;
  const int n = 3000;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&a), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&b), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(a, 0, n * sizeof(float), s) == cudaSuccess);
  LAUNCH((n + 255) / 256, 256, 0, s, fill_kernel)(a, n / 2, 2.0f);
  LAUNCH((n + 255) / 256, 256, 0, s, copy_kernel)(b, a, n);
  // rows of 10 floats out of rows of 30: the middle third of every row of b becomes 7.
  std::vector<float> sevens(n, 7.0f);
  REQUIRE(cudaMemcpy2DAsync(b + 10, 30 * sizeof(float), sevens.data(), 30 * sizeof(float), 10 * sizeof(float), n / 30,
                            cudaMemcpyHostToDevice, s) == cudaSuccess);
  std::vector<float> h(n);
  REQUIRE(cudaMemcpyAsync(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  for (int i = 0; i < n; ++i) {
    const float want = (i % 30 >= 10 && i % 30 < 20) ? 7.0f : i < n / 2 ? 2.0f : 0.0f;
    REQUIRE(h[i] == want);
  }
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  cudaFree(a);
  cudaFree(b);
}

TEST_CASE("cuda_emu: the scheduler exposes a missing cross-stream synchronisation, events fix it") {
  cudaStream_t producer, consumer;
  REQUIRE(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
  const int n = 512;
  float *buf = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)) == cudaSuccess);

  // The race: nothing orders the consumer after the producer. Held-back work means the
  // consumer reads the poisoned buffer.
  LAUNCH(2, 256, 0, producer, fill_kernel)(buf, n, 5.0f);
  LAUNCH(2, 256, 0, consumer, copy_kernel)(out, buf, n);
  REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(all_nan(h));
  REQUIRE(cudaStreamSynchronize(producer) == cudaSuccess);

  // Ordered through an event: the consumer sees the producer's values.
  cudaEvent_t ready;
  REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess);
  LAUNCH(2, 256, 0, producer, fill_kernel)(buf, n, 6.0f);
  REQUIRE(cudaEventRecord(ready, producer) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(consumer, ready, 0) == cudaSuccess);
  LAUNCH(2, 256, 0, producer, fill_kernel)(buf, n, 9.0f);  // after the record: not waited for
  LAUNCH(2, 256, 0, consumer, copy_kernel)(out, buf, n);
  REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
  REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(all_equal(h, 6.0f));
  CHECK(cudaEventQuery(ready) == cudaSuccess);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, ready, ready) == cudaErrorInvalidResourceHandle);  // timing disabled
  (void)cudaGetLastError();
  cudaDeviceSynchronize();
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
  cudaFree(buf);
  cudaFree(out);
}

TEST_CASE("cuda_emu: the legacy default stream orders blocking streams, not non-blocking ones") {
  cudaStream_t blocking, nonblocking;
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking) == cudaSuccess);
  const int n = 256;
  float *buf = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> h(n);

  LAUNCH(1, 256, 0, nullptr, fill_kernel)(buf, n, 3.0f);  // legacy stream
  LAUNCH(1, 256, 0, blocking, copy_kernel)(out, buf, n);  // implicitly after it
  REQUIRE(cudaStreamSynchronize(blocking) == cudaSuccess);
  REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(all_equal(h, 3.0f));

  LAUNCH(1, 256, 0, nullptr, fill_kernel)(buf, n, 4.0f);     // legacy stream
  LAUNCH(1, 256, 0, nonblocking, copy_kernel)(out, buf, n);  // NOT ordered after it
  REQUIRE(cudaStreamSynchronize(nonblocking) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, nonblocking) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(nonblocking) == cudaSuccess);
  CHECK(all_equal(h, 3.0f));  // the old value: the legacy fill was held back
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
  cudaFree(buf);
  cudaFree(out);
}

TEST_CASE("cuda_emu: a pageable cudaMemcpy is not ordered before a non-blocking stream's work") {
  // lib/gpu's old arena set-up: zero with cudaMemset and upload with a pageable
  // cudaMemcpy on the legacy stream, then compute on a cudaStreamNonBlocking stream.
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const int n = 256;
  float *w = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&w), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)) == cudaSuccess);
  std::vector<float> weights(n, 0.5f), h(n);
  REQUIRE(cudaMemcpy(w, weights.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  weights.assign(n, -1.0f);  // the call returned: the host buffer may be reused at once
  LAUNCH(1, 256, 0, s, copy_kernel)(out, w, n);
  REQUIRE(cudaMemcpyAsync(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(all_nan(h));  // the upload's DMA was still pending
  // Ordered properly (the legacy stream synchronised first), the weights arrive.
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  LAUNCH(1, 256, 0, s, copy_kernel)(out, w, n);
  REQUIRE(cudaMemcpyAsync(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(all_equal(h, 0.5f));
  cudaStreamDestroy(s);
  cudaFree(w);
  cudaFree(out);
}

TEST_CASE("cuda_emu: stream queries make progress; async copies read host memory when they run") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)) == cudaSuccess);
  std::vector<float> src(64, 1.0f);
  REQUIRE(cudaMemcpyAsync(d, src.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  src.assign(64, 2.0f);  // a bug in real code: the copy may not have read it yet
  // Polling alone must get the work done (bounded: 10 s).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  cudaError_t q;
  while ((q = cudaStreamQuery(s)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  CHECK(q == cudaSuccess);
  CHECK(all_equal(download(d, 64), 2.0f));  // the engine reads at execution time: the bug shows
  cudaStreamDestroy(s);
  cudaFree(d);
}

TEST_CASE("cuda_emu: launches over the device limits fail and name the kernel and the line") {
  ClearErrors clear;
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 4096 * sizeof(float)) == cudaSuccess);
  const int line = __LINE__ + 1;
  LAUNCH(1, 1025, 0, nullptr, fill_kernel)(d, 1, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  const std::string detail = cuda_emu::last_error_detail();
  CHECK(detail.find("fill_kernel") != std::string::npos);
  CHECK(detail.find("runtime_test.cpp:" + std::to_string(line)) != std::string::npos);
  LAUNCH(dim3(1, 65536), 32, 0, nullptr, fill_kernel)(d, 1, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  LAUNCH(1, dim3(32, 32, 2), 0, nullptr, fill_kernel)(d, 1, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  // Dynamic shared memory: 48 KB without opt-in, up to 227 KB with it.
  LAUNCH(1, 64, 49 * 1024, nullptr, big_smem_kernel)(d);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
        cudaErrorInvalidValue);
  (void)cudaGetLastError();
  REQUIRE(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) ==
          cudaSuccess);
  LAUNCH(1, 64, 100 * 1024, nullptr, big_smem_kernel)(d);
  CHECK(cudaGetLastError() == cudaSuccess);
  std::vector<float> h = download(d, 1);
  CHECK(h[0] == 1.0f);
  // A pointer argument into host memory.
  std::vector<float> host(16);
  LAUNCH(1, 16, 0, nullptr, fill_kernel)(host.data(), 16, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(std::string(cuda_emu::last_error_detail()).find("not device memory") != std::string::npos);
  cudaFree(d);
}

TEST_CASE("cuda_emu: a kernel writing past its allocation is an illegal address that names it") {
  ClearErrors clear;
  float* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 1024 * sizeof(float)) == cudaSuccess);  // ends at a guard page
  LAUNCH(1, 1, 0, nullptr, write_at_kernel)(d, 1024, 1.0f);
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // sticky
  std::string detail = cuda_emu::last_error_detail();
  CHECK(detail.find("write_at_kernel") != std::string::npos);
  cuda_emu::test_clear_errors();
  // Within the 256-byte rounding (no guard page there): the canary check catches it.
  float* e = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&e), 10 * sizeof(float)) == cudaSuccess);
  LAUNCH(1, 1, 0, nullptr, write_at_kernel)(e, 10, 1.0f);
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  detail = cuda_emu::last_error_detail();
  CHECK(detail.find("past the end of the 40-byte allocation") != std::string::npos);
  cuda_emu::test_clear_errors();
  // Stream-ordered free: use after cudaFreeAsync faults.
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* t = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&t), 256 * sizeof(float), s) == cudaSuccess);
  LAUNCH(1, 256, 0, s, fill_kernel)(t, 256, 1.0f);
  REQUIRE(cudaFreeAsync(t, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  LAUNCH(1, 1, 0, s, write_at_kernel)(t, 0, 1.0f);  // t is no longer an allocation
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  cudaStreamDestroy(s);
  cudaFree(d);
  cudaFree(e);
}

TEST_CASE("cuda_emu: each device's default memory pool; freed memory stays reserved up to the release threshold") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(count >= 2);
  cudaMemPool_t p0 = nullptr, p1 = nullptr, again = nullptr;
  REQUIRE(cudaDeviceGetDefaultMemPool(&p0, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetDefaultMemPool(&p1, 1) == cudaSuccess);
  REQUIRE(cudaDeviceGetDefaultMemPool(&again, 1) == cudaSuccess);
  CHECK(p0 != nullptr);
  CHECK(p0 != p1);
  CHECK(p1 == again);
  // Arguments the documentation rules out.
  CHECK(cudaDeviceGetDefaultMemPool(nullptr, 0) == cudaErrorInvalidValue);
  CHECK(cudaDeviceGetDefaultMemPool(&again, count) == cudaErrorInvalidDevice);
  CHECK(cudaDeviceGetDefaultMemPool(&again, -1) == cudaErrorInvalidDevice);
  uint64_t v = 0;
  int flag = 0;
  CHECK(cudaMemPoolGetAttribute(p1, cudaMemPoolAttrReleaseThreshold, nullptr) == cudaErrorInvalidValue);
  CHECK(cudaMemPoolGetAttribute(reinterpret_cast<cudaMemPool_t>(&v), cudaMemPoolAttrReleaseThreshold, &v) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrUsedMemCurrent, &v) == cudaErrorInvalidValue);      // read-only
  CHECK(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrReservedMemCurrent, &v) == cudaErrorInvalidValue);  // read-only
  v = 5;
  CHECK(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrUsedMemHigh, &v) == cudaErrorInvalidValue);  // only reset to 0
  CHECK(cudaMemPoolSetAttribute(p1, static_cast<cudaMemPoolAttr>(0x42), &v) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  // Documented defaults: threshold 0, every reuse policy enabled.
  REQUIRE(cudaMemPoolGetAttribute(p1, cudaMemPoolAttrReleaseThreshold, &v) == cudaSuccess);
  CHECK(v == 0);
  for (cudaMemPoolAttr a : {cudaMemPoolReuseFollowEventDependencies, cudaMemPoolReuseAllowOpportunistic,
                            cudaMemPoolReuseAllowInternalDependencies}) {
    REQUIRE(cudaMemPoolGetAttribute(p1, a, &flag) == cudaSuccess);
    CHECK(flag == 1);
  }
  flag = 0;
  REQUIRE(cudaMemPoolSetAttribute(p1, cudaMemPoolReuseAllowOpportunistic, &flag) == cudaSuccess);
  REQUIRE(cudaMemPoolGetAttribute(p1, cudaMemPoolReuseAllowOpportunistic, &flag) == cudaSuccess);
  CHECK(flag == 0);

  // Accounting on device 1 (no other test allocates there asynchronously).
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  auto attr = [&](cudaMemPoolAttr a) {
    uint64_t x = ~0ull;
    REQUIRE(cudaMemPoolGetAttribute(p1, a, &x) == cudaSuccess);
    return x;
  };
  const uint64_t MB = 1 << 20;
  void* a = nullptr;
  REQUIRE(cudaMallocAsync(&a, MB, s) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrUsedMemCurrent) == MB);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == MB);
  // Threshold 0: the synchronisation after the free hands everything back to the OS.
  REQUIRE(cudaFreeAsync(a, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrUsedMemCurrent) == 0);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == 0);
  CHECK(attr(cudaMemPoolAttrUsedMemHigh) == MB);
  CHECK(attr(cudaMemPoolAttrReservedMemHigh) == MB);
  // UINT64_MAX: the pool keeps what it has, and a new allocation reuses it.
  v = UINT64_MAX;
  REQUIRE(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrReleaseThreshold, &v) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrReleaseThreshold) == UINT64_MAX);
  REQUIRE(cudaMallocAsync(&a, 2 * MB, s) == cudaSuccess);
  REQUIRE(cudaFreeAsync(a, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrUsedMemCurrent) == 0);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == 2 * MB);
  REQUIRE(cudaMallocAsync(&a, MB, s) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == 2 * MB);
  // A threshold between: a synchronisation trims down to it, never below what is in use.
  v = MB + MB / 2;
  REQUIRE(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrReleaseThreshold, &v) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == MB + MB / 2);
  v = 0;
  REQUIRE(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrReleaseThreshold, &v) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == MB);
  // Resetting a high watermark brings it down to the current amount.
  REQUIRE(cudaMemPoolSetAttribute(p1, cudaMemPoolAttrUsedMemHigh, &v) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrUsedMemHigh) == MB);
  REQUIRE(cudaFreeAsync(a, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(attr(cudaMemPoolAttrReservedMemCurrent) == 0);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}
