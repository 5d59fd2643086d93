// CUDA execution engine (test-only): a trace of the device work a process issues, for
// tests that hold a model of that work (lib/device's PlanDevice) to what the CUDA code
// really does. Recorded at submission, on the issuing host thread, in issue order per
// list: kernel launches, cuBLASLt matmuls, memsets and memcpys, NCCL collectives, graph
// launches. Work recorded by a stream capture is traced when it is captured, not replayed.
// Calls the engine rejects, and no-ops (zero sizes), are not recorded.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cuda_emu {

struct TraceKernel {
  std::string name;  // the launch expression (KernelLaunch::name), e.g. "adamw_kernel<C, V>"
  dim3 grid, block;
  size_t dynamic_smem = 0;
  int device = 0;
};

// As cuBLASLt sees it: column-major D[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C.
struct TraceMatmul {
  int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  int a_type = 0, b_type = 0, c_type = 0, d_type = 0;  // cudaDataType_t
  uint32_t epilogue = 0;                               // cublasLtEpilogue_t
  float alpha = 0, beta = 0;                           // NaN under CUBLASLT_POINTER_MODE_DEVICE
  int batch = 1;
  int device = 0;
};

// A memset (kind = -1) or a memcpy (kind = its cudaMemcpyKind, cudaMemcpyDefault
// resolved); 1D calls have height 1.
struct TraceMemop {
  int kind = -1;
  size_t width = 0, height = 0;
  int device = 0;
  size_t bytes() const { return width * height; }
};

struct TraceCollective {
  std::string op;  // "ncclAllReduce", "ncclReduceScatter", ...
  size_t count = 0;
  int type = 0;  // ncclDataType_t
  int rank = 0, device = 0;
};

struct TraceGraphLaunch {
  size_t nodes = 0;  // the graph's recorded operations
  int device = 0;
};

struct Trace {
  std::vector<TraceKernel> kernels;
  std::vector<TraceMatmul> matmuls;
  std::vector<TraceMemop> memops;
  std::vector<TraceCollective> collectives;
  std::vector<TraceGraphLaunch> graph_launches;  // cudaGraphLaunch calls (their nodes were traced at capture)
};

/// Starts recording (clearing what an earlier trace left).
void trace_begin();
/// Stops recording and returns what was recorded since trace_begin().
Trace trace_take();

// The recording side (runtime.cpp, cublaslt.cpp, nccl.cpp). Each returns at once when
// no trace is on.
void trace_kernel(const char* name, dim3 grid, dim3 block, size_t smem, int device);
void trace_matmul(const TraceMatmul& m);
void trace_memop(int kind, size_t width, size_t height, int device);
void trace_collective(const char* op, size_t count, int type, int rank, int device);
void trace_graph_launch(size_t nodes, int device);

}  // namespace cuda_emu
