// CUDA execution engine: the process-wide trace of issued device work (cuda_emu_trace.h).
// One atomic flag keeps the cost of an untraced call at a relaxed load; recording takes
// a mutex, since launches come from every host thread (ranks, devices).
#include <cuda_emu_trace.h>

#include <atomic>
#include <mutex>
#include <utility>

namespace cuda_emu {

namespace {
std::atomic<bool> g_on{false};
std::mutex g_trace_mu;
Trace& g_trace() {
  static auto* t = new Trace();  // never destroyed: a late call at exit must not touch a dead vector
  return *t;
}
}  // namespace

void trace_begin() {
  std::lock_guard<std::mutex> lock(g_trace_mu);
  g_trace() = Trace{};
  g_on.store(true, std::memory_order_relaxed);
}

Trace trace_take() {
  std::lock_guard<std::mutex> lock(g_trace_mu);
  g_on.store(false, std::memory_order_relaxed);
  return std::exchange(g_trace(), Trace{});
}

void trace_kernel(const char* name, dim3 grid, dim3 block, size_t smem, int device) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (g_on.load(std::memory_order_relaxed)) g_trace().kernels.push_back(TraceKernel{name, grid, block, smem, device});
}

void trace_matmul(const TraceMatmul& m) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (g_on.load(std::memory_order_relaxed)) g_trace().matmuls.push_back(m);
}

void trace_memop(int kind, size_t width, size_t height, int device) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (g_on.load(std::memory_order_relaxed)) g_trace().memops.push_back(TraceMemop{kind, width, height, device});
}

void trace_collective(const char* op, size_t count, int type, int rank, int device) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (g_on.load(std::memory_order_relaxed))
    g_trace().collectives.push_back(TraceCollective{op, count, type, rank, device});
}

void trace_graph_launch(size_t nodes, int device) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (g_on.load(std::memory_order_relaxed)) g_trace().graph_launches.push_back(TraceGraphLaunch{nodes, device});
}

}  // namespace cuda_emu
