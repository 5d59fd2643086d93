// The plan device: a Device that executes nothing and, while recording, lists for every
// op call the work the CUDA device (cuda_device.cpp over kernels/) issues for the same
// arguments: each kernel launch, cuBLASLt matmul, memset and memcpy, with the FLOPs it
// performs, the bytes it moves and the unit it runs on (cuda_costs.cpp, one function per
// op). Memory is fake addresses, never dereferenced, so a model of any size fits;
// copy_d2h returns zeros. lib/bench turns a training step's list into a time budget.
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

class PlanDevice final : public Device {
 public:
  /// Kind::CUDA: the plan of a CUDA device. Kind::CPU: the same device claiming to be the
  /// host, as a stand-in for host models whose storage nobody reads (the ZeRO engine's
  /// fp32 source, whose weights only travel through copy_h2d).
  explicit PlanDevice(Kind kind = Kind::CUDA);

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
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override;
  void copy_d2d(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void synchronize() override {}

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, const void* B, float beta,
            void* C, DType ab_t, DType c_t) override;
  void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
               int ldb, float beta, void* C, int ldc, DType ab_t, DType c_t) override;
  void linear_forward(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC, int ld_out,
                      DType t) override;
  void linear_gelu_forward(void* out, void* pre, const void* inp, const void* w, const void* bias, int N, int IC,
                           int OC, DType t) override;
  void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* w,
                       int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType t) override;
  void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp, const void* w,
                             const void* pre, int N, int IC, int OC, DType t) override;

  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* bias, int N,
                         int C, float eps, DType t) override;
  void residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b,
                                  const void* w, const void* bias, int N, int C, float eps, DType t) override;
  void layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                          const float* mean, const float* rstd, int N, int C, DType t) override;
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                       DType t) override;
  void residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* w,
                                int N, int C, float eps, DType t) override;
  void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                        int N, int C, DType t) override;

  void gelu_forward(void* out, const void* inp, size_t n, DType t) override;
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) override;
  void swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                      DType t) override;
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                       size_t cols, size_t ld, DType t) override;
  void dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType t) override;
  void dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType t) override;

  void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                    const ops::RopeFreq& rope, const int32_t* doc_start, DType t) override;
  void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                     const ops::RopeFreq& rope, const int32_t* doc_start, DType t) override;
  size_t attention_saved_floats(int B, int T, int NH) const override;
  void attention_forward(void* out, float* saved, const void* q, const void* k, const void* v, int B, int T, int NH,
                         int NKV, int HD, int q_stride, int kv_stride, int window, const int32_t* doc_start,
                         DType t) override;
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* saved,
                          const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                          int q_stride, int kv_stride, int window, const int32_t* doc_start, DType t) override;

  void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                         const int32_t* doc_start, DType t) override;
  void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C, int V,
                          const int32_t* doc_start, DType t) override;
  void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N, int V,
                             int ld, DType t) override;
  void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                              float factor, const float* count, DType t) override;
  void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                      const int32_t* targets, int N, int V, int ld, float factor, const float* count,
                                      DType t) override;

  void adamw(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg, float lr,
             int64_t step, bool decay, const float* scale, void* copy, DType copy_t) override;
  void adamw_multi(const ops::AdamWTensor* tensors, size_t count, const ops::AdamWConfig& cfg, float lr, int64_t step,
                   const float* scale, DType copy_t) override;
  void norm_sq_accumulate(double* acc, const float* g, size_t n) override;
  void norm_sq_pack(float* red, const double* sq) override;
  void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) override;
  void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) override;
  void add(float* dst, const float* src, size_t n) override;
  void scale(float* p, size_t n, float s) override;
  // Top-k has no CUDA kernel to cost: the plan refuses it (UsageError).
  void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) override;
  void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) override;
  void orthogonalize(float* a, size_t rows, size_t cols) override;
  void cast(void* dst, DType dt, const void* src, DType st, size_t n) override;
  void round_to(float* p, size_t n, DType t) override;

 private:
  // Entry builders (plan_device.cpp); `op` names the Device op. Each records only while
  // recording_.
  void kernel(const char* op, const char* name, PlanUnit unit, double flops, double bytes,
              const PlanLaunch* launch = nullptr);
  // The row-major C[M,N] = alpha op(A) op(B) + beta C of kernels/gemm.cu, with its epilogue.
  void matmul(const char* op, bool trans_a, bool trans_b, int M, int N, int K, float alpha, float beta, DType ab,
              DType c, PlanEpilogue epi);
  void memset_op(const char* op, size_t bytes);
  void memcpy_op(const char* op, const char* api, PlanCopy kind, size_t width, size_t height);

  // Launch sequences shared by several ops (cuda_costs.cpp).
  void linear(const char* op, const void* bias, int N, int IC, int OC, DType t);
  void weight_grads(const char* op, bool dw, bool db, int N, int IC, int OC, DType t);
  void pointwise(const char* op, bool acc, const std::vector<const void*>& ptrs, int nin, int nout, size_t n, DType t,
                 double flops_per_element, bool packs_fit = true);
  void column_sums(const char* op, int mode, bool dw, bool db, int N, int C, DType t);
  void norm_forward(const char* op, bool layer, bool fused, const void* bias, int N, int C, DType t);
  void norm_backward(const char* op, bool layer, const void* dinp, const void* dout, const void* inp, const void* w,
                     bool dw, bool db, int N, int C, DType t);
  void rope(const char* op, const void* q, const void* k, int B, int T, int NH, int NKV, int HD, int q_stride,
            int kv_stride, const ops::RopeFreq& rope, DType t);
  void cross_entropy(const char* op, bool losses, bool mean, bool dlogits, int N, int V, DType t);

  Kind kind_;
  bool recording_ = false;
  // The RoPE tables the CUDA device would hold by now (recorded or not).
  struct RopeKey {
    int T, HD;
    ops::RopeFreq rope;
  };
  std::vector<RopeKey> rope_keys_;
  uintptr_t next_ = 0;  // the next fake address
  std::vector<PlanEntry> entries_;
};

}  // namespace dtrain::device
