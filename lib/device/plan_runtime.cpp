// PlanRuntime: fake memory, the copies' and memsets' costs, the entry builders the per-op
// costs use (a cuBLASLt matmul's bytes and unit, memsets, memcpys) and the names of units
// and epilogues. The ops themselves, one per Device op, are PlanDevice's in cuda_costs.cpp.
#include "device/plan_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace dtrain::device {

namespace {
// Fake addresses start above the 47-bit user address space: a dereference by mistake
// faults at once. Allocations are 256-byte aligned, as cudaMallocAsync's, so alignment
// tests on the pointers (vector or scalar kernels, cuBLASLt's alignment promise) choose
// what they choose on a GPU.
constexpr uintptr_t FAKE_BASE = uintptr_t{1} << 48;
constexpr uintptr_t FAKE_ALIGN = 256;

const char* dtype_short(DType t) { return t == DType::F32 ? "f32" : t == DType::BF16 ? "bf16" : "f16"; }
}  // namespace

const char* plan_unit_name(PlanUnit u) {
  switch (u) {
    case PlanUnit::TENSOR_GEMM: return "tensor";
    case PlanUnit::TENSOR_ATTN_FWD: return "tensor attn fwd";
    case PlanUnit::TENSOR_ATTN_BWD: return "tensor attn bwd";
    case PlanUnit::CUDA_CORE: return "fp32 cores";
    case PlanUnit::MEMORY: return "memory";
    case PlanUnit::PCIE: return "pcie";
  }
  return "?";
}

const char* plan_epilogue_name(PlanEpilogue e) {
  switch (e) {
    case PlanEpilogue::DEFAULT: return "DEFAULT";
    case PlanEpilogue::BIAS: return "BIAS";
    case PlanEpilogue::GELU_AUX: return "GELU_AUX";
    case PlanEpilogue::GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case PlanEpilogue::DGELU: return "DGELU";
    case PlanEpilogue::BGRADB: return "BGRADB";
  }
  return "?";
}

PlanRuntime::PlanRuntime(Kind kind) : kind_(kind), next_(FAKE_BASE) {}

std::string PlanRuntime::name() const {
  return kind_ == Kind::CUDA ? "plan of a CUDA device (nothing executes)" : "plan host stand-in (nothing executes)";
}

std::vector<PlanEntry> PlanRuntime::take() { return std::exchange(entries_, {}); }

// CudaDevice::alloc: cudaMallocAsync, then a cudaMemsetAsync zeroing the bytes.
void* PlanRuntime::alloc(size_t bytes) {
  void* p = reinterpret_cast<void*>(next_);
  next_ += (bytes + FAKE_ALIGN - 1) / FAKE_ALIGN * FAKE_ALIGN + FAKE_ALIGN;  // distinct even for 0 bytes
  if (bytes) memset_op("alloc", bytes);
  return p;
}

// ----------------------------------------------------------------------------
// Memory (CudaDevice: cudaMemcpyAsync / cudaMemcpy2DAsync / cudaMemsetAsync, no-ops
// skipped).
void PlanRuntime::copy_h2d(void*, const void*, size_t bytes) {
  if (bytes) memcpy_op("copy_h2d", "cudaMemcpyAsync", PlanCopy::H2D, bytes, 1);
}
void PlanRuntime::copy_h2d_cast(void*, DType t, const float*, size_t n) {
  if (n) memcpy_op("copy_h2d", "cudaMemcpyAsync", PlanCopy::H2D, n * dtype_size(t), 1);
}
void PlanRuntime::copy_d2h(void* dst, const void*, size_t bytes) {
  if (!bytes) return;
  std::fill_n(static_cast<char*>(dst), bytes, char{0});
  memcpy_op("copy_d2h", "cudaMemcpyAsync", PlanCopy::D2H, bytes, 1);
}
void PlanRuntime::copy_2d(void*, size_t, const void*, size_t, size_t width, size_t rows) {
  if (rows && width) memcpy_op("copy_2d", "cudaMemcpy2DAsync", PlanCopy::D2D, width, rows);
}
void PlanRuntime::copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) memcpy_op("copy_d2d", "cudaMemcpyAsync", PlanCopy::D2D, bytes, 1);
}
void PlanRuntime::zero(void*, size_t bytes) {
  if (bytes) memset_op("zero", bytes);
}

// ----------------------------------------------------------------------------
// Entry builders.
void PlanRuntime::kernel(const char* op, const char* name, PlanUnit unit, double flops, double bytes,
                         const PlanLaunch* launch) {
  if (!recording_) return;
  PlanEntry e;
  if (launch) e.launch = *launch;
  e.op = op;
  e.kernel = name;
  e.kind = PlanKind::KERNEL;
  e.unit = unit;
  e.flops = flops;
  e.bytes = bytes;
  entries_.push_back(std::move(e));
}

// FLOPs 2 M N K (epilogue arithmetic is noise next to it). Bytes: A and B read, D
// written, C read when beta != 0, plus the epilogue's vectors and matrices: the bias
// read (BIAS), the pre-activation written (GELU_AUX) or read (DGELU), the bias gradient
// written (BGRADB).
void PlanRuntime::matmul(const char* op, bool trans_a, bool trans_b, int M, int N, int K, float alpha, float beta,
                         DType ab, DType c, PlanEpilogue epi) {
  if (!recording_) return;
  const double m = M, n = N, k = K, es_ab = static_cast<double>(dtype_size(ab)),
               es_c = static_cast<double>(dtype_size(c));
  double bytes = es_ab * (m * k + k * n) + es_c * m * n * (beta != 0.0f ? 2.0 : 1.0);
  if (epi == PlanEpilogue::BIAS || epi == PlanEpilogue::GELU_AUX_BIAS) bytes += es_c * n;
  if (epi == PlanEpilogue::GELU_AUX || epi == PlanEpilogue::GELU_AUX_BIAS || epi == PlanEpilogue::DGELU)
    bytes += es_c * m * n;
  if (epi == PlanEpilogue::BGRADB) bytes += es_c * m;  // per row of the row-major C: columns of cuBLASLt's D
  PlanEntry e;
  e.op = op;
  e.kernel = fmt::format("cublasLtMatmul {} {}->{}", plan_epilogue_name(epi), dtype_short(ab), dtype_short(c));
  e.kind = PlanKind::MATMUL;
  e.unit = ab == DType::F32 ? PlanUnit::CUDA_CORE : PlanUnit::TENSOR_GEMM;
  e.flops = 2.0 * m * n * k;
  e.bytes = bytes;
  e.matmul.m = N;  // cuBLASLt's A is our B and its B is our A
  e.matmul.n = M;
  e.matmul.k = K;
  e.matmul.transa = trans_b;
  e.matmul.transb = trans_a;
  e.matmul.ab = ab;
  e.matmul.c = c;
  e.matmul.epilogue = epi;
  e.matmul.alpha = alpha;
  e.matmul.beta = beta;
  entries_.push_back(std::move(e));
}

void PlanRuntime::memset_op(const char* op, size_t bytes) {
  if (!recording_) return;
  PlanEntry e;
  e.op = op;
  e.kernel = "cudaMemsetAsync";
  e.kind = PlanKind::MEMSET;
  e.unit = PlanUnit::MEMORY;
  e.bytes = static_cast<double>(bytes);
  e.width = bytes;
  e.height = 1;
  entries_.push_back(std::move(e));
}

// Device copies read and write every byte; host copies move each byte over the bus once.
void PlanRuntime::memcpy_op(const char* op, const char* api, PlanCopy kind, size_t width, size_t height) {
  if (!recording_) return;
  PlanEntry e;
  e.op = op;
  const char* dir = kind == PlanCopy::H2D ? "H2D" : kind == PlanCopy::D2H ? "D2H" : "D2D";
  e.kernel = fmt::format("{} {}", api, dir);
  e.kind = PlanKind::MEMCPY;
  e.unit = kind == PlanCopy::D2D ? PlanUnit::MEMORY : PlanUnit::PCIE;
  e.bytes = static_cast<double>(width) * static_cast<double>(height) * (kind == PlanCopy::D2D ? 2.0 : 1.0);
  e.copy = kind;
  e.width = width;
  e.height = height;
  entries_.push_back(std::move(e));
}

}  // namespace dtrain::device
