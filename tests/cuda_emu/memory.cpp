// CUDA execution engine: device and pinned allocations. Each allocation is its own
// mapping, placed so that it ends (rounded to 256 bytes, cudaMalloc's alignment) right
// before an inaccessible guard zone; fresh memory is poisoned with 0xff bytes (NaN in
// fp32/bf16/fp16), freed memory is made inaccessible and kept in quarantine a while.
#include "memory_internal.h"

#include "engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace cuda_emu {

namespace {

constexpr size_t GUARD_BYTES = 64 * 1024;          // before and after every allocation
constexpr size_t QUARANTINE_BYTES = 256ull << 20;  // freed memory kept inaccessible
constexpr unsigned char POISON = 0xff;
constexpr unsigned char CANARY = 0xa5;  // slack between the end and the guard

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Entry {
  char* map = nullptr;  // whole mapping: guard | data pages | guard
  size_t map_len = 0;
  char* base = nullptr;  // user pointer
  size_t size = 0;
  size_t slack = 0;  // canary bytes after base + size, up to the guard
  int device = -1;
  bool pinned = false;
  bool freed = false;
};

// A spinlock rather than a mutex: fault_resolve runs in a signal handler, where the
// only safe wait is one on memory the interrupted thread does not hold (a worker never
// holds this lock while running kernel code).
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;
struct Guard {
  Guard() {
    while (g_lock.test_and_set(std::memory_order_acquire)) {
    }
  }
  ~Guard() { g_lock.clear(std::memory_order_release); }
};

std::map<uintptr_t, Entry>& entries() {               // keyed by mapping start
  static auto* m = new std::map<uintptr_t, Entry>();  // never destroyed: used by late frees
  return *m;
}
std::deque<uintptr_t>& quarantine() {
  static auto* q = new std::deque<uintptr_t>();
  return *q;
}
size_t g_quarantined = 0;
size_t g_used[64] = {};

// Pages fault_resolve opened; restored by guards_reprotect.
constexpr int MAX_OPENED = 256;
char* g_opened[MAX_OPENED];
std::atomic<int> g_nopened{0};

Entry* entry_containing(uintptr_t a) {
  auto& m = entries();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  Entry& e = it->second;
  return a < reinterpret_cast<uintptr_t>(e.map) + e.map_len ? &e : nullptr;
}

}  // namespace

// ----------------------------------------------------------------------------
void* mem_alloc(size_t size, int device, bool pinned) {
  const size_t ps = page_size();
  const size_t user = round_up(size == 0 ? 1 : size, 256);
  const size_t data = round_up(user, ps);
  const size_t len = GUARD_BYTES + data + GUARD_BYTES;
  void* m = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* map = static_cast<char*>(m);
  if (mprotect(map + GUARD_BYTES, data, PROT_READ | PROT_WRITE) != 0) {
    munmap(m, len);
    return nullptr;
  }
  Entry e;
  e.map = map;
  e.map_len = len;
  e.base = map + GUARD_BYTES + data - user;
  e.size = size;
  e.slack = user - size;
  e.device = device;
  e.pinned = pinned;
  std::memset(e.base, POISON, size);
  std::memset(e.base + size, CANARY, e.slack);
  {
    Guard g;
    entries()[reinterpret_cast<uintptr_t>(map)] = e;
    if (device >= 0 && device < 64) g_used[device] += size;
  }
  return e.base;
}

// Makes the allocation inaccessible (use after free faults) and quarantines it; the
// oldest quarantined mappings are unmapped past QUARANTINE_BYTES.
bool mem_free(void* p, int* device, bool* pinned) {
  std::vector<std::pair<char*, size_t>> unmap;
  {
    Guard g;
    Entry* e = entry_containing(reinterpret_cast<uintptr_t>(p));
    if (!e || e->freed || e->base != p) return false;
    if (device) *device = e->device;
    if (pinned) *pinned = e->pinned;
    e->freed = true;
    mprotect(e->map, e->map_len, PROT_NONE);
    if (e->device >= 0 && e->device < 64) g_used[e->device] -= e->size;
    quarantine().push_back(reinterpret_cast<uintptr_t>(e->map));
    g_quarantined += e->map_len;
    while (g_quarantined > QUARANTINE_BYTES && !quarantine().empty()) {
      auto it = entries().find(quarantine().front());
      quarantine().pop_front();
      if (it == entries().end()) continue;
      g_quarantined -= it->second.map_len;
      unmap.emplace_back(it->second.map, it->second.map_len);
      entries().erase(it);
    }
  }
  for (auto& [m, len] : unmap) munmap(m, len);
  return true;
}

size_t mem_used(int device) {
  Guard g;
  return device >= 0 && device < 64 ? g_used[device] : 0;
}

std::string mem_canaries_check() {
  Guard g;
  for (auto& [k, e] : entries()) {
    if (e.freed) continue;
    for (size_t i = 0; i < e.slack; ++i) {
      if (static_cast<unsigned char>(e.base[e.size + i]) != CANARY) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "a write %zu byte(s) past the end of the %zu-byte allocation at %p", i + 1,
                      e.size, static_cast<void*>(e.base));
        std::memset(e.base + e.size, CANARY, e.slack);  // report once
        return buf;
      }
    }
  }
  return "";
}

std::optional<Alloc> alloc_find(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Guard g;
  Entry* e = entry_containing(a);
  if (!e || e->freed) return std::nullopt;
  const uintptr_t b = reinterpret_cast<uintptr_t>(e->base);
  if (a < b || a + bytes > b + e->size) return std::nullopt;
  Alloc out;
  out.base = e->base;
  out.size = e->size;
  out.device = e->device;
  out.pinned_host = e->pinned;
  return out;
}

// ----------------------------------------------------------------------------
bool fault_resolve(const void* addr, FaultInfo* out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  Guard g;
  Entry* e = entry_containing(a);
  if (!e) return false;
  const size_t ps = page_size();
  char* page = reinterpret_cast<char*>(a & ~(ps - 1));
  if (mprotect(page, ps, PROT_READ | PROT_WRITE) != 0) return false;
  const int slot = g_nopened.fetch_add(1);
  if (slot < MAX_OPENED) {
    g_opened[slot] = page;
  }
  out->base = e->base;
  out->size = e->size;
  out->offset = static_cast<long long>(a) - static_cast<long long>(reinterpret_cast<uintptr_t>(e->base));
  out->freed = e->freed;
  return true;
}

void guards_reprotect() {
  Guard g;
  const int n = g_nopened.exchange(0);
  const size_t ps = page_size();
  for (int i = 0; i < n && i < MAX_OPENED; ++i) {
    char* page = g_opened[i];
    Entry* e = entry_containing(reinterpret_cast<uintptr_t>(page));
    if (!e) continue;
    const bool in_data = !e->freed && page >= e->map + GUARD_BYTES && page < e->map + e->map_len - GUARD_BYTES;
    if (in_data) continue;  // a data page of a live allocation stays accessible
    std::memset(page, 0, ps);
    mprotect(page, ps, PROT_NONE);
  }
}

}  // namespace cuda_emu
