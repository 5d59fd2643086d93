// The plan device: a Device that executes nothing and, while recording, lists for every
// op call the work the CUDA device (cuda_device.cpp over kernels/) issues for the same
// arguments: each kernel launch, cuBLASLt matmul, memset and memcpy, with the FLOPs it
// performs, the bytes it moves and the unit it runs on (cuda_costs.cpp, one function per
// op). Memory is fake addresses, never dereferenced, so a model of any size fits;
// copy_d2h returns zeros. lib/plan turns a training step's list into a time budget.
// PlanRuntime (plan_runtime.h) is the runtime half with the entries; this class adds the ops.
#pragma once

#include "device/plan_runtime.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::device {

class PlanDevice final : public PlanRuntime {
 public:
  /// Kind::CUDA: the plan of a CUDA device. Kind::CPU: the same device claiming to be the
  /// host, as a stand-in for host models whose storage nobody reads (the ZeRO engine's
  /// fp32 source, whose weights only travel through copy_h2d and copy_h2d_cast).
  /// The tensor-core attention variant comes from $DTRAIN_ATTN_VARIANT (as the kernels read
  /// it; UsageError for a value they refuse).
  explicit PlanDevice(Kind kind = Kind::CUDA);

  /// The card's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin),
  /// which decides whether a cross-entropy row fits its one-pass kernel and whether the
  /// hopper attention forward fits the card; the H100's 227 KB unless set.
  void set_smem_optin(size_t bytes) { smem_optin_ = bytes; }
  /// The card's compute capability x 10 (the hopper forward runs on 9.0 only); 90 unless set.
  void set_compute_capability(int sm) { sm_ = sm; }
  /// The tensor-core attention variant priced: "legacy", "fa2" or "hopper". Legacy's kernels
  /// are modelled, and under "hopper" the sm_90a forward (kernels/attention_hopper.cu) where
  /// it runs; fa2's 128-row tiles are not: fa2, hopper's backward and its fall back are
  /// priced as legacy's kernels. UsageError for another value.
  void set_attention_variant(const std::string& variant);
  const std::string& attention_variant() const { return attn_variant_; }

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
                    const RopeFreq& rope, const int32_t* doc_start, DType t) override;
  void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                     const RopeFreq& rope, const int32_t* doc_start, DType t) override;
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

  void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
             int64_t step, bool decay, const float* scale, void* copy, DType copy_t) override;
  void adamw_multi(const AdamWTensor* tensors, size_t count, const AdamWConfig& cfg, float lr, int64_t step,
                   const float* scale, DType copy_t) override;
  void norm_sq_accumulate(double* acc, const float* g, size_t n) override;
  void norm_sq_accumulate_multi(double* acc, const float* const* g, const size_t* n, size_t count) override;
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
            int kv_stride, const RopeFreq& rope, DType t);
  void cross_entropy(const char* op, bool losses, bool mean, bool dlogits, int N, int V, DType t);

  // The RoPE tables the CUDA device would hold by now (recorded or not).
  struct RopeKey {
    int T, HD;
    RopeFreq rope;
  };
  std::vector<RopeKey> rope_keys_;
  size_t smem_optin_ = 227 * 1024;
  int sm_ = 90;
  std::string attn_variant_;
};

}  // namespace dtrain::device
