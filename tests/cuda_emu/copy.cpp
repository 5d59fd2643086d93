// CUDA execution engine: copies and memsets (cudaMemcpy*, cudaMemset*, 1D and 2D, sync
// and async). Each side is checked against the live allocations (a device pointer must
// lie inside one, a host pointer outside device memory), and the synchronous calls block
// or return early by CUDA's rules for pageable and pinned host memory.
#include "engine.h"
#include "runtime_internal.h"

#include <cuda_emu_trace.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace cuda_emu::rt {

namespace {

enum class Mem { HOST, PINNED, DEVICE };

Mem mem_kind(const void* p, size_t bytes, int* device) {
  auto a = alloc_find(p, bytes);
  if (!a) return Mem::HOST;
  if (device) *device = a->device;
  return a->pinned_host ? Mem::PINNED : Mem::DEVICE;
}

// Checks one side of a copy: device memory must be a live allocation covering the
// whole extent (a device pointer that overruns its allocation is an error, not a host
// pointer).
bool extent_ok(const void* p, size_t extent, bool want_device, int* device) {
  if (want_device) {
    auto a = alloc_find(p, extent);
    if (!a || a->pinned_host) return false;
    if (device) *device = a->device;
    return true;
  }
  auto a = alloc_find(p, 0);
  return !a || a->pinned_host;
}

// The stream a copy or memset runs on (the legacy stream for the synchronous calls) after
// the checks both make first; st().mu held. An error is also the thread's last error.
cudaError_t memop_stream_locked(cudaStream_t stream, bool sync_api, std::shared_ptr<Stream>* out) {
  auto sp = stream_locked(sync_api ? nullptr : stream);
  if (!sp) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = sticky_locked(sp->device)) return fail(e);
  if (sync_api)
    if (cudaError_t e = capture_unsafe_check_locked()) return fail(e);
  if (cudaError_t e = capture_gate_locked(sp)) return fail(e);
  *out = std::move(sp);
  return cudaSuccess;
}

struct Copy2D {
  char* dst;
  size_t dpitch;
  const char* src;
  size_t spitch, width, height;
  void run() const {
    for (size_t r = 0; r < height; ++r) std::memmove(dst + r * dpitch, src + r * spitch, width);
  }
};

cudaError_t copy_submit(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                        cudaMemcpyKind kind, cudaStream_t stream, bool sync_api) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (dpitch < width || spitch < width) return fail(cudaErrorInvalidValue);
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  const size_t dext = dpitch * (height - 1) + width, sext = spitch * (height - 1) + width;
  if (kind == cudaMemcpyDefault) {
    const bool dd = mem_kind(dst, 1, nullptr) == Mem::DEVICE, sd = mem_kind(src, 1, nullptr) == Mem::DEVICE;
    kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
              : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return fail(cudaErrorInvalidMemcpyDirection);
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  int ddev = -1, sdev = -1;
  if (!extent_ok(dst, dext, dst_dev, &ddev) || !extent_ok(src, sext, src_dev, &sdev)) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "cudaMemcpy%s: %s %p (%zu bytes) / %s %p (%zu bytes) do not match the copy kind %d (device pointers "
                  "must lie inside one live allocation, host pointers outside device memory)",
                  sync_api ? "" : "Async", "dst", dst, dext, "src", src, sext, static_cast<int>(kind));
    report(buf);
    return fail(cudaErrorInvalidValue);
  }
  const bool src_pinned = !src_dev && mem_kind(src, 1, nullptr) == Mem::PINNED;
  const bool dst_pinned = !dst_dev && mem_kind(dst, 1, nullptr) == Mem::PINNED;
  std::unique_lock<std::mutex> lock(st().mu);
  std::shared_ptr<Stream> sp;
  if (cudaError_t e = memop_stream_locked(stream, sync_api, &sp)) return e;
  Copy2D c{static_cast<char*>(dst), dpitch, static_cast<const char*>(src), spitch, width, height};
  if (sp->capture) {
    // Stricter than CUDA: a captured copy may touch host memory only when it is pinned
    // (pageable memory is read or written at every replay, long after the call).
    if ((!src_dev && !src_pinned) || (!dst_dev && !dst_pinned)) {
      capture_invalidate_locked(*sp->capture, cudaErrorStreamCaptureUnsupported);
      lock.unlock();
      report(
          "cudaMemcpyAsync during stream capture with pageable host memory (the engine requires pinned "
          "memory for copies in a graph)");
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    trace_memop(kind, width, height, sp->device);
    capture_record_locked(
        *sp, "cudaMemcpyAsync", [c] { c.run(); }, nullptr, false);
    return cudaSuccess;
  }
  trace_memop(kind, width, height, sp->device);
  if (!sync_api) {  // host memory is read/written when the copy runs, pinned or not
    enqueue_locked(
        sp, "cudaMemcpyAsync", [c] { c.run(); }, false);
    return cudaSuccess;
  }
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (!src_pinned) {
        // Pageable source: the stream is synchronised, the data staged, and the call
        // returns before the DMA to the device has completed.
        wait_locked(lock, sp->last);
        auto staged = std::make_shared<std::vector<char>>(sext);
        std::memcpy(staged->data(), src, sext);
        Copy2D s2 = c;
        s2.src = staged->data();
        enqueue_locked(
            sp, "cudaMemcpy (pageable HtoD DMA)", [s2, staged] { s2.run(); }, false);
        return cudaSuccess;
      }
      wait_locked(lock, enqueue_locked(
                            sp, "cudaMemcpy HtoD", [c] { c.run(); }, false));
      return cudaSuccess;
    case cudaMemcpyDeviceToDevice:  // no host synchronisation
      enqueue_locked(
          sp, "cudaMemcpy DtoD", [c] { c.run(); }, false);
      return cudaSuccess;
    default:  // to host: returns once the copy has completed
      wait_locked(lock, enqueue_locked(
                            sp, "cudaMemcpy", [c] { c.run(); }, false));
      return cudaSuccess;
  }
}

cudaError_t memset_submit(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream,
                          bool sync_api) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (pitch < width) return fail(cudaErrorInvalidValue);
  const size_t ext = pitch * (height - 1) + width;
  auto a = alloc_find(p, ext);
  if (!a) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "cudaMemset%s: %p (%zu bytes) is not inside one live device allocation",
                  sync_api ? "" : "Async", p, ext);
    report(buf);
    return fail(cudaErrorInvalidValue);
  }
  std::unique_lock<std::mutex> lock(st().mu);
  std::shared_ptr<Stream> sp;
  if (cudaError_t e = memop_stream_locked(stream, sync_api, &sp)) return e;
  trace_memop(-1, width, height, sp->device);
  char* base = static_cast<char*>(p);
  auto fn = [=] {
    for (size_t r = 0; r < height; ++r) std::memset(base + r * pitch, value, width);
  };
  if (sp->capture) {
    capture_record_locked(*sp, "cudaMemsetAsync", fn, nullptr, false);
    return cudaSuccess;
  }
  auto op = enqueue_locked(sp, "cudaMemset", fn, false);
  if (sync_api && a->pinned_host) wait_locked(lock, op);
  return cudaSuccess;
}

}  // namespace

}  // namespace cuda_emu::rt

using namespace cuda_emu::rt;

// ----------------------------------------------------------------------------
// The CUDA runtime API: copies and memsets.

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy_submit(dst, count, src, count, count, 1, kind, nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_submit(dst, count, src, count, count, 1, kind, stream, false);
}
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
  return copy_submit(dst, dpitch, src, spitch, width, height, kind, nullptr, true);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_submit(dst, dpitch, src, spitch, width, height, kind, stream, false);
}
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return memset_submit(ptr, count, value, count, 1, nullptr, true);
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return memset_submit(ptr, count, value, count, 1, stream, false);
}
cudaError_t cudaMemset2D(void* ptr, size_t pitch, int value, size_t width, size_t height) {
  return memset_submit(ptr, pitch, value, width, height, nullptr, true);
}
cudaError_t cudaMemset2DAsync(void* ptr, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream) {
  return memset_submit(ptr, pitch, value, width, height, stream, false);
}
