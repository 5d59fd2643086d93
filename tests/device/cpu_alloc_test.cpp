// The CPU device's memory: every alloc is zeroed, also when a freed block of the same size
// is handed out again (the block cache that spares ZeRO-3's per-layer gathers an mmap and
// the kernel's page faults each time); blocks of other sizes and small ones are not reused;
// memory_stats counts what is in use and held.
#include "device/device.h"

#include <doctest/doctest.h>

#include <cstring>
#include <thread>
#include <vector>

using namespace dtrain;

namespace {

bool all_zero(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i)
    if (c[i] != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("a freed large block comes back zeroed for the same size, not for another") {
  device::Device& dev = device::cpu();
  const size_t big = (size_t{3} << 20) + 64;  // above the cache's 1 MiB floor
  void* a = dev.alloc(big);
  REQUIRE(all_zero(a, big));
  std::memset(a, 0xAB, big);
  dev.free(a);
  void* b = dev.alloc(big);
  CHECK(b == a);  // the kept block
  CHECK(all_zero(b, big));
  std::memset(b, 0xCD, big);
  void* c = dev.alloc(big + 4096);  // another size: a block of its own, zeroed
  CHECK(c != b);
  CHECK(all_zero(c, big + 4096));
  dev.free(b);
  dev.free(c);
  // Several blocks of a size are kept (a ZeRO-3 layer's gathers, the layers prefetched
  // ahead): two freed, the same two taken again, both zeroed.
  void* d = dev.alloc(big);
  void* e = dev.alloc(big);
  std::memset(d, 1, big);
  std::memset(e, 2, big);
  dev.free(d);
  dev.free(e);
  void* f = dev.alloc(big);
  void* g = dev.alloc(big);
  CHECK(((f == d && g == e) || (f == e && g == d)));
  CHECK(all_zero(f, big));
  CHECK(all_zero(g, big));
  dev.free(f);
  dev.free(g);
}

TEST_CASE("memory_stats: bytes in use, their peak since a reset, and what the cache holds") {
  device::Device& dev = device::cpu();
  const size_t big = (size_t{5} << 20) + 192;  // a size no other case uses
  const device::Device::MemoryStats before = dev.memory_stats();
  dev.memory_peak_reset();
  void* a = dev.alloc(big);
  void* b = dev.alloc(big);
  const device::Device::MemoryStats two = dev.memory_stats();
  CHECK(two.used == before.used + 2 * big);
  CHECK(two.used_peak == two.used);
  dev.free(a);
  const device::Device::MemoryStats one = dev.memory_stats();
  CHECK(one.used == before.used + big);
  CHECK(one.used_peak == two.used);       // the peak stays until a reset
  CHECK(one.reserved >= one.used + big);  // the freed block is kept, so held
  dev.memory_peak_reset();
  CHECK(dev.memory_stats().used_peak == one.used);  // a reset starts from the bytes in use
  void* c = dev.alloc(big);                         // the kept block again: nothing new held
  CHECK(c == a);
  CHECK(dev.memory_stats().reserved == one.reserved);
  void* small = dev.alloc(1000);  // below the cache's floor: counted while live
  CHECK(dev.memory_stats().used >= before.used + 2 * big + 1000);
  dev.free(small);
  dev.free(b);
  dev.free(c);
  CHECK(dev.memory_stats().used == before.used);
  // memory_trim gives the kept blocks back: nothing held beyond what is in use.
  CHECK(dev.memory_stats().reserved > dev.memory_stats().used);
  dev.memory_trim();
  CHECK(dev.memory_stats().reserved == dev.memory_stats().used);
  void* again = dev.alloc(big);
  CHECK(all_zero(again, big));
  dev.free(again);
}

TEST_CASE("small blocks are zeroed and the cache is safe across threads") {
  device::Device& dev = device::cpu();
  std::vector<std::thread> ts;
  std::vector<int> ok(4, 1);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const size_t n = (i % 2 ? size_t{2} << 20 : size_t{4096}) + static_cast<size_t>(t) * 64;
        void* p = dev.alloc(n);
        if (!all_zero(p, n)) ok[static_cast<size_t>(t)] = 0;
        std::memset(p, 0x5A, n);
        dev.free(p);
      }
    });
  for (auto& t : ts) t.join();
  for (int v : ok) CHECK(v == 1);
}
