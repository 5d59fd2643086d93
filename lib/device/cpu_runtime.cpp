// CpuRuntime (cpu_runtime.h): host memory with the block cache, copies and zeroing across
// the ops pool; the pageable host memory every device's host_alloc starts from.
#include "device/cpu_runtime.h"

#include "core/check.h"
#include "core/dtype.h"
#include "ops/op_stats.h"
#include "ops/parallel.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <vector>

namespace dtrain::device {

void* CpuRuntime::alloc(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded >= kCacheMin) {
    if (void* p = cache_take(rounded)) {
      forget(p);
      zero(p, rounded);
      return p;
    }
  }
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (rounded >= kCacheMin) sizes_[p] = rounded;
  used_add_locked(static_cast<ptrdiff_t>(rounded >= kCacheMin ? rounded : ::malloc_usable_size(p)));
  return p;
}

void CpuRuntime::free(void* p) {
  if (!p) return;
  forget(p);
  if (!cache_put(p)) std::free(p);
}

Runtime::MemoryStats CpuRuntime::memory_stats() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return {used_, used_peak_, used_ + cached_bytes_};
}

void CpuRuntime::memory_peak_reset() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  used_peak_ = used_;
}

void CpuRuntime::memory_trim() {
  std::vector<void*> drop;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (const auto& c : cached_) {
      drop.push_back(c.first);
      sizes_.erase(c.first);
    }
    cached_.clear();
    cached_bytes_ = 0;
  }
  for (void* q : drop) std::free(q);
}

void CpuRuntime::copy_h2d(void* dst, const void* src, size_t bytes) {
  ops::OpScope scope(ops::OpClass::OTHER);
  copy(dst, src, bytes);
}

void CpuRuntime::copy_d2h(void* dst, const void* src, size_t bytes) {
  ops::OpScope scope(ops::OpClass::OTHER);
  copy(dst, src, bytes);
}

void CpuRuntime::copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  ops::OpScope scope(ops::OpClass::OTHER);
  forget(dst);
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
}

void CpuRuntime::copy_d2d(void* dst, const void* src, size_t bytes) {
  ops::OpScope scope(ops::OpClass::OTHER);
  copy(dst, src, bytes);
}

void CpuRuntime::zero(void* p, size_t bytes) {
  ops::OpScope scope(ops::OpClass::OTHER);
  forget(p);
  // Gradient buffers are zeroed every step: in 64 KiB blocks across the pool.
  constexpr size_t BLOCK = 64 * 1024;
  char* c = static_cast<char*>(p);
  ops::parallel_for((bytes + BLOCK - 1) / BLOCK, bytes / 4,
                    [&](size_t b, size_t e) { std::memset(c + b * BLOCK, 0, std::min(bytes, e * BLOCK) - b * BLOCK); });
}

void CpuRuntime::copy(void* dst, const void* src, size_t bytes) {
  forget(dst);
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}

void CpuRuntime::used_add_locked(ptrdiff_t bytes) {
  used_ = static_cast<size_t>(static_cast<ptrdiff_t>(used_) + bytes);
  used_peak_ = std::max(used_peak_, used_);
}

void* CpuRuntime::cache_take(size_t bytes) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (auto it = cached_.rbegin(); it != cached_.rend(); ++it)
    if (it->second == bytes) {
      void* p = it->first;
      cached_.erase(std::next(it).base());
      cached_bytes_ -= bytes;
      used_add_locked(static_cast<ptrdiff_t>(bytes));
      return p;
    }
  return nullptr;
}

bool CpuRuntime::cache_put(void* p) {
  std::vector<void*> drop;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      used_add_locked(-static_cast<ptrdiff_t>(::malloc_usable_size(p)));
      return false;
    }
    const size_t bytes = it->second;
    used_add_locked(-static_cast<ptrdiff_t>(bytes));
    size_t same = 0;
    for (const auto& c : cached_) same += c.second == bytes;
    if (same >= kCachePerSize || bytes > kCacheBytes) {
      sizes_.erase(it);
      return false;
    }
    cached_.emplace_back(p, bytes);
    cached_bytes_ += bytes;
    while (cached_bytes_ > kCacheBytes) {
      drop.push_back(cached_.front().first);
      cached_bytes_ -= cached_.front().second;
      sizes_.erase(cached_.front().first);
      cached_.pop_front();
    }
  }
  for (void* q : drop) std::free(q);
  return true;
}

// The host converts (16-bit: into a staging copy) and the device's own copy moves it.
void Runtime::copy_h2d_cast(void* dst, DType t, const float* src, size_t n) {
  if (!n) return;
  if (t == DType::F32) {
    copy_h2d(dst, src, n * sizeof(float));
    return;
  }
  DT_CHECK(dtype_size(t) == sizeof(uint16_t));
  std::vector<uint16_t> raw(n);
  for (size_t i = 0; i < n; ++i) dtype_store(raw.data(), i, t, src[i]);
  copy_h2d(dst, raw.data(), n * sizeof(uint16_t));
}

// Pageable host memory, 64-byte aligned and zeroed (the CPU has nothing to pin for).
void* Runtime::host_alloc(size_t bytes, bool /*pinned*/) {
  if (!bytes) return nullptr;
  void* p = ::operator new (bytes, std::align_val_t{64}, std::nothrow);
  DT_ENFORCE(p != nullptr, DeviceError, "{}: cannot allocate {:.2f} GiB of host memory", name(),
             static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  cpu().zero(p, bytes);  // across the pool: offloaded state is many GiB
  return p;
}

void Runtime::host_free(void* p, bool /*pinned*/) {
  if (p) ::operator delete (p, std::align_val_t{64}, std::nothrow);
}

}  // namespace dtrain::device
