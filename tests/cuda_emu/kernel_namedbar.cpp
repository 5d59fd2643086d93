// CUDA execution engine (test-only): named barriers, `bar.sync id, count` and
// `bar.arrive id, count` (PTX ISA "Parallel Synchronization and Communication Instructions:
// bar, barrier"); kernels reach them through kernels/hopper.cuh (named_bar_sync,
// named_bar_arrive). FlashAttention-3's warpgroups take turns at the tensor cores with
// them.
//
// The model. A block has 16 barriers. bar.sync and bar.arrive are .aligned: the 32 lanes of
// a warp execute the same instruction (op, id, count, call site) and the warp arrives as a
// unit, adding 32 to the barrier's arrival count (the PTX ISA counts warps, not active
// threads). The first warp of a phase sets its thread count; the phase completes when that
// many threads have arrived: the warps waiting at bar.sync resume and the barrier is ready
// for the next phase. bar.arrive does not wait for the phase.
//
// Stricter than a GPU (each fails the launch naming the call site): id 0 (barrier 0 is
// __syncthreads's: the engine refuses a kernel sharing it); an id above 15; a count that is
// zero, not a multiple of 32 or more than the block's threads (rounded up to warps); lanes
// of one warp at different barrier instructions, a partial warp, or lanes exited; warps
// arriving at one phase with different counts (undefined on a GPU); a thread exiting while
// lanes of its warp gather at a barrier; and a block that ends with a phase partly arrived
// (arrivals a GPU would leave to a later CTA's kernel never being consumed mean the
// kernel's turn-taking is unbalanced). A named barrier is no ordering point for the
// racecheck: shared-memory accesses ordered only by one are reported as races.
#include "kernel_exec_internal.h"

#include <string>

namespace cuda_emu {

namespace {

constexpr unsigned FULL = 0xffffffffu;

std::string bar_at(unsigned id, const char* file, int line) {
  return "barrier " + std::to_string(id) + " (first arrival of the phase at " + where_str(file, line) + ")";
}

[[gnu::cold, gnu::noinline, noreturn]] void fail_here(Block& b, unsigned t, const std::string& why) {
  const Thread& th = b.threads[t];
  thread_fail(b, lane_str(b, t) + " at " + op_name(th.op) + " " + std::to_string(th.arg) + ", " +
                     std::to_string(th.value) + " at " + where_str(th.file, th.line) + ": " + why);
}

void named_barrier(const char* file, int line, int op, unsigned id, unsigned count) {
  Block& b = current_block(file, line, op_name(op));
  Thread& th = *cur_thread();
  const unsigned t = static_cast<unsigned>(&th - b.threads.data()), warp = t / 32, lane = t % 32;
  th.op = op;
  th.file = file;
  th.line = line;
  th.arg = static_cast<int>(id);
  th.value = count;
  b.nbar_used = true;
  if (id == 0)
    fail_here(b, t, "barrier 0 is the one __syncthreads uses; the engine refuses a kernel sharing it (use ids 1-15)");
  if (id > 15) fail_here(b, t, "barrier id " + std::to_string(id) + " (a block has barriers 0-15)");
  const unsigned threads = static_cast<unsigned>(b.warps.size()) * 32;
  if (count == 0 || count % 32 != 0 || count > threads)
    fail_here(b, t,
              "thread count " + std::to_string(count) + " (must be a non-zero multiple of 32, at most the block's " +
                  std::to_string(threads) + " threads in whole warps)");
  Warp& w = b.warps[warp];
  const std::string rule =
      " (bar.sync / bar.arrive are .aligned: all 32 lanes of a warp execute the same one, a GPU leaves anything else "
      "undefined)";
  if (w.present != FULL)
    fail_here(b, t,
              "warp " + std::to_string(warp) + " is a partial warp" + rule + "; make the block size a multiple of 32");
  if (w.exited) fail_here(b, t, "lanes of its warp already exited" + rule);
  if (w.nb_arrived == 0) {
    w.nb_op = op;
    w.nb_id = id;
    w.nb_count = count;
  } else if (w.nb_op != op || w.nb_id != id || w.nb_count != count) {
    fail_here(b, t,
              "other lanes of its warp wait at " + std::string(op_name(w.nb_op)) + " " + std::to_string(w.nb_id) +
                  ", " + std::to_string(w.nb_count) + rule);
  }
  w.nb_arrived |= 1u << lane;
  if (w.nb_arrived != FULL) {  // resumed when the warp has arrived (arrive) or the phase completes (sync)
    thread_park(b, th);
    return;
  }
  w.nb_arrived = 0;
  NamedBarrier& nb = b.nbars[id];
  if (nb.arrived == 0) {
    nb.count = count;
    nb.first = warp * 32;
    nb.file = file;
    nb.line = line;
  } else if (nb.count != count) {
    fail_here(b, t,
              "this phase of " + bar_at(id, nb.file, nb.line) + " counts " + std::to_string(nb.count) +
                  " threads; warps arriving at one phase must name the same count (a GPU's behaviour is undefined)");
  }
  nb.arrived += 32;
  for (unsigned i = 0; i < 32; ++i) {
    if (i == lane) continue;
    if (op == OP_NBAR_SYNC) nb.waiters.push_back(warp * 32 + i);
    else b.make_runnable(warp * 32 + i);
  }
  if (nb.arrived == nb.count) {  // the phase completes; the barrier is ready for the next one
    for (unsigned x : nb.waiters) b.make_runnable(x);
    nb.waiters.clear();
    nb.arrived = 0;
    nb.count = 0;
    return;
  }
  if (op == OP_NBAR_SYNC) {
    nb.waiters.push_back(t);
    thread_park(b, th);
  }
}

}  // namespace

void named_barrier_block_start(Block& b) {
  if (!b.nbar_used) return;
  for (NamedBarrier& nb : b.nbars) {
    nb.count = nb.arrived = 0;
    nb.waiters.clear();
  }
  for (Warp& w : b.warps) w.nb_arrived = 0;
  b.nbar_used = false;
}

std::string named_barrier_block_end(const Block& b) {
  for (unsigned id = 0; id < b.nbars.size(); ++id) {
    const NamedBarrier& nb = b.nbars[id];
    if (nb.arrived == 0) continue;
    return "the block exits with " + std::to_string(nb.arrived) + " of " + std::to_string(nb.count) +
           " threads arrived at " + bar_at(id, nb.file, nb.line) + " by " + lane_str(b, nb.first) +
           "'s warp and others: every bar.arrive / bar.sync phase must be completed by its count of threads (a "
           "kernel's turn-taking that leaves arrivals behind is unbalanced)";
  }
  return "";
}

std::string named_barrier_exit(const Block& b, unsigned t) {
  const Warp& w = b.warps[t / 32];
  if (w.nb_arrived == 0) return "";
  const unsigned other = (t / 32) * 32 + static_cast<unsigned>(__builtin_ctz(w.nb_arrived));
  const Thread& o = b.threads[other];
  return lane_str(b, t) + " exited while lanes of its warp wait for it at " + op_name(o.op) + " " +
         std::to_string(o.arg) + ", " + std::to_string(o.value) + " at " + where_str(o.file, o.line) +
         " (.aligned: all 32 lanes must execute it)";
}

std::string named_barrier_wait_str(const Block& b, const Thread& th) {
  const unsigned id = static_cast<unsigned>(th.arg);
  const std::string head = "barrier " + std::to_string(id) + ", count " + std::to_string(th.value);
  if (id > 15) return head;
  const NamedBarrier& nb = b.nbars[id];
  return head + ": " + std::to_string(nb.arrived) + " of " + std::to_string(nb.count) +
         " threads arrived in this phase";
}

// ----------------------------------------------------------------------------
// Device-side entry points (cuda_emu_device.h).
void named_barrier_sync(const char* file, int line, unsigned id, unsigned count) {
  named_barrier(file, line, OP_NBAR_SYNC, id, count);
}
void named_barrier_arrive(const char* file, int line, unsigned id, unsigned count) {
  named_barrier(file, line, OP_NBAR_ARRIVE, id, count);
}

}  // namespace cuda_emu
