// CudaRuntime (cuda_rt.h): the compute stream, events, memory, copies and graphs of one
// CUDA device. Compiled in CUDA trees only (the module's GLUE).
#ifdef DTRAIN_HAVE_CUDA
#include "device/cuda_rt.h"

#include "core/check.h"
#include "core/cuda_check.h"
#ifndef DTRAIN_CUDA_EMU
#include "cublaslt/lazy.h"
#endif
#include "kernels/device.cuh"

#include <cstdint>
#include <string>

namespace dtrain::device {

CudaRuntime::CudaRuntime(int index) : index_(index) {
  DT_CUDA_CHECK(cudaSetDevice(index_));
#ifndef DTRAIN_CUDA_EMU
  // cuBLASLt is loaded on first use (lib/cublaslt/lazy.h): a node without it fails here,
  // naming the files tried, rather than at its first GEMM with a bare status code.
  if (!cublaslt::ensure_loaded()) throw DeviceError("cuda:" + std::to_string(index_) + ": " + cublaslt::load_error());
#endif
  name_ = "cuda:" + std::to_string(index_) + " (" + kernels::device_describe(index_) + ")";
  // alloc/free and the kernels' scratch are stream-ordered allocations from the
  // device's default pool, which by default hands every freed byte back to the OS at
  // the next synchronisation (release threshold 0) and maps it again on the next
  // allocation. Every step synchronises (the loss read-back), so keep what it holds.
  cudaMemPool_t pool = nullptr;
  DT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
  uint64_t keep = UINT64_MAX;
  DT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
  s_ = own_;
}

CudaRuntime::~CudaRuntime() {
  (void)cudaSetDevice(index_);
  (void)cudaStreamSynchronize(own_);
  (void)cudaStreamDestroy(own_);
}

void CudaRuntime::cur() const { DT_CUDA_CHECK(cudaSetDevice(index_)); }

void* CudaRuntime::use_stream(void* stream) {
  void* prev = s_ == own_ ? nullptr : s_;
  s_ = stream != nullptr ? static_cast<cudaStream_t>(stream) : own_;
  return prev;
}

std::unique_ptr<Runtime::Event> CudaRuntime::event_create() {
  cur();
  auto ev = std::make_unique<CudaEvent>();
  DT_CUDA_CHECK(cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming));
  return ev;
}

void CudaRuntime::event_record(Event& e, void* stream) {
  cur();
  DT_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(e).e, stream ? static_cast<cudaStream_t>(stream) : own_));
}

void CudaRuntime::stream_wait(void* stream, Event& e) {
  cur();
  DT_CUDA_CHECK(
      cudaStreamWaitEvent(stream ? static_cast<cudaStream_t>(stream) : own_, static_cast<CudaEvent&>(e).e, 0));
}

// Stream-ordered (the pool reuses memory without a device-wide wait), zeroed on the
// same stream: a cudaMemset on the legacy stream would not be ordered before work on
// a non-blocking stream.
void* CudaRuntime::alloc(size_t bytes) {
  cur();
  void* p = nullptr;
  DT_CUDA_CHECK(cudaMallocAsync(&p, bytes, s_));
  DT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s_));
  return p;
}

void CudaRuntime::free(void* p) {
  cur();
  (void)cudaFreeAsync(p, s_);
}

Runtime::MemoryStats CudaRuntime::memory_stats() {
  cur();
  cudaMemPool_t pool = nullptr;
  DT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
  uint64_t used = 0, peak = 0, reserved = 0;
  DT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  DT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak));
  DT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return {static_cast<size_t>(used), static_cast<size_t>(peak), static_cast<size_t>(reserved)};
}

void CudaRuntime::memory_peak_reset() {
  cur();
  cudaMemPool_t pool = nullptr;
  DT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
  uint64_t zero = 0;  // the high-water mark starts again from the bytes in use now
  DT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

// The source may be pageable: wait until the stream has consumed it.
void CudaRuntime::copy_h2d(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  cur();
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_));
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
}

void CudaRuntime::copy_d2h(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  cur();
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_));
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
}

// Pinned memory comes from cudaMallocHost (so the DMA engine reads it without staging
// and copies from it are truly asynchronous); pageable from the base class.
void* CudaRuntime::host_alloc(size_t bytes, bool pinned) {
  if (!pinned || !bytes) return Runtime::host_alloc(bytes, pinned);
  cur();
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    DT_THROW(DeviceError,
             "{}: cannot pin {:.2f} GiB of host memory (cudaMallocHost: {}); set "
             "zero_optimization.offload_optimizer.pin_memory (and offload_param.pin_memory) to false, or free "
             "host memory",
             name(), static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), cudaGetErrorString(e));
  }
  device::cpu().zero(p, bytes);  // across the CPU's pool
  return p;
}

void CudaRuntime::host_free(void* p, bool pinned) {
  if (!pinned) return Runtime::host_free(p, pinned);
  if (p) (void)cudaFreeHost(p);
}

void CudaRuntime::copy_h2d_async(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  cur();
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_));
}

void CudaRuntime::copy_d2h_async(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  cur();
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_));
}

void CudaRuntime::event_synchronize(Event& e) {
  cur();
  DT_CUDA_CHECK(cudaEventSynchronize(static_cast<CudaEvent&>(e).e));
}

void CudaRuntime::copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (!rows || !width) return;
  cur();
  DT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s_));
}

void CudaRuntime::copy_d2d(void* dst, const void* src, size_t bytes) {
  if (!bytes || dst == src) return;
  cur();
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_));
}

void CudaRuntime::zero(void* p, size_t bytes) {
  if (!bytes) return;
  cur();
  DT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s_));
}

void CudaRuntime::synchronize() {
  cur();
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
}

bool CudaRuntime::graph_begin() {
  cur();
  DT_CUDA_CHECK(cudaStreamBeginCapture(own_, cudaStreamCaptureModeThreadLocal));
  return true;
}

std::unique_ptr<Runtime::Graph> CudaRuntime::graph_end() {
  cur();
  auto graph = std::make_unique<CudaGraph>();
  const cudaError_t e = cudaStreamEndCapture(own_, &graph->g);
  if (e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureUnsupported ||
      e == cudaErrorStreamCaptureUnjoined) {
    (void)cudaGetLastError();  // not sticky: the stream is usable again
    return nullptr;
  }
  DT_CUDA_CHECK(e);
  DT_CUDA_CHECK(cudaGraphInstantiate(&graph->x, graph->g, 0));
  return graph;
}

void CudaRuntime::graph_launch(Graph& g) {
  cur();
  DT_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph&>(g).x, own_));
}

}  // namespace dtrain::device

#endif  // DTRAIN_HAVE_CUDA
