// The CPU device: every op is the lib/ops implementation on host memory, fp32 only, fused
// ops included (residual + norm and linear + GELU are single lib/ops passes). The
// cross-entropy forward keeps each row's logsumexp for the backward of the same logits
// (llm.c's fused classifier, split at the API). Each op is timed into its class for
// bench_cpu_step's breakdown when ops::op_stats is on. The memory, copies and the rest of
// the runtime are CpuRuntime's (cpu_runtime.h), which this class derives from.
#include "device/cpu_runtime.h"

#include "core/check.h"
#include "core/dropout_mask.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/compress.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/op_stats.h"
#include "ops/optim.h"
#include "ops/parallel.h"
#include "ops/rope.h"
#include "ops/step_scale.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dtrain::device {

namespace {

float* F(void* p) { return static_cast<float*>(p); }
const float* F(const void* p) { return static_cast<const float*>(p); }

// Zeroes `width` floats of each of `rows` rows `stride` apart (attention's dq, dk, dv may be
// column blocks of GPT-2's fused qkv gradient rows), across the ops pool.
void zero_rows(float* p, size_t rows, int width, int stride) {
  const size_t w = static_cast<size_t>(width), st = static_cast<size_t>(stride);
  ops::parallel_for(rows, rows * w, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) std::fill(p + r * st, p + r * st + w, 0.0f);
  });
}

// The logits whose per-row logsumexp t_ce_lse holds, per calling thread (the device is
// one object shared by every rank thread of a process); a write into that buffer through
// the device (forget) or a backward drops it, and the backward then recomputes.
struct CeKey {
  const void* logits = nullptr;
  int N = 0, V = 0, ld = 0;
};
thread_local CeKey t_ce;
thread_local std::vector<float> t_ce_lse;

/// The ops: each the lib/ops function on host memory, timed into its op class.
class CpuDevice final : public CpuRuntime {
 public:
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, const void* B, float beta, void* C,
            DType ab_t, DType c_t) override;
  void gemm_ld(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda, const void* B, int ldb,
               float beta, void* C, int ldc, DType ab_t, DType c_t) override;
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
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* /*out*/, const float* saved,
                          const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                          int q_stride, int kv_stride, int window, const int32_t* doc_start, DType t) override;

  void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                         const int32_t* doc_start, DType t) override;
  void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C,
                          int /*V*/, const int32_t* doc_start, DType t) override;
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
  void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) override;
  void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) override;
  void add(float* dst, const float* src, size_t n) override;
  void scale(float* p, size_t n, float s) override;
  void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) override;
  void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) override;
  void orthogonalize(float* a, size_t rows, size_t cols) override;
  void cast(void* dst, DType dt, const void* src, DType st, size_t n) override;
  void round_to(float* p, size_t n, DType t) override;

 private:
  static void f32(DType t) {
    DT_ENFORCE(t == DType::F32, UsageError,
               "the CPU device computes in fp32 (got {}): its mixed-precision compute copy is fp32 values "
               "rounded to bf16/fp16",
               dtype_name(t));
  }
};

}  // namespace

void CpuRuntime::forget(const void* p) {
  CeKey& ce = t_ce;
  if (!ce.logits || !p) return;
  const char* lo = static_cast<const char*>(ce.logits);
  const char* c = static_cast<const char*>(p);
  if (c >= lo && c < lo + static_cast<size_t>(ce.N) * ce.ld * sizeof(float)) ce.logits = nullptr;
}

void CpuDevice::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, const void* B, float beta,
                     void* C, DType ab_t, DType c_t) {
  ops::OpScope scope(ops::OpClass::LINEAR);
  f32(ab_t);
  f32(c_t);
  forget(C);
  ops::gemm(ta, tb, M, N, K, alpha, F(A), F(B), beta, F(C));
}

void CpuDevice::gemm_ld(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
                        int ldb, float beta, void* C, int ldc, DType ab_t, DType c_t) {
  ops::OpScope scope(ops::OpClass::LINEAR);
  f32(ab_t);
  f32(c_t);
  forget(C);
  ops::gemm_strided(ta, tb, M, N, K, alpha, F(A), lda, F(B), ldb, beta, F(C), ldc);
}

void CpuDevice::linear_forward(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC,
                               int ld_out, DType t) {
  ops::OpScope scope(ops::OpClass::LINEAR);
  f32(t);
  forget(out);
  ops::linear_forward(F(out), F(inp), F(w), F(bias), N, IC, OC, ld_out);
}

void CpuDevice::linear_gelu_forward(void* out, void* pre, const void* inp, const void* w, const void* bias, int N,
                                    int IC, int OC, DType t) {
  ops::OpScope scope(ops::OpClass::LINEAR);
  f32(t);
  ops::linear_gelu_forward(F(out), F(pre), F(inp), F(w), F(bias), N, IC, OC);
}

void CpuDevice::linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                                const void* w, int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType t) {
  ops::OpScope scope(ops::OpClass::LINEAR);
  f32(t);
  ops::linear_backward(F(dinp), dweight, dbias, F(dout), F(inp), F(w), N, IC, OC, ld_dout, accumulate_dinp);
}

void CpuDevice::linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp,
                                      const void* w, const void* pre, int N, int IC, int OC, DType t) {
  ops::OpScope scope(ops::OpClass::LINEAR);
  f32(t);
  ops::linear_dgelu_backward(F(dpre), dweight, dbias, F(dout), F(inp), F(w), F(pre), N, IC, OC);
}

void CpuDevice::layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* bias,
                                  int N, int C, float eps, DType t) {
  ops::OpScope scope(ops::OpClass::NORM);
  f32(t);
  ops::layernorm_forward(F(out), mean, rstd, F(inp), F(w), F(bias), N, C, eps);
}

void CpuDevice::residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a,
                                           const void* b, const void* w, const void* bias, int N, int C, float eps,
                                           DType t) {
  ops::OpScope scope(ops::OpClass::NORM);
  f32(t);
  ops::residual_layernorm_forward(F(residual), F(out), mean, rstd, F(a), F(b), F(w), F(bias), N, C, eps);
}

void CpuDevice::layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                                   const void* w, const float* mean, const float* rstd, int N, int C, DType t) {
  ops::OpScope scope(ops::OpClass::NORM);
  f32(t);
  ops::layernorm_backward(F(dinp), dw, dbias, F(dout), F(inp), F(w), mean, rstd, N, C);
}

void CpuDevice::rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                                DType t) {
  ops::OpScope scope(ops::OpClass::NORM);
  f32(t);
  ops::rmsnorm_forward(F(out), rstd, F(inp), F(w), N, C, eps);
}

void CpuDevice::residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b,
                                         const void* w, int N, int C, float eps, DType t) {
  ops::OpScope scope(ops::OpClass::NORM);
  f32(t);
  ops::residual_rmsnorm_forward(F(residual), F(out), rstd, F(a), F(b), F(w), N, C, eps);
}

void CpuDevice::rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w,
                                 const float* rstd, int N, int C, DType t) {
  ops::OpScope scope(ops::OpClass::NORM);
  f32(t);
  ops::rmsnorm_backward(F(dinp), dw, F(dout), F(inp), F(w), rstd, N, C);
}

void CpuDevice::gelu_forward(void* out, const void* inp, size_t n, DType t) {
  ops::OpScope scope(ops::OpClass::ACTIVATION);
  f32(t);
  ops::gelu_forward(F(out), F(inp), n);
}

void CpuDevice::gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) {
  ops::OpScope scope(ops::OpClass::ACTIVATION);
  f32(t);
  ops::gelu_backward(F(dinp), F(inp), F(dout), n);
}

void CpuDevice::swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                               DType t) {
  ops::OpScope scope(ops::OpClass::ACTIVATION);
  f32(t);
  ops::swiglu_forward(F(out), F(gate), F(up), rows, cols, ld);
}

void CpuDevice::swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                                size_t cols, size_t ld, DType t) {
  ops::OpScope scope(ops::OpClass::ACTIVATION);
  f32(t);
  ops::swiglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), rows, cols, ld);
}

void CpuDevice::dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType t) {
  ops::OpScope scope(ops::OpClass::ACTIVATION);
  f32(t);
  const float inv = 1.0f / (1.0f - p);
  float* o = F(out);
  const float* x = F(inp);
  // The mask is a pure function of (seed, element): any split gives the same output.
  ops::parallel_for(n, n * 8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) o[i] = dropout_keep(seed, i, p) ? x[i] * inv : 0.0f;
  });
}

void CpuDevice::dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType t) {
  ops::OpScope scope(ops::OpClass::ACTIVATION);
  f32(t);
  const float inv = 1.0f / (1.0f - p);
  float* d = F(dinp);
  const float* g = F(dout);
  ops::parallel_for(n, n * 8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      if (dropout_keep(seed, i, p)) d[i] += g[i] * inv;
  });
}

void CpuDevice::rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                             const RopeFreq& rope, const int32_t* doc_start, DType t) {
  ops::OpScope scope(ops::OpClass::ROPE);
  f32(t);
  ops::rope_forward(F(q), F(k), B, T, NH, NKV, HD, rope, doc_start, q_stride, kv_stride);
}

void CpuDevice::rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                              const RopeFreq& rope, const int32_t* doc_start, DType t) {
  ops::OpScope scope(ops::OpClass::ROPE);
  f32(t);
  ops::rope_backward(F(dq), F(dk), B, T, NH, NKV, HD, rope, doc_start, q_stride, kv_stride);
}

size_t CpuDevice::attention_saved_floats(int B, int T, int NH) const { return static_cast<size_t>(B) * NH * T * T; }

void CpuDevice::attention_forward(void* out, float* saved, const void* q, const void* k, const void* v, int B, int T,
                                  int NH, int NKV, int HD, int q_stride, int kv_stride, int window,
                                  const int32_t* doc_start, DType t) {
  ops::OpScope scope(ops::OpClass::ATTENTION);
  f32(t);
  // q, k and v are read in place (strided column slices of a fused qkv): no copies.
  ops::attention_forward(F(out), saved, F(q), F(k), F(v), B, T, NH, NKV, HD, q_stride, kv_stride, window, doc_start);
}

void CpuDevice::attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* /*out*/,
                                   const float* saved, const void* q, const void* k, const void* v, int B, int T,
                                   int NH, int NKV, int HD, int q_stride, int kv_stride, int window,
                                   const int32_t* doc_start, DType t) {
  ops::OpScope scope(ops::OpClass::ATTENTION);
  f32(t);
  // The device writes dq/dk/dv; ops::attention_backward accumulates, so zero them first.
  const size_t N = static_cast<size_t>(B) * T;
  zero_rows(F(dq), N, NH * HD, q_stride);
  zero_rows(F(dk), N, NKV * HD, kv_stride);
  zero_rows(F(dv), N, NKV * HD, kv_stride);
  ops::attention_backward(F(dq), F(dk), F(dv), F(dout), saved, F(q), F(k), F(v), B, T, NH, NKV, HD, q_stride, kv_stride,
                          window, doc_start);
}

void CpuDevice::embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                                  int C, int V, const int32_t* doc_start, DType t) {
  ops::OpScope scope(ops::OpClass::EMBEDDING);
  f32(t);
  ops::embedding_forward(F(out), tokens, F(wte), F(wpe), B, T, C, V, doc_start);
}

void CpuDevice::embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                                   int C, int /*V*/, const int32_t* doc_start, DType t) {
  ops::OpScope scope(ops::OpClass::EMBEDDING);
  f32(t);
  ops::embedding_backward(dwte, dwpe, F(dout), tokens, B, T, C, doc_start);
}

void CpuDevice::cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N,
                                      int V, int ld, DType t) {
  ops::OpScope scope(ops::OpClass::CROSS_ENTROPY);
  f32(t);
  t_ce.logits = nullptr;
  t_ce_lse.resize(static_cast<size_t>(N));
  const float m = ops::cross_entropy_forward(losses, F(logits), targets, N, V, ld, ops::IGNORE_INDEX, t_ce_lse.data());
  t_ce = CeKey{logits, N, V, ld};
  if (mean) *mean = m;
}

void CpuDevice::cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                                       float factor, const float* count, DType t) {
  ops::OpScope scope(ops::OpClass::CROSS_ENTROPY);
  const float scale = ops::ce_backward_scale(factor, *count);
  f32(t);
  const bool cached = t_ce.logits == logits && t_ce.N == N && t_ce.V == V && t_ce.ld == ld;
  t_ce.logits = nullptr;  // the backward overwrites the logits when dlogits aliases them
  ops::cross_entropy_backward(F(dlogits), F(logits), targets, N, V, ld, scale, ops::IGNORE_INDEX,
                              cached ? t_ce_lse.data() : nullptr);
}

void CpuDevice::cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                               const int32_t* targets, int N, int V, int ld, float factor,
                                               const float* count, DType t) {
  cross_entropy_forward(losses, mean, logits, targets, N, V, ld, t);
  cross_entropy_backward(dlogits, logits, targets, N, V, ld, factor, count, t);
}

void CpuDevice::adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                      int64_t step, bool decay, const float* scale, void* copy, DType copy_t) {
  ops::OpScope scope(ops::OpClass::OPTIMIZER);
  if (scale[1] != 0.0f) return;  // a skipped step
  const float grad_scale = scale[0];
  if (copy == nullptr || copy_t == DType::F32) {
    ops::adamw_step(param, grad, m, v, n, cfg, lr, step, decay, grad_scale);
    if (copy != nullptr) CpuRuntime::copy(copy, param, n * sizeof(float));
    return;
  }
  ops::adamw_step_copy(param, grad, m, v, n, cfg, lr, step, decay, grad_scale, static_cast<uint16_t*>(copy), copy_t);
}

void CpuDevice::adamw_multi(const AdamWTensor* tensors, size_t count, const AdamWConfig& cfg, float lr, int64_t step,
                            const float* scale, DType copy_t) {
  for (size_t k = 0; k < count; ++k) {
    const AdamWTensor& x = tensors[k];
    adamw(x.param, x.grad, x.m, x.v, x.n, cfg, lr, step, x.decay, scale, x.copy, copy_t);
  }
}

void CpuDevice::norm_sq_accumulate(double* acc, const float* g, size_t n) {
  ops::OpScope scope(ops::OpClass::OPTIMIZER);
  *acc += ops::grad_norm_sq(g, n);
}

void CpuDevice::norm_sq_accumulate_multi(double* acc, const float* const* g, const size_t* n, size_t count) {
  for (size_t k = 0; k < count; ++k) norm_sq_accumulate(acc, g[k], n[k]);
}

void CpuDevice::norm_sq_pack(float* red, const double* sq) { ops::norm_sq_pack(red, *sq); }

void CpuDevice::loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) {
  *sum = ops::step_loss_sum(means, counts, n);
  *sum_f32 = static_cast<float>(*sum);
}

void CpuDevice::step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) {
  ops::OpScope scope(ops::OpClass::OPTIMIZER);
  *sq = red != nullptr ? ops::norm_sq_unpack(red) : *sq;
  ops::step_scale(scale, *sq, loss_scale, max_norm);
}

void CpuDevice::add(float* dst, const float* src, size_t n) {
  ops::OpScope scope(ops::OpClass::OTHER);
  ops::add_inplace(dst, src, n);
}

void CpuDevice::scale(float* p, size_t n, float s) {
  ops::OpScope scope(ops::OpClass::OTHER);
  ops::scale_inplace(p, n, s);
}

void CpuDevice::topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) {
  ops::OpScope scope(ops::OpClass::OTHER);
  forget(residual);
  forget(values);
  forget(indices);
  ops::topk_select(residual, n, k, values, indices);
}

void CpuDevice::sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) {
  ops::OpScope scope(ops::OpClass::OTHER);
  forget(dense);
  ops::sparse_add(dense, values, indices, count);
}

void CpuDevice::orthogonalize(float* a, size_t rows, size_t cols) {
  ops::OpScope scope(ops::OpClass::OTHER);
  forget(a);
  ops::orthogonalize_columns(a, rows, cols);
}

void CpuDevice::cast(void* dst, DType dt, const void* src, DType st, size_t n) {
  ops::OpScope scope(ops::OpClass::OTHER);
  if (dt != st) {
    DT_ENFORCE(dst != src, UsageError, "cast {} -> {} in place", dtype_name(st), dtype_name(dt));
  }
  forget(dst);
  ops::cast(dst, dt, src, st, n);
}

void CpuDevice::round_to(float* p, size_t n, DType t) {
  ops::OpScope scope(ops::OpClass::OTHER);
  ops::round_to(p, n, t);
}

Device& cpu() {
  // Never destroyed: a DeviceBuffer in another static object may be freed after this one's
  // destructor would have run, and its free takes the block cache's lock.
  static CpuDevice* dev = new CpuDevice;
  return *dev;
}

}  // namespace dtrain::device
