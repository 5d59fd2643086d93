// CUDA execution engine (test-only): the shared-memory racecheck, as compute-sanitizer's
// racecheck: kernels/*.cu are compiled with GCC's -fsanitize=thread instrumentation, and
// the __tsan_* hooks it calls are defined here (libtsan is never linked). Each access to
// the running block's shared memory is checked against the byte's last write and the
// reads since, by warp, barrier interval and warp sync generation (kernel_exec_internal.h).
#include "kernel_exec_internal.h"

#include <link.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <tuple>

namespace cuda_emu {

namespace {

std::atomic<int> g_racecheck{-1};  // -1: not read from the environment yet; 0 off, 1 on, 2 first
std::atomic<int> g_schedule{-1};

int env_racecheck() {
  const char* e = std::getenv("CUDA_EMU_RACECHECK");
  if (e && std::strcmp(e, "0") == 0) return 0;
  if (e && std::strcmp(e, "first") == 0) return 2;
  return 1;
}
int env_schedule() {
  const char* e = std::getenv("CUDA_EMU_WARP_ORDER");
  if (e && std::strcmp(e, "ahead") == 0) return static_cast<int>(Schedule::WARP_AHEAD);
  if (e && std::strcmp(e, "behind") == 0) return static_cast<int>(Schedule::WARP_BEHIND);
  return static_cast<int>(Schedule::SEEDED);
}

}  // namespace

ExecMode exec_mode() {
  int r = g_racecheck.load(std::memory_order_relaxed), s = g_schedule.load(std::memory_order_relaxed);
  if (r < 0) g_racecheck.store(r = env_racecheck());
  if (s < 0) g_schedule.store(s = env_schedule());
  return ExecMode{r != 0, static_cast<Schedule>(s), r == 2};
}
void exec_mode_set(ExecMode m) {
  g_racecheck.store(m.racecheck ? (m.racecheck_first ? 2 : 1) : 0);
  g_schedule.store(static_cast<int>(m.schedule));
}

namespace {

RaceCell* shadow_map(size_t cells) {
  void* m = mmap(nullptr, cells * sizeof(RaceCell), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  return static_cast<RaceCell*>(m);
}

// This OS thread's TLS block of the module holding the engine (and, linked statically
// beside it, the kernels' static __shared__ variables).
int tls_find(dl_phdr_info* info, size_t, void* out) {
  auto* w = static_cast<Worker*>(out);
  if (!info->dlpi_tls_data) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_TLS) continue;
    const char* lo = static_cast<const char*>(info->dlpi_tls_data);
    const auto* mine = reinterpret_cast<const char*>(&t_block);
    if (mine >= lo && mine < lo + info->dlpi_phdr[i].p_memsz) {
      w->rc_tls_lo = lo;
      w->rc_tls_len = info->dlpi_phdr[i].p_memsz;
      return 1;
    }
  }
  return 0;
}

[[gnu::cold, gnu::noinline]] void hazard(Block& b, int kind, const char* addr, bool dynamic, size_t offset,
                                         unsigned t_now, uintptr_t pc_now, unsigned t_prev, uintptr_t pc_prev) {
  Hazard& h = b.hazard;
  h.kind = kind;
  h.addr = addr;
  h.dynamic = dynamic;
  h.offset = offset;
  h.t_now = t_now;
  h.t_prev = t_prev;
  h.pc_now = pc_now;
  h.pc_prev = pc_prev;
  // The block fails; its threads unwind at their next barrier or warp instruction (the
  // hook itself cannot throw: GCC declares it nothrow).
  if (!b.cancel) {
    b.cancel = true;
    b.err = cudaErrorLaunchFailure;
    b.msg = "racecheck";
  }
}

// Checks and records an access of `n` bytes at cells[off...] by the running thread.
void check(Worker& w, RaceCell* cells, size_t off, size_t n, bool write, uintptr_t pc, const char* addr, bool dynamic) {
  Block& b = w.block;
  if (b.cancel) return;
  const unsigned t = static_cast<unsigned>(cur_thread() - b.threads.data()), warp = t >> 5;
  const uint32_t E = b.rc_epoch, G = b.rc_gen[warp], bit = 1u << warp;
  for (size_t i = 0; i < n; ++i) {
    RaceCell& c = cells[off + i];
    // An earlier access by another thread of this interval is a hazard unless both are
    // lanes of one warp that synchronised since (__syncwarp, a shuffle, an mma...).
    if (c.w_epoch == E && c.w_t != t && ((c.w_t >> 5) != warp || c.w_gen == G))
      return hazard(b, write ? HAZ_WAW : HAZ_RAW, addr + i, dynamic, off + i, t, pc, c.w_t, c.w_pc);
    if (write) {
      if (c.r_epoch == E) {
        if (c.r_mask & ~bit) {
          const bool first_other = (c.r_t >> 5) != warp;
          return hazard(b, HAZ_WAR, addr + i, dynamic, off + i, t, pc, first_other ? c.r_t : c.r_t2,
                        first_other ? c.r_pc : c.r_pc2);
        }
        if (c.r_t != t && c.r_gen == G) return hazard(b, HAZ_WAR, addr + i, dynamic, off + i, t, pc, c.r_t, c.r_pc);
      }
      c.w_epoch = E;
      c.w_gen = G;
      c.w_t = static_cast<uint16_t>(t);
      c.w_pc = pc;
      c.r_epoch = 0;
    } else if (c.r_epoch != E) {
      c.r_epoch = E;
      c.r_mask = bit;
      c.r_t = static_cast<uint16_t>(t);
      c.r_gen = G;
      c.r_pc = pc;
    } else if ((c.r_t >> 5) == warp) {  // the latest reader of that warp
      c.r_mask |= bit;
      c.r_t = static_cast<uint16_t>(t);
      c.r_gen = G;
      c.r_pc = pc;
    } else if (!(c.r_mask & bit)) {  // a reader of another warp: the first one is kept
      if ((c.r_mask & ~(1u << (c.r_t >> 5))) == 0) {
        c.r_t2 = static_cast<uint16_t>(t);
        c.r_pc2 = pc;
      }
      c.r_mask |= bit;
    }
  }
}

// The hooks' fast path: one thread-local load and two range compares for anything that
// is not the running block's shared memory.
[[gnu::always_inline]] inline void on_access(const void* p, size_t n, bool write, uintptr_t pc) {
  Worker* w = t_worker;
  if (!w || !w->rc_active) return;
  const char* a = static_cast<const char*>(p);
  if (a >= w->smem_base && a < w->smem_guard()) {
    const size_t off = static_cast<size_t>(a - w->smem_map);
    if (w->bulk_in_flight) [[unlikely]]
      bulk_in_flight_access(w->block, a, n, write, pc);
    check(*w, w->rc_dyn, off, std::min(n, static_cast<size_t>(w->smem_guard() - a)), write, pc, a, true);
    return;
  }
  const size_t off = static_cast<size_t>(a - w->rc_tls_lo);
  if (off >= w->rc_tls_len) return;
  // The engine's own thread_locals that kernel code reads (threadIdx, blockIdx...).
  const auto* blk = reinterpret_cast<const char*>(&t_block);
  const auto* idx = reinterpret_cast<const char*>(&t_thread_idx);
  if ((a >= blk && a < blk + sizeof t_block) || (a >= idx && a < idx + sizeof t_thread_idx)) return;
  check(*w, w->rc_tls, off, std::min(n, w->rc_tls_len - off), write, pc, a, false);
}

const char* kind_str(int k) {
  return k == HAZ_RAW ? "read-after-write" : k == HAZ_WAR ? "write-after-read" : "write-after-write";
}

}  // namespace

bool racecheck_first_launch(const KernelLaunch& k) {
  using Key = std::tuple<const void*, std::string, const char*, int, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, size_t>;
  static std::mutex mu;
  static std::set<Key> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen
      .emplace(k.func, k.name, k.file, k.line, k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z,
               k.dynamic_smem)
      .second;
}

void racecheck_block_start(Worker& w, Block& b, bool on) {
  w.rc_active = on;
  b.hazard = Hazard{};
  if (!w.rc_active) return;
  if (!w.rc_dyn) {
    dl_iterate_phdr(tls_find, &w);
    w.rc_dyn = shadow_map(SMEM_RESERVE);
    if (w.rc_tls_len) w.rc_tls = shadow_map(w.rc_tls_len);
  }
  if (w.rc_clock > 0xf0000000u) {  // before the clock wraps: old cells must not match
    std::memset(static_cast<void*>(w.rc_dyn), 0, SMEM_RESERVE * sizeof(RaceCell));
    if (w.rc_tls) std::memset(static_cast<void*>(w.rc_tls), 0, w.rc_tls_len * sizeof(RaceCell));
    w.rc_clock = 0;
  }
  b.rc_epoch = ++w.rc_clock;
  b.rc_gen.resize(b.warps.size());
  for (auto& g : b.rc_gen) g = ++w.rc_clock;
}

void racecheck_access(const void* p, size_t bytes, bool write, uintptr_t pc) { on_access(p, bytes, write, pc); }

void racecheck_forget(const void* p, size_t bytes) {
  Worker* w = t_worker;
  if (!w || !w->rc_active) return;
  const char* a = static_cast<const char*>(p);
  RaceCell* cells = nullptr;
  size_t off = 0, n = 0;
  if (a >= w->smem_base && a < w->smem_guard()) {
    cells = w->rc_dyn;
    off = static_cast<size_t>(a - w->smem_map);
    n = std::min(bytes, static_cast<size_t>(w->smem_guard() - a));
  } else if (static_cast<size_t>(a - w->rc_tls_lo) < w->rc_tls_len) {
    cells = w->rc_tls;
    off = static_cast<size_t>(a - w->rc_tls_lo);
    n = std::min(bytes, w->rc_tls_len - off);
  }
  if (cells) std::memset(static_cast<void*>(cells + off), 0, n * sizeof(RaceCell));
}

std::string racecheck_report(const Block& b) {
  const Hazard& h = b.hazard;
  const bool same_warp = h.t_now / 32 == h.t_prev / 32;
  const char* now = h.kind == HAZ_RAW ? "read" : "wrote";
  const char* prev = h.kind == HAZ_WAR ? "read" : "wrote";
  std::string where = h.dynamic ? "dynamic shared memory, offset " + std::to_string(h.addr - (b.w->smem_base)) +
                                      " of " + std::to_string(b.w->smem_size) + " bytes"
                                : "static __shared__ storage";
  return std::string("racecheck: ") + kind_str(h.kind) + " hazard at shared address " +
         hex(reinterpret_cast<uintptr_t>(h.addr)) + " (" + where + "): " + lane_str(b, h.t_now) + " " + now +
         " it at " + code_location(h.pc_now) + "; " + lane_str(b, h.t_prev) + " " + prev + " it at " +
         code_location(h.pc_prev) + "; no " +
         (same_warp ? "__syncwarp or other warp instruction of both lanes" : "__syncthreads") +
         " orders the two accesses";
}

}  // namespace cuda_emu

// ----------------------------------------------------------------------------
// The hooks GCC's -fsanitize=thread emits (gcc 12: --param tsan-instrument-func-entry-exit=0
// drops the function entry/exit ones, defined anyway). Atomics perform the operation,
// sequentially consistent; they take no part in the racecheck.
#define RC_PC reinterpret_cast<uintptr_t>(__builtin_return_address(0))
#define RC_RW(N)                                                                      \
  void __tsan_read##N(void* p) { cuda_emu::on_access(p, N, false, RC_PC); }           \
  void __tsan_write##N(void* p) { cuda_emu::on_access(p, N, true, RC_PC); }           \
  void __tsan_unaligned_read##N(void* p) { cuda_emu::on_access(p, N, false, RC_PC); } \
  void __tsan_unaligned_write##N(void* p) { cuda_emu::on_access(p, N, true, RC_PC); } \
  void __tsan_volatile_read##N(void* p) { cuda_emu::on_access(p, N, false, RC_PC); }  \
  void __tsan_volatile_write##N(void* p) { cuda_emu::on_access(p, N, true, RC_PC); }
#define RC_ATOMIC(N, T)                                                                                            \
  T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }             \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }             \
  T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }     \
  T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
  int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                             \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                        \
  }                                                                                                                \
  int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                               \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                         \
  }                                                                                                                \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                                   \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                              \
    return c;                                                                                                      \
  }

extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_read1(void* p) { cuda_emu::on_access(p, 1, false, RC_PC); }
void __tsan_write1(void* p) { cuda_emu::on_access(p, 1, true, RC_PC); }
void __tsan_volatile_read1(void* p) { cuda_emu::on_access(p, 1, false, RC_PC); }
void __tsan_volatile_write1(void* p) { cuda_emu::on_access(p, 1, true, RC_PC); }
RC_RW(2)
RC_RW(4)
RC_RW(8)
RC_RW(16)
void __tsan_read_range(void* p, unsigned long n) { cuda_emu::on_access(p, n, false, RC_PC); }
void __tsan_write_range(void* p, unsigned long n) { cuda_emu::on_access(p, n, true, RC_PC); }
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
RC_ATOMIC(8, char)
RC_ATOMIC(16, short)
RC_ATOMIC(32, int)
RC_ATOMIC(64, long long)
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}
