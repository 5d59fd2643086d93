// INTERNAL interface of the CUDA execution engine (test-only): what the runtime offers
// the cuBLASLt and NCCL subsets and the kernel executor. Nothing here is CUDA API.
#pragma once

#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace cuda_emu {

// The host's page size (guard pages, stacks, the registry's rounding).
inline size_t page_size() {
  static const size_t ps = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return ps;
}

// ----------------------------------------------------------------------------
// Memory registry (memory.cpp).
struct Alloc {
  char* base = nullptr;  // first byte the user owns
  size_t size = 0;       // bytes the user asked for
  int device = -1;       // owning device; -1 for pinned host memory
  bool pinned_host = false;
};
// The live allocation that contains [p, p + bytes) (bytes 0: p may equal its end), or
// nothing (host memory, freed memory, a range crossing an allocation's end).
std::optional<Alloc> alloc_find(const void* p, size_t bytes = 1);

// Guard-page faults, for the SIGSEGV handler (async-signal context: no allocation).
struct FaultInfo {
  const char* base = nullptr;  // the allocation whose guard was hit
  size_t size = 0;
  long long offset = 0;  // fault address - base (negative: before it)
  bool freed = false;    // the allocation was already freed (use after free)
};
// When addr lies in the guard zone of a live or quarantined allocation: makes that guard
// page accessible (so the faulting instruction can complete), remembers it for
// guards_reprotect(), fills *out and returns true. Otherwise false.
bool fault_resolve(const void* addr, FaultInfo* out);
// Restores every guard page that fault_resolve opened (after the launch ends).
void guards_reprotect();

// Memory faults in stream-ordered work outside kernels (copies, NCCL collectives, GEMMs):
// the device executor arms one per op (and parallel_for hands it to its chunks). A hit on
// an allocation's guard zone or on freed memory is recorded here (the access then
// completes on the opened page) and the op's device gets a sticky error naming the op,
// where the process would otherwise die of SIGSEGV (kernel_faults.cpp).
struct OpFault {
  std::atomic<int> state{0};  // 0 none, 1 being written, 2 written
  const void* addr = nullptr;
  FaultInfo info;
  uintptr_t pc = 0;
  int access = 0;  // 0 unknown, 1 read, 2 write
};
extern thread_local constinit OpFault* t_op_fault;
// "read address A: offset O of a freed N-byte allocation (use after free); faulting code: ..."
std::string op_fault_report(const OpFault& f);

// ----------------------------------------------------------------------------
// Devices, streams and stream-ordered work (runtime.cpp).
int device_current();               // cudaGetDevice of this host thread
int device_count();                 // devices visible to this process
int stream_device(cudaStream_t s);  // device of s (legacy/null stream: the current device); -1 if invalid
bool stream_valid(cudaStream_t s);
// Adds kernel time a device's executor spent (nvml.cpp: NVML's utilisation).
void device_busy_add(int device, int64_t ns);
// The machine's devices before CUDA_VISIBLE_DEVICES, and the CUDA index of physical
// device p in this process (-1: not visible). NVML numbers the physical devices.
int device_physical_count();
int device_of_physical(int physical);

// Enqueues fn on stream s after everything CUDA's ordering rules put before it; fn runs
// on the device's executor thread. `eager`: the op (and all it depends on) runs as soon
// as its dependencies allow, even when nobody waits for it (NCCL collectives: a real GPU
// runs every queued op eventually, and a peer may be waiting for this one). Returns
// cudaErrorInvalidResourceHandle for a bad stream, or the device's sticky error.
cudaError_t enqueue(cudaStream_t s, const char* what, std::function<void()> fn, bool eager = false);
// As enqueue, for work whose every run must be set up anew when it is issued (an NCCL
// collective takes its sequence number): make() runs now on a stream that does not
// capture, and at every cudaGraphLaunch (in node order) when the work was captured.
cudaError_t enqueue_replayable(cudaStream_t s, const char* what, std::function<std::function<void()>()> make,
                               bool eager = false);

// Records an error found while executing device work: every later API call on the
// device returns it (as a real CUDA context's sticky errors), and `detail` is printed
// to stderr once and kept for last_error_detail().
void sticky_error_set(int device, cudaError_t err, const std::string& detail);

// ----------------------------------------------------------------------------
// Kernel execution (kernel_exec.cpp).
struct KernelLaunch {
  std::string name;       // the launch expression, e.g. "attn_fwd_kernel<Ty, DPL>"
  const char* file = "";  // launch site
  int line = 0;
  const void* func = nullptr;  // the kernel's address (for addr2line in reports)
  dim3 grid, block;
  size_t dynamic_smem = 0;
  std::function<void()> body;  // calls the kernel with the launch's copied arguments
  int device = 0;
};
// Runs every thread of every block with GPU semantics (blocks spread over the worker
// pool, each block's threads as cooperative fibers). Returns cudaSuccess, or the error a
// GPU would report (or that the engine reports where a GPU is undefined) with *detail
// naming the kernel, the launch site and the offending source line / thread.
cudaError_t kernel_run(const KernelLaunch& k, std::string* detail);

// How kernels run; from the environment at first use, changeable by tests.
// CUDA_EMU_RACECHECK=0 turns the shared-memory racecheck off (it is on by default);
// CUDA_EMU_RACECHECK=first checks only each launch configuration's first launch in the
// process (kernel, launch site, grid, block, dynamic shared memory): for the suites that
// launch the same kernels over and over (the trainer's steps), whose configurations the
// first launch covers, at a fraction of the racecheck's cost.
// CUDA_EMU_WARP_ORDER picks the block threads' order: unset, CUDA_EMU_SEED's shuffled
// order (0 = plain); `ahead`, the lowest warp runs as far as it can before any other,
// then the next; `behind`, the same from the highest warp down.
enum class Schedule : int { SEEDED = 0, WARP_AHEAD = 1, WARP_BEHIND = 2 };
struct ExecMode {
  bool racecheck = true;
  Schedule schedule = Schedule::SEEDED;
  bool racecheck_first = false;  // with racecheck: only each configuration's first launch
};
ExecMode exec_mode();
void exec_mode_set(ExecMode m);

// Runs fn over [0, n) split in contiguous chunks on the worker pool (cuBLASLt GEMMs,
// NCCL reductions); returns when every chunk is done. fn must not throw.
void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& fn);

}  // namespace cuda_emu
