// CUDA execution engine (test-only): runs kernels on the CPU. Blocks go to a worker
// pool; a block's threads run as cooperative fibers that switch at barriers and warp
// intrinsics, which check what a GPU leaves undefined. Memory faults: kernel_faults.cpp;
// tensor-core instructions and cp.async: kernel_mma.cpp.
#include "kernel_exec_internal.h"

#include <boost/context/fiber.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace cuda_emu {

thread_local constinit BlockContext t_block;
thread_local constinit const uint3* t_thread_idx = nullptr;
thread_local constinit Worker* t_worker = nullptr;

namespace {

namespace bctx = boost::context;

constexpr size_t ALT_STACK = 64 * 1024;

struct Cancelled {};  // unwinds a thread of a failed block to its fiber's entry

// ----------------------------------------------------------------------------
// Fibers: carriers (kernel_exec_internal.h) run on these stacks.
struct Stack {  // Boost.Context StackAllocator: mmap'd, guard page at the bottom
  Carrier* c;
  bctx::stack_context allocate() {
    const size_t len = FIBER_STACK + page_size();
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    mprotect(m, page_size(), PROT_NONE);
    c->stack_lo = static_cast<char*>(m) + page_size();
    bctx::stack_context sc;
    sc.size = len;
    sc.sp = static_cast<char*>(m) + len;
    return sc;
  }
  void deallocate(bctx::stack_context& sc) noexcept { munmap(static_cast<char*>(sc.sp) - sc.size, sc.size); }
};

thread_local std::unique_ptr<Worker> t_worker_owner;
thread_local constinit bool t_pool_thread = false;

Worker& this_worker() {
  if (!t_worker) {
    t_worker_owner = std::make_unique<Worker>();
    t_worker = t_worker_owner.get();
  }
  return *t_worker;
}

// Suspends `from` (the running carrier) and runs `to`. Whoever resumes `from` later
// hands over its own continuation, which is stored back into that carrier.
void switch_to(Worker& w, Carrier* from, Carrier* to) {
  w.switched_from = from;
  bctx::fiber f = std::move(to->self).resume();
  w.switched_from->self = std::move(f);
  w.current = from;
}
Carrier* carrier_next(Worker& w);

void altstack_ensure(Worker& w) {
  stack_t cur{};
  if (sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) return;  // someone's is enough
  stack_t st{};
  st.ss_sp = w.altstack;
  st.ss_size = ALT_STACK;
  sigaltstack(&st, nullptr);
}

}  // namespace

Worker::Worker() {
  const size_t len = SMEM_RESERVE + page_size();
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  smem_map = static_cast<char*>(m);
  mprotect(smem_guard(), page_size(), PROT_NONE);
  void* a = mmap(nullptr, ALT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) throw std::bad_alloc();
  altstack = static_cast<char*>(a);
  block.w = this;
}

Worker::~Worker() {
  for (auto& c : carriers) {  // idle carriers return from their loop when told to quit
    c->quit = true;
    if (c->self) switch_to(*this, &native, c.get());
  }
  carriers.clear();
  stack_t cur{};
  if (sigaltstack(nullptr, &cur) == 0 && cur.ss_sp == altstack) {
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
  }
  munmap(altstack, ALT_STACK);
  munmap(smem_map, SMEM_RESERVE + page_size());
  t_worker = nullptr;
}

// ----------------------------------------------------------------------------
// Report helpers.
std::string dims_str(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}
std::string where_str(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }
std::string hex(unsigned long long v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", v);
  return buf;
}
const char* op_name(int op) {
  static const char* const names[] = {"__syncthreads",
                                      "__syncthreads_or",
                                      "__syncthreads_and",
                                      "__syncthreads_count",
                                      "__shfl_sync",
                                      "__shfl_xor_sync",
                                      "__shfl_up_sync",
                                      "__shfl_down_sync",
                                      "__syncwarp",
                                      "__ballot_sync",
                                      "mbarrier.try_wait.parity.shared::cta.b64",
                                      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                      "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                                      "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                                      "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                                      "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
                                      "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                                      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                                      "wgmma.fence.sync.aligned",
                                      "wgmma.mma_async.sync.aligned",
                                      "wgmma.commit_group.sync.aligned",
                                      "wgmma.wait_group.sync.aligned",
                                      "bar.sync",
                                      "bar.arrive"};
  return names[op];
}

namespace {

std::string thread_str(const Block& b, unsigned t) { return "thread " + dims_str(b.threads[t].idx); }
std::string lanes_str(unsigned bits) {  // "0,3,8-31"
  std::string s;
  for (int i = 0; i < 32;) {
    if (!(bits >> i & 1u)) {
      ++i;
      continue;
    }
    int j = i;
    while (j + 1 < 32 && (bits >> (j + 1) & 1u)) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(i);
    if (j > i) s += "-" + std::to_string(j);
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}
std::string op_at(const Thread& th) {
  std::string s = op_name(th.op);
  if (th.op >= OP_SHFL_IDX && th.op <= OP_BALLOT) s += "(mask " + hex(th.mask) + ")";
  s += " at " + where_str(th.file, th.line);
  if (th.op == OP_MBAR_WAIT) s += " (" + mbarrier_wait_str(t_worker->block, th) + ")";
  if (th.op == OP_NBAR_SYNC || th.op == OP_NBAR_ARRIVE) s += " (" + named_barrier_wait_str(t_worker->block, th) + ")";
  return s;
}

// Fails the block: the first failure wins; everything else unwinds.
void block_fail(Block& b, cudaError_t e, std::string msg) {
  if (b.cancel) return;
  b.cancel = true;
  b.err = e;
  b.msg = std::move(msg);
}
}  // namespace

// Shared with kernel_mma.cpp (kernel_exec_internal.h).
std::string lane_str(const Block& b, unsigned t) {
  return thread_str(b, t) + " (warp " + std::to_string(t / 32) + " lane " + std::to_string(t % 32) + ")";
}

[[noreturn]] void thread_fail(Block& b, std::string msg, cudaError_t e) {
  block_fail(b, e, std::move(msg));
  throw Cancelled{};
}

void outside_kernel(const char* file, int line, const char* what) {
  std::fprintf(stderr, "cuda_emu: %s called outside a kernel at %s:%d\n", what, file, line);
  std::abort();
}

namespace {

// Suspends the calling thread until the op it registered completes. Inlined into each
// waiting op (barrier, warp_op, warp_aligned): a call here costs the shuffle path ~15%.
[[gnu::always_inline]] inline void thread_wait(Block& b, Thread& th) {
  th.state = TState::BLOCKED;
  Worker& w = *b.w;
  switch_to(w, th.carrier, carrier_next(w));
  t_thread_idx = &th.idx;
  if (b.cancel) throw Cancelled{};
}

// ----------------------------------------------------------------------------
// Barriers.
// The error paths build their messages out of line, keeping the hot functions' stack
// frames small (every blocked fiber keeps one alive).
[[gnu::cold, gnu::noinline, noreturn]] void barrier_misuse(Block& b, unsigned t) {
  const Thread& th = b.threads[t];
  if (b.exited > 0)
    thread_fail(b, thread_str(b, t) + " waits at " + op_at(th) + " but " + std::to_string(b.exited) +
                       " thread(s) of the block already exited (e.g. " + thread_str(b, b.first_exited) +
                       "): every thread of a block must reach each __syncthreads");
  const Thread& f = b.threads[b.bar_first];
  thread_fail(b, "threads wait at different barriers: " + std::to_string(b.bar_arrived) + " thread(s) at " + op_at(f) +
                     " (e.g. " + thread_str(b, b.bar_first) + "), " + thread_str(b, t) + " at " + op_at(th));
}

bool warp_before(const Block& b, unsigned x, unsigned y);
size_t best_runnable(const Block& b);

}  // namespace

void thread_park(Block& b, Thread& th) { thread_wait(b, th); }

namespace {

// Warp-ordered schedules: the thread that completes a barrier runs on only when no
// thread of an earlier warp (in the schedule's order) can run.
void yield_to_earlier_warp(Block& b, Thread& th, unsigned t) {
  if (b.run_head == b.runnable.size() || !warp_before(b, b.runnable[best_runnable(b)], t)) return;
  b.make_runnable(t);
  Worker& w = *b.w;
  switch_to(w, th.carrier, carrier_next(w));  // an earlier warp's thread, never this one
  t_thread_idx = &th.idx;
  if (b.cancel) throw Cancelled{};
}

int barrier(const char* file, int line, int op, int pred) {
  Block& b = current_block(file, line, op_name(op));
  Thread& th = *cur_thread();
  const unsigned t = static_cast<unsigned>(&th - b.threads.data());
  th.op = op;
  th.file = file;
  th.line = line;
  if (b.exited > 0) barrier_misuse(b, t);
  if (b.bar_arrived == 0) {
    b.bar_first = t;
    b.bar_or = 0;
    b.bar_and = 1;
    b.bar_count = 0;
  } else {
    const Thread& f = b.threads[b.bar_first];
    if (f.line != line || f.op != op || (f.file != file && std::strcmp(f.file, file) != 0)) barrier_misuse(b, t);
  }
  b.bar_or |= pred != 0;
  b.bar_and &= pred != 0;
  b.bar_count += pred != 0;
  if (++b.bar_arrived < b.n) {
    b.bar_waiters.push_back(t);
    thread_wait(b, th);
    return static_cast<int>(th.result);
  }
  racecheck_barrier(*b.w, b);
  int r = 0;
  if (op == OP_BAR_OR) r = b.bar_or;
  if (op == OP_BAR_AND) r = b.bar_and;
  if (op == OP_BAR_COUNT) r = b.bar_count;
  for (unsigned w : b.bar_waiters) {
    b.threads[w].result = static_cast<uint64_t>(r);
    b.make_runnable(w);
  }
  b.bar_waiters.clear();
  b.bar_arrived = 0;
  if (b.order != 0) yield_to_earlier_warp(b, th, t);
  return r;
}

// ----------------------------------------------------------------------------
// Warp intrinsics: the lanes of `mask` meet; the last to arrive computes every lane's
// result. Lanes outside the mask run on (independent thread scheduling).
int shuffle_source(int op, int lane, int arg, int width) {
  const int seg = lane & ~(width - 1);
  switch (op) {
    case OP_SHFL_IDX: return seg + (arg & (width - 1));
    case OP_SHFL_XOR: {
      const int s = lane ^ arg;
      return s >= seg + width || s > 31 || s < 0 ? lane : s;  // later segments: own value
    }
    case OP_SHFL_UP: return lane - arg < seg ? lane : lane - arg;
    default: return (lane & (width - 1)) + arg >= width ? lane : lane + arg;
  }
}

enum WarpMisuse { NOT_IN_MASK, NO_SUCH_LANE, LANE_EXITED, BAD_WIDTH, OTHER_OP, SOURCE_OUTSIDE };

[[gnu::cold, gnu::noinline, noreturn]] void warp_misuse(Block& b, unsigned t, WarpMisuse why, const WarpGroup* g,
                                                        int source = 0) {
  const Thread& th = b.threads[t];
  const unsigned warp = t / 32, lane = t % 32;
  const Warp& w = b.warps[warp];
  const std::string who = thread_str(b, t) + " (warp " + std::to_string(warp) + " lane " + std::to_string(lane) + ")";
  switch (why) {
    case NOT_IN_MASK: thread_fail(b, who + " calls " + op_at(th) + " with a mask that does not include its lane");
    case NO_SUCH_LANE:
      thread_fail(b, who + " calls " + op_at(th) + ": the mask names lanes " + lanes_str(th.mask & ~w.present) +
                         " that do not exist (the block has " + std::to_string(b.n) + " threads; warp " +
                         std::to_string(warp) + " has lanes " + lanes_str(w.present) + ")");
    case LANE_EXITED:
      thread_fail(b, who + " calls " + op_at(th) + ": the mask names lanes " + lanes_str(th.mask & w.exited) +
                         " that already exited");
    case BAD_WIDTH:
      thread_fail(b, who + " calls " + op_at(th) + " with width " + std::to_string(th.width) +
                         " (must be a power of 2 up to 32)");
    case OTHER_OP: {
      const unsigned other = warp * 32 + static_cast<unsigned>(__builtin_ctz(g->arrived));
      thread_fail(b, "lanes of one warp meet at different warp intrinsics: " + thread_str(b, other) + " at " +
                         op_at(b.threads[other]) + (th.bytes != g->bytes ? " (other value size)" : "") +
                         (th.width != g->width ? " (other width)" : "") + ", " + who + " at " + op_at(th));
    }
    case SOURCE_OUTSIDE:
      thread_fail(b, who + " at " + op_at(th) + " reads lane " + std::to_string(source) +
                         ", which is not in the mask (a GPU returns an undefined value)");
  }
  thread_fail(b, who + ": warp intrinsic misuse");
}

void warp_complete(Block& b, unsigned warp, const WarpGroup& g, unsigned self) {
  Thread* lanes = &b.threads[warp * 32];
  if (g.op == OP_BALLOT) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i)
      if ((g.mask >> i & 1u) && lanes[i].value) r |= 1u << i;
    for (int i = 0; i < 32; ++i)
      if (g.mask >> i & 1u) lanes[i].result = r;
  } else if (g.op != OP_SYNCWARP) {
    for (int i = 0; i < 32; ++i) {
      if (!(g.mask >> i & 1u)) continue;
      const int s = shuffle_source(g.op, i, lanes[i].arg, g.width);
      if (!(g.mask >> s & 1u)) warp_misuse(b, warp * 32 + static_cast<unsigned>(i), SOURCE_OUTSIDE, &g, s);
      lanes[i].result = lanes[s].value;
    }
  }
  racecheck_warp_sync(*b.w, b, warp);
  for (int i = 0; i < 32; ++i)
    if ((g.mask >> i & 1u) && static_cast<unsigned>(i) != self) b.make_runnable(warp * 32 + i);
}

uint64_t warp_op(const char* file, int line, int op, unsigned mask, uint64_t value, int bytes, int arg, int width) {
  Block& b = current_block(file, line, op_name(op));
  Thread& th = *cur_thread();
  const unsigned t = static_cast<unsigned>(&th - b.threads.data()), warp = t / 32, lane = t % 32;
  Warp& w = b.warps[warp];
  th.op = op;
  th.file = file;
  th.line = line;
  th.mask = mask;
  th.value = value;
  th.bytes = bytes;
  th.arg = arg;
  th.width = width;
  if (!(mask >> lane & 1u)) warp_misuse(b, t, NOT_IN_MASK, nullptr);
  if (mask & ~w.present) warp_misuse(b, t, NO_SUCH_LANE, nullptr);
  if (mask & w.exited) warp_misuse(b, t, LANE_EXITED, nullptr);
  if (op >= OP_SHFL_IDX && op <= OP_SHFL_DOWN && (width < 1 || width > 32 || (width & (width - 1)) != 0))
    warp_misuse(b, t, BAD_WIDTH, nullptr);
  // A pending .sync.aligned group waits for every lane: lanes of it may first meet here
  // (e.g. a half-warp shuffle before an mma all lanes reach), so it is no conflict.
  WarpGroup* g = nullptr;
  for (auto& x : w.groups)
    if ((x.mask & mask) && !aligned_op(x.op)) g = &x;
  if (!g) {
    w.groups.push_back(WarpGroup{mask, 0, op, bytes, width});
    g = &w.groups.back();
  } else if (g->mask != mask || g->op != op || g->bytes != bytes || g->width != width) {
    warp_misuse(b, t, OTHER_OP, g);
  }
  g->arrived |= 1u << lane;
  if (g->arrived != mask) {
    thread_wait(b, th);
    return th.result;
  }
  const WarpGroup done = *g;
  *g = w.groups.back();
  w.groups.pop_back();
  warp_complete(b, warp, done, lane);
  return th.result;
}

// ----------------------------------------------------------------------------
// .sync.aligned warp instructions (mma, ldmatrix). All 32 lanes of the warp execute the
// same instruction: same op and qualifiers at the same call site, none of them exited,
// no partial warp. Each lane parks with a pointer to its operands (Thread::io: they live
// on its own stack, which stays valid while it waits); the last lane to arrive computes
// every lane's result and writes it through those pointers (kernel_mma.cpp).
constexpr unsigned FULL_WARP = 0xffffffffu;

enum AlignedMisuse { PARTIAL_WARP, LANES_EXITED, OTHER_INSTRUCTION };

[[gnu::cold, gnu::noinline, noreturn]] void aligned_misuse(Block& b, unsigned t, AlignedMisuse why,
                                                           const WarpGroup* g) {
  const Thread& th = b.threads[t];
  const unsigned warp = t / 32;
  const Warp& w = b.warps[warp];
  const std::string rule =
      " (.sync.aligned: all 32 lanes of the warp must execute the same instruction, a GPU leaves anything else "
      "undefined)";
  switch (why) {
    case PARTIAL_WARP:
      thread_fail(b, lane_str(b, t) + " executes " + op_at(th) + " in a partial warp: the block has " +
                         std::to_string(b.n) + " threads, so warp " + std::to_string(warp) + " has only lanes " +
                         lanes_str(w.present) + rule + "; make the block size a multiple of 32");
    case LANES_EXITED:
      thread_fail(b, lane_str(b, t) + " executes " + op_at(th) + " but lanes " + lanes_str(w.exited) +
                         " of its warp already exited (e.g. " +
                         thread_str(b, warp * 32 + static_cast<unsigned>(__builtin_ctz(w.exited))) + ")" + rule);
    case OTHER_INSTRUCTION: {
      const unsigned other = warp * 32 + static_cast<unsigned>(__builtin_ctz(g->arrived));
      thread_fail(b, "lanes of one warp execute different warp instructions: " + lane_str(b, other) + " at " +
                         op_at(b.threads[other]) + ", " + lane_str(b, t) + " at " + op_at(th) + rule);
    }
  }
  thread_fail(b, lane_str(b, t) + ": .sync.aligned warp instruction misuse");
}

bool same_site(const Thread& x, const char* file, int line) {
  return x.line == line && (x.file == file || std::strcmp(x.file, file) == 0);
}

}  // namespace

void warp_aligned(Block& b, Thread& th, const char* file, int line, int op, const void* io) {
  const unsigned t = static_cast<unsigned>(&th - b.threads.data()), warp = t / 32, lane = t % 32;
  Warp& w = b.warps[warp];
  th.op = op;
  th.file = file;
  th.line = line;
  th.mask = FULL_WARP;
  th.io = io;
  if (w.present != FULL_WARP) aligned_misuse(b, t, PARTIAL_WARP, nullptr);
  if (w.exited) aligned_misuse(b, t, LANES_EXITED, nullptr);
  WarpGroup* g = nullptr;  // at most one: it waits for every lane
  for (auto& x : w.groups)
    if (aligned_op(x.op)) g = &x;
  if (!g) {
    w.groups.push_back(WarpGroup{FULL_WARP, 0, op, 0, 32});
    g = &w.groups.back();
  } else if (g->op != op ||
             !same_site(b.threads[warp * 32 + static_cast<unsigned>(__builtin_ctz(g->arrived))], file, line)) {
    aligned_misuse(b, t, OTHER_INSTRUCTION, g);
  }
  g->arrived |= 1u << lane;
  if (g->arrived != FULL_WARP) {
    thread_wait(b, th);
    return;
  }
  *g = w.groups.back();
  w.groups.pop_back();
  Thread* lanes = &b.threads[warp * 32];
  aligned_complete(op, lanes);
  racecheck_warp_sync(*b.w, b, warp);
  for (unsigned i = 0; i < 32; ++i)
    if (i != lane) b.make_runnable(warp * 32 + i);
}

namespace {

// A thread returned from the kernel: a barrier or warp op waiting for it can never
// complete.
void thread_exit(Block& b, unsigned t) {
  Thread& th = b.threads[t];
  th.state = TState::DONE;
  --b.live;
  if (b.exited++ == 0) b.first_exited = t;
  Warp& w = b.warps[t / 32];
  w.exited |= 1u << (t % 32);
  if (b.cancel) return;
  if (b.bar_arrived > 0) {
    block_fail(b, cudaErrorLaunchFailure,
               thread_str(b, t) + " exited while " + std::to_string(b.bar_arrived) + " thread(s) wait at " +
                   op_at(b.threads[b.bar_first]) + " (e.g. " + thread_str(b, b.bar_first) +
                   "): every thread of a block must reach each __syncthreads");
    return;
  }
  if (b.nbar_used) {
    std::string why = named_barrier_exit(b, t);
    if (!why.empty()) {
      block_fail(b, cudaErrorLaunchFailure, std::move(why));
      return;
    }
  }
  for (const auto& g : w.groups) {
    if (!(g.mask >> (t % 32) & 1u)) continue;
    const unsigned other = (t / 32) * 32 + static_cast<unsigned>(__builtin_ctz(g.arrived));
    block_fail(b, cudaErrorLaunchFailure,
               thread_str(b, t) + " (lane " + std::to_string(t % 32) + ") exited while lanes " + lanes_str(g.arrived) +
                   " of its warp wait for it at " + op_at(b.threads[other]));
    return;
  }
}

// ----------------------------------------------------------------------------
// Running a block.
void run_thread(Block& b, unsigned t, Carrier* c) {
  Thread& th = b.threads[t];
  th.state = TState::RUNNING;
  th.carrier = c;
  ++b.live;
  t_thread_idx = &th.idx;
  try {
    b.launch->k->body();
  } catch (const Cancelled&) {
  } catch (const bctx::detail::forced_unwind&) {
    throw;
  } catch (const std::exception& e) {
    block_fail(b, cudaErrorLaunchFailure, thread_str(b, t) + " threw an exception: " + e.what());
  } catch (...) {
    block_fail(b, cudaErrorLaunchFailure, thread_str(b, t) + " threw an exception");
  }
  thread_exit(b, t);
}

bctx::fiber carrier_main(Carrier* c, bctx::fiber&& from) {
  Worker& w = *c->w;
  w.switched_from->self = std::move(from);
  w.current = c;
  Block& b = w.block;
  while (!c->quit) {
    while (!b.cancel && b.next_start < b.n) {
      // Ordered by warp: a resumable thread of an earlier warp goes before a new one.
      if (b.order != 0 && b.run_head < b.runnable.size() &&
          warp_before(b, b.runnable[best_runnable(b)], b.next_start_peek()))
        break;
      run_thread(b, b.start_next(), c);
    }
    w.idle.push_back(c);
    switch_to(w, c, carrier_next(w));
  }
  return std::move(w.native.self);
}

Carrier* carrier_get(Worker& w) {
  if (!w.idle.empty()) {
    Carrier* c = w.idle.back();
    w.idle.pop_back();
    return c;
  }
  auto c = std::make_unique<Carrier>();
  Carrier* p = c.get();
  p->w = &w;
  p->self = bctx::fiber(std::allocator_arg, Stack{p}, [p](bctx::fiber&& s) { return carrier_main(p, std::move(s)); });
  w.carriers.push_back(std::move(c));
  return p;
}

std::string deadlock_report(const Block& b) {
  // Waiting threads grouped by the op and line they wait at.
  std::map<std::string, std::pair<unsigned, unsigned>> waits;  // -> (count, first thread)
  for (unsigned t = 0; t < b.n; ++t) {
    const Thread& th = b.threads[t];
    if (th.state != TState::BLOCKED) continue;
    auto [it, fresh] = waits.try_emplace(op_at(th), 0u, t);
    ++it->second.first;
  }
  std::string s = "deadlock: no thread of the block can proceed;";
  for (const auto& [what, cf] : waits)
    s += " " + std::to_string(cf.first) + " thread(s) wait at " + what + " (e.g. " + thread_str(b, cf.second) + ");";
  if (b.exited) s += " " + std::to_string(b.exited) + " thread(s) exited (e.g. " + thread_str(b, b.first_exited) + ")";
  return s;
}

void block_setup(Worker& w, Launch& L, uint3 bidx) {
  Block& b = w.block;
  const KernelLaunch& k = *L.k;
  b.launch = &L;
  b.n = L.nthreads;
  if (b.dims.x != k.block.x || b.dims.y != k.block.y || b.dims.z != k.block.z) {
    b.dims = k.block;
    b.threads.resize(b.n);
    unsigned t = 0;
    for (unsigned z = 0; z < k.block.z; ++z)
      for (unsigned y = 0; y < k.block.y; ++y)
        for (unsigned x = 0; x < k.block.x; ++x) b.threads[t++].idx = uint3{x, y, z};
    b.async.resize(b.n);
    b.warps.resize((b.n + 31) / 32);
    for (size_t i = 0; i < b.warps.size(); ++i) {
      const unsigned lanes = std::min(32u, b.n - static_cast<unsigned>(i) * 32);
      b.warps[i].present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
  }
  for (auto& th : b.threads) th.state = TState::UNSTARTED;
  if (b.async_used) {  // copies a previous block's threads left in flight are dropped
    for (auto& a : b.async) {
      a.q.clear();
      a.committed = 0;
    }
    b.async_used = false;
  }
  for (auto& wp : b.warps) {
    wp.exited = 0;
    wp.groups.clear();
  }
  hopper_block_start(b);
  named_barrier_block_start(b);
  b.next_start = b.live = b.exited = b.first_exited = 0;
  b.bar_arrived = 0;
  b.bar_waiters.clear();
  b.runnable.clear();
  b.run_head = 0;
  b.cancel = false;
  b.err = cudaSuccess;
  b.msg.clear();
  b.order = L.order;
  b.shuffled = L.seed != 0 && b.n > 1 && b.order == 0;
  if (b.shuffled) {
    const uint64_t lin = bidx.x + static_cast<uint64_t>(k.grid.x) * (bidx.y + static_cast<uint64_t>(k.grid.y) * bidx.z);
    b.rng = L.seed * 0x9e3779b97f4a7c15ull ^ (L.serial << 32) ^ lin;
    b.perm_a = 1;
    for (int i = 0; i < 8; ++i) {  // a step coprime to n makes i -> a*i+b (mod n) a permutation
      const unsigned a = 1 + b.random_below(b.n - 1);
      unsigned x = a, y = b.n;
      while (y) {
        const unsigned r = x % y;
        x = y;
        y = r;
      }
      if (x == 1) {
        b.perm_a = a;
        break;
      }
    }
    b.perm_cur = b.random_below(b.n);
  }
  racecheck_block_start(w, b, L.racecheck);
  t_block.block_idx = bidx;
  t_block.block_dim = k.block;
  t_block.grid_dim = k.grid;
  const size_t rounded = (k.dynamic_smem + 15) & ~size_t{15};
  char* base = w.smem_guard() - rounded;
  if (rounded) std::memset(base, 0xff, rounded);
  w.smem_base = base;
  w.smem_size = k.dynamic_smem;
  t_block.dynamic_smem = base;
}

bool warp_before(const Block& b, unsigned x, unsigned y) { return b.order == 1 ? x / 32 < y / 32 : x / 32 > y / 32; }
size_t best_runnable(const Block& b) {  // b.run_head < b.runnable.size()
  size_t best = b.run_head;
  for (size_t i = b.run_head + 1; i < b.runnable.size(); ++i)
    if (warp_before(b, b.runnable[i], b.runnable[best])) best = i;
  return best;
}

// The warp-ahead / warp-behind schedules: the runnable or unstarted thread of the lowest
// (highest) warp runs next, so that warp runs as far as it can before any other does.
Carrier* carrier_next_by_warp(Worker& w, bool can_resume, bool can_start) {
  Block& b = w.block;
  if (can_resume) {
    const size_t best = best_runnable(b);
    if (!can_start || !warp_before(b, b.next_start_peek(), b.runnable[best])) {
      std::swap(b.runnable[b.run_head], b.runnable[best]);
      Thread& th = b.threads[b.runnable[b.run_head++]];
      if (b.run_head == b.runnable.size()) b.runnable.clear(), b.run_head = 0;
      th.state = TState::RUNNING;
      return th.carrier;
    }
  }
  if (can_start) return carrier_get(w);
  return &w.native;
}

// What runs next: a thread whose wait completed, a carrier to start more threads, or
// the block loop when neither exists (block done, deadlock, unwinding).
Carrier* carrier_next(Worker& w) {
  Block& b = w.block;
  const bool can_resume = b.run_head < b.runnable.size();
  const bool can_start = !b.cancel && b.next_start < b.n;
  if (b.order != 0) return carrier_next_by_warp(w, can_resume, can_start);
  if (can_resume && !(can_start && b.shuffled && (b.next_random() & 1))) {
    if (b.shuffled) {
      const size_t pending = b.runnable.size() - b.run_head;
      std::swap(b.runnable[b.run_head], b.runnable[b.run_head + b.random_below(static_cast<unsigned>(pending))]);
    }
    Thread& th = b.threads[b.runnable[b.run_head++]];
    if (b.run_head == b.runnable.size()) b.runnable.clear(), b.run_head = 0;
    th.state = TState::RUNNING;
    return th.carrier;
  }
  if (can_start) return carrier_get(w);
  return &w.native;
}

void block_run(Worker& w, Launch& L, uint3 bidx) {
  block_setup(w, L, bidx);
  Block& b = w.block;
  w.running = &L;
  for (;;) {
    Carrier* c = carrier_next(w);
    if (c != &w.native) {
      switch_to(w, &w.native, c);
    } else if (b.live == 0) {
      break;
    } else if (!b.cancel) {
      std::string why;
      if (b.hopper.used && hopper_progress(b, &why)) continue;
      block_fail(b, cudaErrorLaunchFailure, why.empty() ? deadlock_report(b) : why);
      continue;
    } else {  // resume every waiting thread so it unwinds
      for (unsigned t = 0; t < b.n; ++t)
        if (b.threads[t].state == TState::BLOCKED) b.make_runnable(t);
      if (b.run_head == b.runnable.size()) {
        std::fprintf(stderr, "cuda_emu: internal error: %u live threads and none waiting\n", b.live);
        std::abort();
      }
    }
  }
  if (b.hopper.used && !b.cancel) {
    std::string why = hopper_block_end(b);
    if (!why.empty()) block_fail(b, cudaErrorLaunchFailure, std::move(why));
  }
  if (b.nbar_used && !b.cancel) {
    std::string why = named_barrier_block_end(b);
    if (!why.empty()) block_fail(b, cudaErrorLaunchFailure, std::move(why));
  }
  w.running = nullptr;
  w.rc_active = false;  // instrumented host code may run on this thread next
  t_thread_idx = nullptr;
  if (w.smem_guard_open) {
    mprotect(w.smem_guard(), page_size(), PROT_NONE);
    w.smem_guard_open = 0;
  }
  if (b.err != cudaSuccess) {
    std::lock_guard<std::mutex> lock(L.mu);
    if (L.err == cudaSuccess) {
      L.err = b.err;
      L.detail = "kernel " + L.k->name + " (launched at " + where_str(L.k->file, L.k->line) + ") block " +
                 dims_str(bidx) + ": " + (b.hazard.kind ? racecheck_report(b) : b.msg);
    }
    L.stop = true;
  }
}

// ----------------------------------------------------------------------------
// The worker pool: jobs are index ranges whose items are claimed with one atomic add;
// the submitting thread works on its own job too.
struct Job {
  size_t count = 0;
  std::atomic<size_t> next{0};
  void (*run)(void* ctx, size_t item) = nullptr;
  void* ctx = nullptr;
  int users = 0;  // pool threads inside it (pool mutex)
  bool queued = false;

  void drain() {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) run(ctx, i);
  }
};

class Pool {
 public:
  void run(Job& job) {
    if (t_pool_thread || job.count <= 1) {
      job.drain();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        job.drain();
        return;
      }
      if (threads_.empty()) {
        const unsigned n = std::max(1u, std::thread::hardware_concurrency());
        for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
      }
      jobs_.push_back(&job);
      job.queued = true;
    }
    work_cv_.notify_all();
    job.drain();
    std::unique_lock<std::mutex> lock(mu_);
    unqueue(job);
    done_cv_.wait(lock, [&] { return job.users == 0; });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void unqueue(Job& job) {
    if (!job.queued) return;
    jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job));
    job.queued = false;
  }

  void loop() {
    t_pool_thread = true;
    altstack_ensure(this_worker());
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) break;
      Job* j = jobs_.front();
      ++j->users;
      lock.unlock();
      j->drain();
      lock.lock();
      unqueue(*j);
      if (--j->users == 0) done_cv_.notify_all();
    }
    lock.unlock();
    t_worker_owner.reset();
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job*> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

// Never destroyed (executor threads may still submit work during exit); its threads
// are joined at exit, after which jobs run on the submitting thread.
Pool& pool() {
  static Pool* p = new Pool();
  static struct Joiner {
    ~Joiner() { p->stop(); }
  } joiner;
  return *p;
}

uint64_t seed_from_env() {
  static const uint64_t seed = [] {
    const char* e = std::getenv("CUDA_EMU_SEED");
    return e ? std::strtoull(e, nullptr, 10) : 1ull;
  }();
  return seed;
}

std::atomic<uint64_t> g_launch_serial{0};

}  // namespace

// ----------------------------------------------------------------------------
// Device-side entry points (cuda_emu_device.h).
void syncthreads(const char* file, int line) { barrier(file, line, OP_BAR, 0); }
int syncthreads_or(const char* file, int line, int pred) { return barrier(file, line, OP_BAR_OR, pred); }
int syncthreads_and(const char* file, int line, int pred) { return barrier(file, line, OP_BAR_AND, pred); }
int syncthreads_count(const char* file, int line, int pred) { return barrier(file, line, OP_BAR_COUNT, pred); }

void syncwarp(const char* file, int line, unsigned mask) { warp_op(file, line, OP_SYNCWARP, mask, 0, 0, 0, 32); }

unsigned ballot_sync(const char* file, int line, unsigned mask, int pred) {
  return static_cast<unsigned>(warp_op(file, line, OP_BALLOT, mask, pred != 0, 0, 0, 32));
}

// Independent thread scheduling lets every lane run alone; reporting only the caller is
// always a legal answer and the one that exposes code relying on convergence.
unsigned activemask(const char* file, int line) {
  current_block(file, line, "__activemask");
  const auto t = static_cast<unsigned>(cur_thread() - t_worker->block.threads.data());
  return 1u << (t % 32);
}

uint64_t warp_shuffle(const char* file, int line, ShuffleKind kind, unsigned mask, uint64_t bits, int bytes, int arg,
                      int width) {
  return warp_op(file, line, OP_SHFL_IDX + static_cast<int>(kind), mask, bits, bytes, arg, width);
}

// ----------------------------------------------------------------------------
cudaError_t kernel_run(const KernelLaunch& k, std::string* detail) {
  Worker& self = this_worker();
  if (self.running) {
    if (detail) *detail = "kernel " + k.name + " launched from inside another kernel (not supported)";
    return cudaErrorNotSupported;
  }
  const size_t nblocks = static_cast<size_t>(k.grid.x) * k.grid.y * k.grid.z;
  const size_t nthreads = static_cast<size_t>(k.block.x) * k.block.y * k.block.z;
  if (nblocks == 0 || nthreads == 0) return cudaSuccess;
  if (nthreads > 1024 || k.dynamic_smem > SMEM_RESERVE) {
    if (detail)
      *detail =
          "kernel " + k.name + " (launched at " + where_str(k.file, k.line) + "): configuration beyond the engine";
    return cudaErrorInvalidConfiguration;
  }
  fault_handler_ensure();
  altstack_ensure(self);
  Launch L;
  L.k = &k;
  L.nthreads = static_cast<unsigned>(nthreads);
  L.seed = seed_from_env();
  const ExecMode mode = exec_mode();
  L.order = static_cast<int>(mode.schedule);
  L.racecheck = mode.racecheck && (!mode.racecheck_first || racecheck_first_launch(k));
  L.serial = g_launch_serial.fetch_add(1);
  Job job;
  job.count = nblocks;
  job.ctx = &L;
  job.run = [](void* ctx, size_t i) {
    auto& L = *static_cast<Launch*>(ctx);
    if (L.stop.load(std::memory_order_relaxed)) return;
    const dim3 g = L.k->grid;
    const uint3 b{static_cast<unsigned>(i % g.x), static_cast<unsigned>(i / g.x % g.y),
                  static_cast<unsigned>(i / g.x / g.y)};
    block_run(this_worker(), L, b);
  };
  pool().run(job);
  guards_reprotect();
  if (L.fault_state.load() == 2) {
    if (detail) *detail = fault_report(L);
    return cudaErrorIllegalAddress;
  }
  if (L.err != cudaSuccess && detail) *detail = L.detail;
  return L.err;
}

void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& fn) {
  if (n == 0) return;
  struct Ctx {
    size_t n, chunks;
    const std::function<void(size_t, size_t)>* fn;
    OpFault* fault;  // the calling op's (engine.h): chunks on pool threads report there
  };
  const size_t workers = std::max(1u, std::thread::hardware_concurrency()) + 1;
  Ctx c{n, std::min(n, workers * 4), &fn, t_op_fault};
  if (t_pool_thread || (t_worker && t_worker->running) || c.chunks == 1) {
    fn(0, n);
    return;
  }
  Job job;
  job.count = c.chunks;
  job.ctx = &c;
  job.run = [](void* ctx, size_t i) {
    const auto& c = *static_cast<const Ctx*>(ctx);
    OpFault* const saved = t_op_fault;
    t_op_fault = c.fault;
    (*c.fn)(c.n * i / c.chunks, c.n * (i + 1) / c.chunks);
    t_op_fault = saved;
  };
  pool().run(job);
}

}  // namespace cuda_emu
