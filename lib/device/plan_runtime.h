// The plan device's runtime half (plan_device.h's PlanDevice adds the ops): the entries a
// recording lists (PlanEntry: a kernel launch, cuBLASLt matmul, memset or memcpy with its
// FLOPs, bytes and unit), fake memory (addresses never dereferenced, so a model of any
// size fits; copy_d2h returns zeros) and the copies' and memsets' entries. Streams,
// events and graphs do nothing.
#pragma once

#include "device/device.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::device {

/// Where an entry's time goes; each has its own peak and efficiency in the budget.
enum class PlanUnit {
  TENSOR_GEMM,      ///< cuBLASLt bf16/fp16 matmul on tensor cores
  TENSOR_ATTN_FWD,  ///< flash attention forward on tensor cores (mma.sync)
  TENSOR_ATTN_BWD,  ///< flash attention backward on tensor cores (mma.sync)
  CUDA_CORE,        ///< fp32 arithmetic on CUDA cores (fp32 cuBLASLt included: no TF32)
  MEMORY,           ///< memsets and device copies: bytes only
  PCIE,             ///< host <-> device copies
};
const char* plan_unit_name(PlanUnit u);

enum class PlanKind { KERNEL, MATMUL, MEMSET, MEMCPY };

/// The cuBLASLt epilogues kernels/gemm.cu uses.
enum class PlanEpilogue { DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADB };
const char* plan_epilogue_name(PlanEpilogue e);

/// A matmul as cuBLASLt sees it: column-major D[m,n] = alpha op(A) op(B) + beta C, the
/// row-major call's operands swapped (kernels/gemm.cu's problem_for).
struct PlanMatmul {
  int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  DType ab = DType::F32;  ///< A and B
  DType c = DType::F32;   ///< C and D
  PlanEpilogue epilogue = PlanEpilogue::DEFAULT;
  float alpha = 1.0f, beta = 0.0f;
  int batch = 1;
};

enum class PlanCopy { H2D, D2H, D2D };

/// The launch geometry of a kernel whose occupancy the budget models (the tensor-core
/// attention's kernels, kernels/attention_mma.cu): its name in ptxas's report, the padded head
/// dimension (a template argument), grid and block, the dynamic shared memory of its two-stage
/// and one-stage variants (the launcher picks by the card's opt-in limit), and the bytes its
/// blocks load more than once (K/V or Q/dO tiles re-read per tile pair), which hit L2 or HBM.
struct PlanLaunch {
  std::string kernel;  ///< "attn_fwd_mma_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"
  int hdp = 0;
  int64_t blocks = 0;
  int threads = 0;
  size_t smem_two_stages = 0, smem_one_stage = 0;
  bool one_stage_built = false;  ///< a one-stage variant exists (two stages exceed 99 KB somewhere)
  double reread_bytes = 0;
  int registers = 0;  ///< per thread; 0: the budget takes ptxas's count from its table (set: what-if, tests)
};

/// One launch (kernel, matmul, memset or memcpy) of one op call.
struct PlanEntry {
  std::string op;  ///< the Device op that issued it, e.g. "linear_backward"
  /// KERNEL: the launch expression as kernels/ writes it (the text the CPU execution
  /// engine records, e.g. "adamw_kernel<C, V>"); MATMUL: "cublasLtMatmul <epilogue>
  /// <A/B>-><C/D>"; MEMSET: "cudaMemsetAsync"; MEMCPY: "cudaMemcpyAsync <kind>" or
  /// "cudaMemcpy2DAsync D2D".
  std::string kernel;
  PlanKind kind = PlanKind::KERNEL;
  PlanUnit unit = PlanUnit::MEMORY;
  int64_t launches = 1;
  double flops = 0;               ///< arithmetic performed (a GEMM: 2 m n k)
  double bytes = 0;               ///< global memory (PCIE: bus) reads + writes, each array once
  PlanMatmul matmul;              ///< MATMUL only
  PlanCopy copy = PlanCopy::D2D;  ///< MEMCPY only
  size_t width = 0, height = 0;   ///< MEMSET / MEMCPY: width x height bytes (1D: height 1)
  PlanLaunch launch;              ///< KERNEL on TENSOR_ATTN_*: its geometry (empty kernel otherwise)
};

class PlanRuntime : public Device {
 public:
  /// `kind`: the device it plans for (PlanDevice's constructor).
  explicit PlanRuntime(Kind kind);

  /// Starts (true) or pauses (false) recording; paused, ops record nothing.
  void record(bool on) { recording_ = on; }
  /// The entries recorded so far, in issue order; clears them.
  std::vector<PlanEntry> take();

  Kind kind() const override { return kind_; }
  std::string name() const override;
  void* stream() const override { return nullptr; }
  void* use_stream(void*) override { return nullptr; }
  std::unique_ptr<Event> event_create() override { return std::make_unique<Event>(); }
  void event_record(Event&, void*) override {}
  void stream_wait(void*, Event&) override {}

  void* alloc(size_t bytes) override;
  void free(void*) override {}
  // A cost model: what it hands out is not counted as memory.
  MemoryStats memory_stats() override { return {}; }
  void memory_peak_reset() override {}
  void copy_h2d(void* dst, const void* src, size_t bytes) override;
  void copy_d2h(void* dst, const void* src, size_t bytes) override;
  /// Reads nothing at src (a host stand-in's storage is fake): the H2D copy of n elements of t.
  void copy_h2d_cast(void* dst, DType t, const float* src, size_t n) override;
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override;
  void copy_d2d(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void synchronize() override {}

 protected:
  // Entry builders (plan_runtime.cpp); `op` names the Device op. Each records only while
  // recording_.
  void kernel(const char* op, const char* name, PlanUnit unit, double flops, double bytes,
              const PlanLaunch* launch = nullptr);
  // The row-major C[M,N] = alpha op(A) op(B) + beta C of kernels/gemm.cu, with its epilogue.
  void matmul(const char* op, bool trans_a, bool trans_b, int M, int N, int K, float alpha, float beta, DType ab,
              DType c, PlanEpilogue epi);
  void memset_op(const char* op, size_t bytes);
  void memcpy_op(const char* op, const char* api, PlanCopy kind, size_t width, size_t height);

  Kind kind_;
  bool recording_ = false;
  uintptr_t next_ = 0;  // the next fake address
  std::vector<PlanEntry> entries_;
};

}  // namespace dtrain::device
