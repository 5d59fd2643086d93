// INTERNAL to the kernel executor (test-only): the launch, block and worker state that
// the scheduler (kernel_exec.cpp) and the memory-fault handler (kernel_faults.cpp) share.
#pragma once

#include "engine.h"
#include "kernel_hopper_internal.h"

#include <boost/context/fiber.hpp>
#include <cuda_fp16.h>

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cuda_emu {

// The low 16 bits of a register as a bf16 / fp16 value (tensor-core operands: mma, wgmma).
inline float bf16_bits(uint32_t h) {
  const uint32_t u = (h & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float f16_bits(uint32_t h) { return __half2float(__half{static_cast<uint16_t>(h)}); }

constexpr size_t SMEM_RESERVE = 256 * 1024;  // above the 227 KB opt-in limit
constexpr size_t FIBER_STACK = 256 * 1024;   // each carrier fiber's stack

// What a block thread waits at (Thread::op).
enum Op : int {
  OP_BAR,
  OP_BAR_OR,
  OP_BAR_AND,
  OP_BAR_COUNT,
  OP_SHFL_IDX,
  OP_SHFL_XOR,
  OP_SHFL_UP,
  OP_SHFL_DOWN,
  OP_SYNCWARP,
  OP_BALLOT,
  OP_MBAR_WAIT,  // mbarrier.try_wait.parity (kernel_hopper.cpp): Thread::io is the barrier
  // .sync.aligned warp instructions: all 32 lanes, one instruction (op and call site).
  OP_MMA_BF16,
  OP_MMA_F16,
  OP_LDSM_X1,
  OP_LDSM_X2,
  OP_LDSM_X4,
  OP_LDSM_X1_T,
  OP_LDSM_X2_T,
  OP_LDSM_X4_T,
  // .sync.aligned warpgroup instructions (kernel_wgmma.cpp): all 128 threads of an
  // aligned warpgroup, one instruction. They gather outside Warp::groups.
  OP_WGMMA_FENCE,
  OP_WGMMA_MMA,
  OP_WGMMA_COMMIT,
  OP_WGMMA_WAIT,
  // Named barriers (kernel_namedbar.cpp): bar.sync / bar.arrive id, count, per warp.
  OP_NBAR_SYNC,
  OP_NBAR_ARRIVE,
};
inline bool aligned_op(int op) { return op >= OP_MMA_BF16 && op <= OP_LDSM_X4_T; }

// ----------------------------------------------------------------------------
// Launch: what every block of one kernel_run shares.
struct FaultRecord {  // POD: written by the signal handler
  const void* addr;
  FaultInfo info;
  bool smem;  // hit the dynamic shared memory guard, not an allocation's
  size_t smem_size;
  long long smem_offset;
  uint3 block, thread;
  uintptr_t pc;
  int access;  // 0 unknown, 1 read, 2 write
};

struct Launch {
  const KernelLaunch* k = nullptr;
  unsigned nthreads = 0;
  uint64_t seed = 0;      // 0: plain thread order
  int order = 0;          // Schedule (engine.h)
  bool racecheck = true;  // its blocks run under the racecheck (ExecMode)
  uint64_t serial = 0;
  std::atomic<bool> stop{false};
  std::mutex mu;
  cudaError_t err = cudaSuccess;
  std::string detail;
  std::atomic<int> fault_state{0};  // 0 none, 1 being written, 2 written
  FaultRecord fault{};
};

// ----------------------------------------------------------------------------
// Block state. One per worker OS thread, reused for every block it runs.
enum class TState : uint8_t { UNSTARTED, RUNNING, BLOCKED, RUNNABLE, DONE };

struct Carrier;

// idx comes first: t_thread_idx points at it and doubles as the current-thread pointer.
struct Thread {
  uint3 idx;
  TState state;
  Carrier* carrier;
  int op;  // what it waits at
  const char* file;
  int line;
  unsigned mask;
  int bytes, arg, width;
  uint64_t value, result;
  const void* io;  // .sync.aligned warp instructions: the lane's operands, on its own stack
  // mbarrier.try_wait: the barrier and phase its last `false` answer was for.
  const void* mb_last;
  uint32_t mb_phase_last;
};
static_assert(std::is_standard_layout_v<Thread>);

// cp.async: one thread's copies in flight, oldest first. A copy's group is the number of
// commit_groups before the one that committed it; UNCOMMITTED until then.
struct AsyncCopy {
  void* dst;
  const void* src;
  unsigned group;
  uintptr_t pc;  // the issuing code, for racecheck reports
};
struct AsyncCopies {
  static constexpr unsigned UNCOMMITTED = ~0u;
  std::vector<AsyncCopy> q;  // keeps its capacity from block to block
  unsigned committed = 0;    // commit_groups executed
};

struct WarpGroup {  // lanes of one mask meeting at a warp intrinsic
  unsigned mask, arrived;
  int op, bytes, width;
};
struct Warp {
  unsigned present;  // lanes that exist (the last warp may be partial)
  unsigned exited;
  std::vector<WarpGroup> groups;
  // The named-barrier instruction its lanes gather at (kernel_namedbar.cpp): lanes in,
  // op, barrier id and thread count of the first lane.
  unsigned nb_arrived = 0;
  int nb_op = 0;
  unsigned nb_id = 0, nb_count = 0;
};

// One of a block's 16 hardware barriers used by bar.sync / bar.arrive with an id
// (kernel_namedbar.cpp): the thread count of the phase being gathered (set by its first
// warp), the threads arrived so far (whole warps) and those waiting at bar.sync.
struct NamedBarrier {
  unsigned count = 0, arrived = 0;
  unsigned first = 0;  // the first arriving warp's lane 0
  const char* file = nullptr;
  int line = 0;
  std::vector<unsigned> waiters;
};

struct Worker;

// Racecheck (racecheck.cpp): one shadow cell per byte of shared memory. A barrier
// interval (epoch) and a warp's sync generation are values of the worker's clock, unique
// across blocks, so cells left by an earlier block or interval never match.
struct RaceCell {
  uint32_t w_epoch, w_gen;   // last write: barrier interval, its warp's generation
  uint32_t r_epoch, r_mask;  // reads since: interval, warps that read
  uint32_t r_gen;            // generation of r_t's warp at its read
  uint16_t w_t, r_t, r_t2;   // writer; latest reader of one warp; first reader of another
  uintptr_t w_pc, r_pc, r_pc2;
};
enum HazardKind : int { HAZ_RAW = 1, HAZ_WAR, HAZ_WAW };
struct Hazard {  // the first one a block hit
  int kind = 0;
  const char* addr = nullptr;
  bool dynamic = false;  // dynamic shared memory, else static __shared__
  size_t offset = 0;     // in the dynamic buffer / this thread's TLS block
  unsigned t_now = 0, t_prev = 0;
  uintptr_t pc_now = 0, pc_prev = 0;
};

struct Block {
  Worker* w = nullptr;
  Launch* launch = nullptr;
  unsigned n = 0;
  dim3 dims{0, 0, 0};  // the block shape threads[].idx was computed for
  std::vector<Thread> threads;
  std::vector<AsyncCopies> async;  // per thread
  bool async_used = false;         // a thread issued a cp.async since block_setup
  std::vector<Warp> warps;
  HopperState hopper;  // mbarriers, bulk copies, warpgroups (kernel_hopper.cpp, kernel_wgmma.cpp)
  std::array<NamedBarrier, 16> nbars;
  bool nbar_used = false;  // a named barrier was used since block_setup
  unsigned next_start = 0, live = 0, exited = 0, first_exited = 0;
  // The barrier being gathered.
  unsigned bar_arrived = 0, bar_first = 0;
  int bar_or = 0, bar_and = 1, bar_count = 0;
  std::vector<unsigned> bar_waiters;
  // Threads ready to resume; [run_head, size) are pending.
  std::vector<unsigned> runnable;
  size_t run_head = 0;
  bool cancel = false;
  cudaError_t err = cudaSuccess;
  std::string msg;
  // Seeded order: threads start in the permutation (a * i + b) mod n; runnable ones
  // resume in random order.
  bool shuffled = false;
  int order = 0;  // Schedule (engine.h): warp-ahead / warp-behind pick threads by warp
  uint64_t rng = 0;
  unsigned perm_a = 1, perm_cur = 0;

  uint64_t next_random() {  // splitmix64
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  unsigned random_below(unsigned bound) {  // no division: this runs at every switch
    return static_cast<unsigned>(((next_random() & 0xffffffffu) * bound) >> 32);
  }
  // Racecheck state (racecheck.cpp): the current barrier interval, each warp's sync
  // generation, the first hazard.
  uint32_t rc_epoch = 0;
  std::vector<uint32_t> rc_gen;
  Hazard hazard;

  unsigned next_start_peek() const { return order == 2 ? n - 1 - next_start : next_start; }  // order != 0
  unsigned start_next() {  // the next thread to start; next_start < n
    ++next_start;
    if (order == 2) return n - next_start;  // warp-behind: the last warp first
    if (!shuffled) return next_start - 1;
    const unsigned t = perm_cur;
    perm_cur += perm_a;  // perm_a < n
    if (perm_cur >= n) perm_cur -= n;
    return t;
  }
  void make_runnable(unsigned t) {
    threads[t].state = TState::RUNNABLE;
    runnable.push_back(t);
  }
};

// ----------------------------------------------------------------------------
// Fibers. A carrier fiber runs block threads one after another; it only stays with a
// thread that blocks, so pointwise kernels cost one call per thread and a block needs
// as many carriers as it has threads blocked at once (plus one). A carrier that blocks
// picks the next one to run and switches to it directly; the worker's own stack (the
// `native` carrier) only runs when nothing else can.
struct Carrier {
  boost::context::fiber self;  // valid while suspended
  Worker* w = nullptr;
  bool quit = false;
  char* stack_lo = nullptr;  // lowest usable byte; the guard page is just below
};

struct Worker {
  Block block;
  std::vector<std::unique_ptr<Carrier>> carriers;
  std::vector<Carrier*> idle;
  Carrier native;              // the OS thread's own context: the block loop
  Carrier* current = &native;  // the carrier running now
  Carrier* switched_from = nullptr;
  Launch* running = nullptr;  // set while this thread runs a block
  char* smem_map = nullptr;   // SMEM_RESERVE bytes, then the guard page
  volatile sig_atomic_t smem_guard_open = 0;
  const char* smem_base = nullptr;
  size_t smem_size = 0;
  char* altstack = nullptr;
  // This OS thread's thread-local storage blocks (static __shared__ lives there), one
  // [begin, end) per module; read when first needed and again when an address is in none.
  std::vector<std::pair<const char*, const char*>> tls;
  // Racecheck (racecheck.cpp): on while it runs a block under racecheck; shadow cells for
  // the dynamic shared memory reserve and for the TLS block holding static __shared__.
  bool rc_active = false;
  uint32_t rc_clock = 0;
  RaceCell* rc_dyn = nullptr;
  RaceCell* rc_tls = nullptr;
  const char* rc_tls_lo = nullptr;
  size_t rc_tls_len = 0;
  unsigned bulk_in_flight = 0;  // bulk copies into dynamic shared memory not landed yet

  Worker();
  ~Worker();
  char* smem_guard() const { return smem_map + SMEM_RESERVE; }
};

extern thread_local constinit Worker* t_worker;  // for the signal handler

// The running block thread (t_thread_idx points at its Thread's first member).
inline Thread* cur_thread() { return reinterpret_cast<Thread*>(const_cast<uint3*>(t_thread_idx)); }

// Report helpers (kernel_exec.cpp).
std::string dims_str(uint3 v);
std::string where_str(const char* file, int line);
std::string hex(unsigned long long v);
const char* op_name(int op);
std::string lane_str(const Block& b, unsigned t);  // "thread (x,y,z) (warp w lane l)"

// Scheduler services for the instructions in kernel_mma.cpp (kernel_exec.cpp).
// The block the calling kernel thread runs in (aborts when called outside a kernel).
[[noreturn, gnu::cold]] void outside_kernel(const char* file, int line, const char* what);
inline Block& current_block(const char* file, int line, const char* what) {
  if (!t_thread_idx || !t_worker || !t_worker->running) outside_kernel(file, line, what);
  return t_worker->block;
}
// Fails the block with `msg` (the first failure wins) and unwinds the calling thread.
[[noreturn]] void thread_fail(Block& b, std::string msg, cudaError_t e = cudaErrorLaunchFailure);
// A .sync.aligned warp instruction: parks the calling lane, whose operands are at `io`,
// until all 32 lanes of its warp reach the same op at the same call site (anything else
// fails the block); the last to arrive calls aligned_complete and resumes the others.
void warp_aligned(Block& b, Thread& th, const char* file, int line, int op, const void* io);

// Parks the calling thread until another makes it runnable (Block::make_runnable);
// unwinds it when the block failed meanwhile.
void thread_park(Block& b, Thread& th);

// Hopper state (kernel_hopper.cpp). hopper_block_start clears what a previous block left;
// hopper_block_end returns why the block may not end as it did ("" when it may).
void hopper_block_start(Block& b);
std::string hopper_block_end(Block& b);
// Nothing of the block can run: the bulk copies in flight finish (as the GPU's copy
// engine would), which may complete phases. True when that made threads runnable; *why
// is set when it made the block fail instead.
bool hopper_progress(Block& b, std::string* why);
std::string wgmma_block_end(Block& b);  // kernel_wgmma.cpp: wgmma left unretired
// Named barriers (kernel_namedbar.cpp): clears what a previous block left; why the block
// may not end as it did ("" when it may); why thread t may not exit now ("" when it may);
// what a thread parked at OP_NBAR_* waits for, for the deadlock report.
void named_barrier_block_start(Block& b);
std::string named_barrier_block_end(const Block& b);
std::string named_barrier_exit(const Block& b, unsigned t);
std::string named_barrier_wait_str(const Block& b, const Thread& th);
// What a thread parked at OP_MBAR_WAIT waits for, for the deadlock report.
std::string mbarrier_wait_str(const Block& b, const Thread& th);
// Fails the calling thread with cudaErrorIllegalInstruction unless the device profile is
// compute capability 9.0 or above (the sm_90 instructions), or exactly 9.0 for the sm_90a
// ones (wgmma: Blackwell has tcgen05 instead).
void require_sm90(Block& b, unsigned t, const char* what, const char* file, int line, bool sm90a = false);

// Shared-memory operands (kernel_mma.cpp): whether [p, p + bytes) is the block's dynamic
// shared memory or static __shared__ storage, and what it is instead, for a report.
bool in_shared(Worker& w, const void* p, size_t bytes);
std::string not_shared_str(const Worker& w, const Thread& th, const void* p, size_t bytes);

// Tensor-core instructions (kernel_mma.cpp): every lane's result of aligned op `op`
// from the 32 lanes' operands (lanes[i].io).
void aligned_complete(int op, Thread* lanes);

// Racecheck (racecheck.cpp). The kernels' loads and stores reach it through GCC's
// -fsanitize=thread hooks, which the engine defines itself (no libtsan).
// Whether launch k is its configuration's first in this process (CUDA_EMU_RACECHECK=first).
bool racecheck_first_launch(const KernelLaunch& k);
// Prepares the worker's shadow and the block's clocks (block_setup); `on`: the block runs
// under the racecheck (its launch's Launch::racecheck).
void racecheck_block_start(Worker& w, Block& b, bool on);
// A __syncthreads completed / warp `warp` completed a warp instruction: what came
// before is ordered before what follows.
inline void racecheck_barrier(Worker& w, Block& b) {
  if (w.rc_active) b.rc_epoch = ++w.rc_clock;
}
inline void racecheck_warp_sync(Worker& w, Block& b, unsigned warp) {
  if (w.rc_active) b.rc_gen[warp] = ++w.rc_clock;
}
// An access the engine performs for the calling thread (ldmatrix rows, cp.async landing),
// attributed to kernel code at `pc`.
void racecheck_access(const void* p, size_t bytes, bool write, uintptr_t pc);
// Bytes the async proxy wrote (a bulk copy landing at its mbarrier's phase completion,
// which orders it for the waiters): their cells forget earlier accesses, so a waiter's
// read is not paired with a store the copy overwrote. The racecheck does not yet treat an
// mbarrier phase as ordering generic accesses between threads.
void racecheck_forget(const void* p, size_t bytes);
// An instrumented access to dynamic shared memory while bulk copies are in flight
// (kernel_hopper.cpp): one that touches a copy's destination before its phase completed
// fails the block (a GPU's result depends on when the copy engine gets there).
void bulk_in_flight_access(Block& b, const char* p, size_t n, bool write, uintptr_t pc);
// The block's hazard, with both source lines (after the block ran).
std::string racecheck_report(const Block& b);
// "file:line (in function), inlined at ..." for a code address (kernel_faults.cpp).
std::string code_location(uintptr_t pc);

// Memory faults (kernel_faults.cpp).
// (Re)installs the SIGSEGV / SIGBUS handler; checked at each launch.
void fault_handler_ensure();
// The report of the fault recorded in L.fault (L.fault_state == 2).
std::string fault_report(const Launch& L);

}  // namespace cuda_emu
