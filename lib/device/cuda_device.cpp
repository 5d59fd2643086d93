// The CUDA device: the kernels/ launchers and cuBLASLt on the current stream of its runtime
// (cuda_rt.h: one non-blocking compute stream per device). Every op makes its device
// current first (cudaSetDevice is per host thread, and ranks run as threads in the tests).
// CPU-only builds get the factory's error.
#include "device/device.h"
#include "device/cuda_workspace.h"

#include "core/check.h"

#ifdef DTRAIN_HAVE_CUDA
#include "core/cuda_check.h"
#include "core/env.h"
#include "device/cuda_rt.h"
#include "kernels/activation.cuh"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/cast.cuh"
#include "kernels/compress.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/dropout.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm.cuh"
#include "kernels/norm.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rope.cuh"
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dtrain::device {

#ifndef DTRAIN_HAVE_CUDA

size_t cuda_workspace_bytes() { return 0; }

void cuda_require(int) {
  DT_THROW(DeviceError,
           "the CUDA device is not available: this dtrain was built without CUDA (rebuild with -DDTRAIN_CUDA=ON "
           "where nvcc is installed, or use the CPU)");
}

std::unique_ptr<Device> cuda_create(int index) {
  cuda_require(index);
  return nullptr;  // not reached
}

void cuda_gemm_algo_cache_default(const std::string&) {}

CudaAttnKernels cuda_attention_kernels(int index, int, DType) {
  cuda_require(index);
  return {};  // not reached
}

#else

size_t cuda_workspace_bytes() { return kernels::GEMM_WORKSPACE_BYTES; }

namespace {

constexpr int32_t IGNORE_INDEX = -100;

/// The ops: each a kernels/ launcher (cuBLASLt for the GEMMs) on the current stream.
class CudaDevice final : public CudaRuntime {
 public:
  explicit CudaDevice(int index) : CudaRuntime(index) {}
  ~CudaDevice() override;

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
  void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) override;
  void orthogonalize(float* a, size_t rows, size_t cols) override;
  void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) override;
  void cast(void* dst, DType dt, const void* src, DType st, size_t n) override;
  void round_to(float* p, size_t n, DType t) override;

 private:
  // RoPE's cos/sin tables, one per (T, head dim, frequencies) seen (fp32 whatever the
  // activation dtype), built once instead of on every call. Kept until the device goes: a
  // recorded graph may hold a table's address. Null (the op builds its own per call) while
  // the stream is being captured, or past ROPE_TABLES_MAX keys, or for no work.
  static constexpr size_t ROPE_TABLES_MAX = 32;
  struct RopeTable {
    int T, HD;
    RopeFreq rope;
    void* table;
  };
  static bool rope_same(const RopeFreq& a, const RopeFreq& b) {
    return a.theta == b.theta && a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
           a.high_freq_factor == b.high_freq_factor && a.original_max_position == b.original_max_position;
  }
  const void* rope_table(int T, int HD, const RopeFreq& rope);

  std::vector<RopeTable> rope_tables_;
};

CudaDevice::~CudaDevice() {
  (void)cudaSetDevice(index_);
  (void)cudaStreamSynchronize(own_);
  for (const RopeTable& e : rope_tables_) (void)cudaFree(e.table);
}

const void* CudaDevice::rope_table(int T, int HD, const RopeFreq& rope) {
  if (T <= 0 || HD <= 0 || HD % 2 != 0) return nullptr;  // the per-call path refuses or skips
  for (const RopeTable& e : rope_tables_)
    if (e.T == T && e.HD == HD && rope_same(e.rope, rope)) return e.table;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DT_CUDA_CHECK(cudaStreamIsCapturing(s_, &capture));
  if (capture != cudaStreamCaptureStatusNone || rope_tables_.size() >= ROPE_TABLES_MAX) return nullptr;
  void* table = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&table, kernels::rope_table_bytes(T, HD)));  // not stream-ordered: outlives them all
  rope_tables_.push_back({T, HD, rope, table});
  kernels::rope_table(table, T, HD, rope, s_);
  // Later calls may run on another stream (use_stream): let the table be complete first.
  DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  return table;
}

void CudaDevice::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, const void* B, float beta,
                      void* C, DType ab_t, DType c_t) {
  cur();
  kernels::gemm(ta, tb, M, N, K, alpha, A, B, beta, C, ab_t, c_t, s_);
}

void CudaDevice::gemm_ld(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
                         int ldb, float beta, void* C, int ldc, DType ab_t, DType c_t) {
  cur();
  kernels::gemm_ld(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_t, c_t, s_);
}

void CudaDevice::linear_forward(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC,
                                int ld_out, DType t) {
  cur();
  kernels::linear_forward(out, inp, w, bias, N, IC, OC, ld_out, t, s_);
}

// The fused bias + GELU epilogue needs OC % 8 == 0 (cuBLASLt's aux-output alignment).
void CudaDevice::linear_gelu_forward(void* out, void* pre, const void* inp, const void* w, const void* bias, int N,
                                     int IC, int OC, DType t) {
  cur();
  if (OC % 8 == 0) {
    kernels::linear_gelu_forward(out, pre, inp, w, bias, N, IC, OC, t, s_);
  } else {
    kernels::linear_forward(pre, inp, w, bias, N, IC, OC, OC, t, s_);
    kernels::gelu_forward(out, pre, static_cast<size_t>(N) * OC, t, s_);
  }
}

void CudaDevice::linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                                 const void* w, int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType t) {
  cur();
  kernels::linear_backward(dinp, dweight, dbias, dout, inp, w, N, IC, OC, ld_dout, accumulate_dinp, t, s_);
}

// The DGELU epilogue reads pre with dpre's leading dimension: IC % 8 == 0 (as forward).
void CudaDevice::linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp,
                                       const void* w, const void* pre, int N, int IC, int OC, DType t) {
  cur();
  if (IC % 8 == 0) {
    kernels::linear_dgelu_backward(dpre, dweight, dbias, dout, inp, w, pre, N, IC, OC, t, s_);
  } else {
    kernels::linear_backward(dpre, dweight, dbias, dout, inp, w, N, IC, OC, OC, false, t, s_);
    kernels::gelu_backward(dpre, pre, dpre, static_cast<size_t>(N) * IC, t, s_);
  }
}

void CudaDevice::layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w,
                                   const void* bias, int N, int C, float eps, DType t) {
  cur();
  kernels::layernorm_forward(out, mean, rstd, inp, w, bias, N, C, eps, t, s_);
}

void CudaDevice::residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a,
                                            const void* b, const void* w, const void* bias, int N, int C, float eps,
                                            DType t) {
  cur();
  kernels::residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C, eps, t, s_);
}

void CudaDevice::layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                                    const void* w, const float* mean, const float* rstd, int N, int C, DType t) {
  cur();
  kernels::layernorm_backward(dinp, dw, dbias, dout, inp, w, mean, rstd, N, C, t, s_);
}

void CudaDevice::rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                                 DType t) {
  cur();
  kernels::rmsnorm_forward(out, rstd, inp, w, N, C, eps, t, s_);
}

void CudaDevice::residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b,
                                          const void* w, int N, int C, float eps, DType t) {
  cur();
  kernels::residual_rmsnorm_forward(residual, out, rstd, a, b, w, N, C, eps, t, s_);
}

void CudaDevice::rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w,
                                  const float* rstd, int N, int C, DType t) {
  cur();
  kernels::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, t, s_);
}

void CudaDevice::gelu_forward(void* out, const void* inp, size_t n, DType t) {
  cur();
  kernels::gelu_forward(out, inp, n, t, s_);
}

void CudaDevice::gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) {
  cur();
  kernels::gelu_backward(dinp, inp, dout, n, t, s_);
}

void CudaDevice::swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                                DType t) {
  cur();
  kernels::swiglu_forward(out, gate, up, rows, cols, ld, t, s_);
}

void CudaDevice::swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                 size_t rows, size_t cols, size_t ld, DType t) {
  cur();
  kernels::swiglu_backward(dgate, dup, dout, gate, up, rows, cols, ld, t, s_);
}

void CudaDevice::dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType t) {
  cur();
  kernels::dropout_forward(out, inp, n, p, seed, t, s_);
}

void CudaDevice::dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType t) {
  cur();
  kernels::dropout_backward(dinp, dout, n, p, seed, t, s_);
}

void CudaDevice::rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                              const RopeFreq& rope, const int32_t* doc_start, DType t) {
  cur();
  if (const void* table = rope_table(T, HD, rope))
    kernels::rope_forward_table(q, k, B, T, NH, NKV, HD, table, t, s_, doc_start, q_stride, kv_stride);
  else kernels::rope_forward(q, k, B, T, NH, NKV, HD, rope, t, s_, doc_start, q_stride, kv_stride);
}

void CudaDevice::rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                               const RopeFreq& rope, const int32_t* doc_start, DType t) {
  cur();
  if (const void* table = rope_table(T, HD, rope))
    kernels::rope_backward_table(dq, dk, B, T, NH, NKV, HD, table, t, s_, doc_start, q_stride, kv_stride);
  else kernels::rope_backward(dq, dk, B, T, NH, NKV, HD, rope, t, s_, doc_start, q_stride, kv_stride);
}

size_t CudaDevice::attention_saved_floats(int B, int T, int NH) const { return static_cast<size_t>(B) * NH * T; }

void CudaDevice::attention_forward(void* out, float* saved, const void* q, const void* k, const void* v, int B, int T,
                                   int NH, int NKV, int HD, int q_stride, int kv_stride, int window,
                                   const int32_t* doc_start, DType t) {
  cur();
  kernels::attention_forward(out, saved, q, k, v, B, T, NH, NKV, HD, q_stride, kv_stride, t, s_, window, doc_start);
}

void CudaDevice::attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* saved,
                                    const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                                    int q_stride, int kv_stride, int window, const int32_t* doc_start, DType t) {
  cur();
  kernels::attention_backward(dq, dk, dv, dout, out, saved, q, k, v, B, T, NH, NKV, HD, q_stride, kv_stride, t, s_,
                              window, doc_start);
}

void CudaDevice::embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                                   int C, int V, const int32_t* doc_start, DType t) {
  cur();
  kernels::embedding_forward(out, tokens, wte, wpe, B, T, C, V, t, s_, doc_start);
}

void CudaDevice::embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                                    int C, int V, const int32_t* doc_start, DType t) {
  cur();
  kernels::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, t, s_, doc_start);
}

void CudaDevice::cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N,
                                       int V, int ld, DType t) {
  cur();
  kernels::cross_entropy_forward(losses, mean, logits, targets, N, V, ld, IGNORE_INDEX, t, s_);
}

void CudaDevice::cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                                        float factor, const float* count, DType t) {
  cur();
  kernels::cross_entropy_backward(dlogits, logits, targets, N, V, ld, factor, IGNORE_INDEX, t, s_, count);
}

void CudaDevice::cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                                const int32_t* targets, int N, int V, int ld, float factor,
                                                const float* count, DType t) {
  cur();
  kernels::cross_entropy_forward_backward(losses, mean, dlogits, logits, targets, N, V, ld, factor, IGNORE_INDEX, t, s_,
                                          count);
}

void CudaDevice::adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                       int64_t step, bool decay, const float* scale, void* copy, DType copy_t) {
  if (!n) return;
  cur();
  if (copy == nullptr || copy_t == DType::F32) {
    kernels::adamw_step(param, grad, m, v, n, cfg, lr, step, decay, 1.0f, s_, scale);
    if (copy != nullptr) copy_d2d(copy, param, n * sizeof(float));  // a skipped step copies the same values
    return;
  }
  kernels::adamw_step_copy(param, grad, m, v, n, cfg, lr, step, decay, 1.0f, copy, copy_t, s_, scale);
}

void CudaDevice::adamw_multi(const AdamWTensor* tensors, size_t count, const AdamWConfig& cfg, float lr, int64_t step,
                             const float* scale, DType copy_t) {
  cur();
  if (copy_t != DType::F32) {
    kernels::adamw_step_multi(tensors, count, cfg, lr, step, 1.0f, copy_t, s_, scale);
    return;
  }
  // An fp32 copy is the updated parameters themselves: copied after the update.
  std::vector<AdamWTensor> plain(tensors, tensors + count);
  for (auto& x : plain) x.copy = nullptr;
  kernels::adamw_step_multi(plain.data(), count, cfg, lr, step, 1.0f, copy_t, s_, scale);
  for (size_t k = 0; k < count; ++k)
    if (tensors[k].copy != nullptr && tensors[k].n)
      copy_d2d(tensors[k].copy, tensors[k].param, tensors[k].n * sizeof(float));
}

void CudaDevice::norm_sq_accumulate(double* acc, const float* g, size_t n) {
  if (!n) return;
  cur();
  kernels::grad_norm_sq(acc, g, n, DType::F32, s_);
}

void CudaDevice::norm_sq_accumulate_multi(double* acc, const float* const* g, const size_t* n, size_t count) {
  if (!count) return;
  cur();
  kernels::grad_norm_sq_multi(acc, g, n, count, s_);
}

void CudaDevice::norm_sq_pack(float* red, const double* sq) {
  cur();
  kernels::norm_sq_pack(red, sq, s_);
}

void CudaDevice::step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) {
  cur();
  kernels::step_scale(scale, sq, red, loss_scale, max_norm, s_);
}

void CudaDevice::loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) {
  cur();
  kernels::loss_sum(sum, sum_f32, means, counts, n, s_);
}

void CudaDevice::add(float* dst, const float* src, size_t n) {
  cur();
  kernels::add_f32(dst, src, n, s_);
}

void CudaDevice::scale(float* p, size_t n, float s) {
  cur();
  kernels::scale_f32(p, n, s, s_);
}

void CudaDevice::topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) {
  cur();
  kernels::topk_select(residual, n, k, values, indices, s_);
}

void CudaDevice::orthogonalize(float* a, size_t rows, size_t cols) {
  cur();
  kernels::orthogonalize_columns(a, rows, cols, s_);
}

void CudaDevice::sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) {
  cur();
  kernels::sparse_add(dense, values, indices, count, s_);
}

void CudaDevice::cast(void* dst, DType dt, const void* src, DType st, size_t n) {
  cur();
  kernels::dtype_cast(dst, dt, src, st, n, s_);
}

void CudaDevice::round_to(float* p, size_t n, DType t) {
  cur();
  kernels::dtype_round(p, n, t, s_);
}

}  // namespace

void cuda_require(int index) {
  const int n = cuda_count();
  const char* visible = env_get("CUDA_VISIBLE_DEVICES");
  DT_ENFORCE(n > 0, DeviceError,
             "no CUDA device is visible here (CUDA_VISIBLE_DEVICES='{}'): run on a GPU node or use the CPU",
             visible ? visible : "");
  DT_ENFORCE(index >= 0 && index < n, DeviceError,
             "CUDA device {} does not exist: this process sees {} (CUDA_VISIBLE_DEVICES='{}'); LOCAL_RANK indexes "
             "the visible devices, so start at most {} ranks per node",
             index, n, visible ? visible : "", n);
}

std::unique_ptr<Device> cuda_create(int index) {
  cuda_require(index);
  return std::make_unique<CudaDevice>(index);
}

void cuda_gemm_algo_cache_default(const std::string& path) { kernels::gemm_algo_cache_default(path); }

CudaAttnKernels cuda_attention_kernels(int index, int HD, DType dtype) {
  cuda_require(index);
  DT_CUDA_CHECK(cudaSetDevice(index));  // the kernels answer for the current device (as every op, made current)
  const kernels::AttnForwardKernels k = kernels::attention_forward_kernels(HD, dtype);
  return {k.variant, k.requested, k.hopper_unavailable};
}

#endif  // DTRAIN_HAVE_CUDA

}  // namespace dtrain::device
