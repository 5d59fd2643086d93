// The device layer's runtime: what a device is besides its ops (op_table.h): name and
// kind, memory (device and host), streams and events, copies, graphs. The model, the
// trainer and the ZeRO engine reach both halves through Device (device.h); code that
// only moves memory (buffers, communicators' staging) needs only this one.
#pragma once

#include "core/dtype.h"
#include "device/kind.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace dtrain::device {

/// A device's memory, streams, events, copies and graphs. Memory is the device's:
/// pointers it hands out are device pointers (host pointers on the CPU).
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Kind kind() const = 0;
  /// "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;
  /// The device's compute stream (a cudaStream_t; nullptr on the CPU), for callers that
  /// order their own work (collectives) against it with events.
  virtual void* stream() const = 0;

  // ---- Streams and events: ops are issued on the current stream, the compute stream
  // unless use_stream() redirected them (the ZeRO engine runs the ops that consume a
  // collective's result on the communicator's stream). On the CPU every op runs now,
  // in order, so these do nothing.
  /// An event of this device (a cudaEvent_t without timing).
  class Event {
   public:
    virtual ~Event() = default;
  };
  /// Issues later ops (alloc, free and copies included) on `stream` (a stream of this
  /// device; nullptr = the compute stream); returns the previous current stream.
  virtual void* use_stream(void* stream) = 0;
  virtual std::unique_ptr<Event> event_create() = 0;
  /// Marks the work issued so far on `stream` (nullptr = the compute stream).
  virtual void event_record(Event& e, void* stream) = 0;
  /// Work issued later on `stream` (nullptr = the compute stream) waits for e's mark.
  virtual void stream_wait(void* stream, Event& e) = 0;

  // ---- Memory. alloc is zeroed and stream-ordered: usable by later ops on the current
  // stream (other streams must wait for an event recorded after it). free is ordered
  // after the ops issued so far on the current stream; work on other streams that uses
  // the memory must be made to finish first (stream_wait on their event).
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  /// Host -> device; returns when src may be reused.
  virtual void copy_h2d(void* dst, const void* src, size_t bytes) = 0;
  /// Device -> host; returns when dst holds the data (waits for the ops before it).
  virtual void copy_d2h(void* dst, const void* src, size_t bytes) = 0;
  /// n fp32 host values at src to dst as dtype t (RNE for 16-bit, as the device's cast);
  /// returns when src may be reused. The default converts on the host and calls copy_h2d.
  /// A host fp32 source (the ZeRO engine's masters) reaches a device only through this and
  /// copy_h2d, so the plan device's host stand-in, whose storage is fake, is never read.
  virtual void copy_h2d_cast(void* dst, DType t, const float* src, size_t n);
  /// rows x width bytes from src (rows spitch apart) to dst (dpitch apart).
  virtual void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) = 0;
  /// Device -> device, ordered on the current stream.
  virtual void copy_d2d(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  /// Waits for every op issued so far.
  virtual void synchronize() = 0;
  /// What alloc has handed out: `used` bytes held by live allocations now, `used_peak`
  /// their most since the last memory_peak_reset (or the device's start), `reserved`
  /// what the allocator holds (used + freed blocks it keeps for reuse). The CPU counts its
  /// own blocks; CUDA reads its default memory pool (cudaMemPoolAttr*). The memory trace
  /// and the GPU check hold these against the plan.
  struct MemoryStats {
    size_t used = 0, used_peak = 0, reserved = 0;
  };
  virtual MemoryStats memory_stats() = 0;
  virtual void memory_peak_reset() = 0;
  /// Frees the blocks the allocator keeps for reuse (the CPU device's block cache), once a
  /// phase's working buffers will not come back (before the final export). CUDA's pool
  /// keeps its memory for the next job step; nothing to do there.
  virtual void memory_trim() {}

  // ---- Host memory the device copies to and from without staging (ZeRO-Offload).
  /// `bytes` of zeroed host memory; pinned (page-locked: cudaMallocHost) where the device
  /// has a DMA engine and `pinned`, pageable otherwise. DeviceError when it cannot be had.
  virtual void* host_alloc(size_t bytes, bool pinned);
  virtual void host_free(void* p, bool pinned);
  /// Host -> device and device -> host copies ordered on the current stream, returning at
  /// once: the host memory must stay untouched (h2d) or unread (d2h) until an event
  /// recorded after the copy completes (event_synchronize). With host_alloc'd pinned
  /// memory the copy overlaps with the host and with other streams' work. The CPU copies now.
  virtual void copy_h2d_async(void* dst, const void* src, size_t bytes) { copy_h2d(dst, src, bytes); }
  virtual void copy_d2h_async(void* dst, const void* src, size_t bytes) { copy_d2h(dst, src, bytes); }
  /// The calling thread waits until the work marked by e has completed (any thread may
  /// call it; the CPU has nothing to wait for).
  virtual void event_synchronize(Event& e) {
    (void)e;
    synchronize();
  }

  // ---- Graphs: the ops issued on the compute stream (and on streams that join it through
  // events) recorded once and replayed (CUDA graphs). Inside a recording nothing runs and
  // nothing may wait for the device (no copy_h2d/copy_d2h/synchronize).
  class Graph {
   public:
    virtual ~Graph() = default;
  };
  /// Starts recording on the compute stream; false when this device cannot (the CPU).
  virtual bool graph_begin() { return false; }
  /// Ends the recording: the graph, ready to launch; nullptr when something issued in
  /// between could not be recorded (nothing of it ran: run it without a graph).
  virtual std::unique_ptr<Graph> graph_end() { return nullptr; }
  /// Runs the recorded work once more, on the compute stream after the work before it.
  virtual void graph_launch(Graph& /*g*/) {}

 protected:
  Runtime() = default;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
};

/// Owns host memory from Runtime::host_alloc (pinned or pageable). Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Runtime& dev, size_t bytes, bool pinned)
      : dev_(&dev), bytes_(bytes), pinned_(pinned), ptr_(bytes ? dev.host_alloc(bytes, pinned) : nullptr) {}
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      bytes_ = o.bytes_;
      pinned_ = o.pinned_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~HostBuffer() { reset(); }
  void reset() {
    if (ptr_) dev_->host_free(ptr_, pinned_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  Runtime* dev_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
  void* ptr_ = nullptr;
};

/// Owns one allocation on a device. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Runtime& dev, size_t bytes) : dev_(&dev), bytes_(bytes), ptr_(bytes ? dev.alloc(bytes) : nullptr) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), bytes_(o.bytes_), ptr_(o.ptr_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      bytes_ = o.bytes_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (ptr_) dev_->free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  Runtime* dev_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace dtrain::device
