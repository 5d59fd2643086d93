// The CPU device's runtime half (the ops are cpu_device.cpp's CpuDevice, derived from it):
// host memory with a cache of large freed blocks, copies and zeroing across the ops pool,
// and streams, events and graphs that do nothing (every op runs now, in order, on the
// calling thread). Internal to lib/device.
#pragma once

#include "device/device.h"

#include <cstddef>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace dtrain::device {

class CpuRuntime : public Device {
 public:
  Kind kind() const override { return Kind::CPU; }
  std::string name() const override { return "cpu"; }
  void* stream() const override { return nullptr; }
  void* use_stream(void*) override { return nullptr; }
  std::unique_ptr<Event> event_create() override { return std::make_unique<Event>(); }
  void event_record(Event&, void*) override {}
  void stream_wait(void*, Event&) override {}

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  MemoryStats memory_stats() override;
  void memory_peak_reset() override;
  void memory_trim() override;
  void copy_h2d(void* dst, const void* src, size_t bytes) override;
  void copy_d2h(void* dst, const void* src, size_t bytes) override;
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override;
  void copy_d2d(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void synchronize() override {}

 protected:
  void copy(void* dst, const void* src, size_t bytes);
  // Every write through the device passes the written address here: the ops' cached
  // cross-entropy statistics of memory written since are dropped (cpu_device.cpp, beside
  // that cache).
  static void forget(const void* p);

 private:
  // ---- Freed blocks kept for reuse. A ZeRO-3 step gathers each layer into a new buffer and
  // frees it after the layer, stages 2-3 give each layer's gradient a working buffer, and
  // the buckets come and go: the same few large sizes every layer and step. From malloc
  // each is a fresh mmap whose pages the kernel faults in and zeroes again, so a step spent
  // more system than user time. Blocks of kCacheMin bytes and more are kept (at most
  // kCachePerSize of a size, kCacheBytes in all, the oldest dropped first) and handed out
  // again, zeroed, for the same size. A size's blocks cycle (a layer's gathers freed, the
  // next layer's taken), so what the cache holds is bounded by the most blocks of each
  // size in use at once: the memory plan counts exactly that (train/zero_plan.h). Keeping
  // one block of a size left ZeRO-3's prefetched layers (several of a size live at once)
  // to mmap and fault in each step: 102 s of system time in issue 50's 2-rank job, 57 s
  // with up to 64 kept.
  static constexpr size_t kCacheMin = size_t{1} << 20;
  static constexpr size_t kCachePerSize = 64;
  static constexpr size_t kCacheBytes = size_t{4} << 30;
  std::mutex cache_mu_;
  std::unordered_map<void*, size_t> sizes_;      // live and cached blocks of kCacheMin and more
  std::deque<std::pair<void*, size_t>> cached_;  // freed blocks, oldest first
  size_t cached_bytes_ = 0;
  size_t used_ = 0, used_peak_ = 0;  // bytes of live allocations (memory_stats)

  // Under cache_mu_.
  void used_add_locked(ptrdiff_t bytes);
  // A kept block of exactly `bytes` (counted in use again), or nullptr.
  void* cache_take(size_t bytes);
  // Counts p out of use; true when it is kept (the caller must not free it).
  bool cache_put(void* p);
  // (The device lives as long as the process; the blocks still cached at exit stay
  // reachable from it and go with the process.)
};

}  // namespace dtrain::device
