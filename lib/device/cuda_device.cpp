// The CUDA device: the kernels/ launchers and cuBLASLt on one non-blocking compute stream
// per device. Every entry point makes its device current first (cudaSetDevice is per host
// thread, and ranks run as threads in the tests). CPU-only builds get the factory's error.
#include "device/device.h"
#include "device/cuda_workspace.h"

#include "core/check.h"

#ifdef DTRAIN_HAVE_CUDA
#include "core/cuda_check.h"
#include "core/env.h"
#ifndef DTRAIN_CUDA_EMU
#include "cublaslt/lazy.h"
#endif
#include "kernels/activation.cuh"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/cast.cuh"
#include "kernels/compress.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/device.cuh"
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

#else

size_t cuda_workspace_bytes() { return kernels::GEMM_WORKSPACE_BYTES; }

namespace {

constexpr int32_t IGNORE_INDEX = -100;

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {
    DT_CUDA_CHECK(cudaSetDevice(index_));
#ifndef DTRAIN_CUDA_EMU
    // cuBLASLt is loaded on first use (lib/cublaslt/lazy.h): a node without it fails here,
    // naming the files tried, rather than at its first GEMM with a bare status code.
    if (!cublaslt::ensure_loaded()) throw DeviceError("cuda:" + std::to_string(index_) + ": " + cublaslt::load_error());
#endif
    name_ = "cuda:" + std::to_string(index_) + " (" + kernels::device_describe(index_) + ")";
    // alloc/free and the kernels' scratch are stream-ordered allocations from the
    // device's default pool, which by default hands every freed byte back to the OS at
    // the next synchronisation (release threshold 0) and maps it again on the next
    // allocation. Every step synchronises (the loss read-back), so keep what it holds.
    cudaMemPool_t pool = nullptr;
    DT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
    uint64_t keep = UINT64_MAX;
    DT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    DT_CUDA_CHECK(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
    s_ = own_;
  }
  ~CudaDevice() override {
    (void)cudaSetDevice(index_);
    (void)cudaStreamSynchronize(own_);
    for (const RopeTable& e : rope_tables_) (void)cudaFree(e.table);
    (void)cudaStreamDestroy(own_);
  }

  Kind kind() const override { return Kind::CUDA; }
  std::string name() const override { return name_; }
  void* stream() const override { return own_; }

  void* use_stream(void* stream) override {
    void* prev = s_ == own_ ? nullptr : s_;
    s_ = stream != nullptr ? static_cast<cudaStream_t>(stream) : own_;
    return prev;
  }
  class CudaEvent final : public Event {
   public:
    cudaEvent_t e = nullptr;
    ~CudaEvent() override {
      if (e) (void)cudaEventDestroy(e);
    }
  };
  std::unique_ptr<Event> event_create() override {
    cur();
    auto ev = std::make_unique<CudaEvent>();
    DT_CUDA_CHECK(cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming));
    return ev;
  }
  void event_record(Event& e, void* stream) override {
    cur();
    DT_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(e).e, stream ? static_cast<cudaStream_t>(stream) : own_));
  }
  void stream_wait(void* stream, Event& e) override {
    cur();
    DT_CUDA_CHECK(
        cudaStreamWaitEvent(stream ? static_cast<cudaStream_t>(stream) : own_, static_cast<CudaEvent&>(e).e, 0));
  }

  // Stream-ordered (the pool reuses memory without a device-wide wait), zeroed on the
  // same stream: a cudaMemset on the legacy stream would not be ordered before work on
  // a non-blocking stream.
  void* alloc(size_t bytes) override {
    cur();
    void* p = nullptr;
    DT_CUDA_CHECK(cudaMallocAsync(&p, bytes, s_));
    DT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s_));
    return p;
  }
  void free(void* p) override {
    cur();
    (void)cudaFreeAsync(p, s_);
  }
  MemoryStats memory_stats() override {
    cur();
    cudaMemPool_t pool = nullptr;
    DT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
    uint64_t used = 0, peak = 0, reserved = 0;
    DT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    DT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak));
    DT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    return {static_cast<size_t>(used), static_cast<size_t>(peak), static_cast<size_t>(reserved)};
  }
  void memory_peak_reset() override {
    cur();
    cudaMemPool_t pool = nullptr;
    DT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
    uint64_t zero = 0;  // the high-water mark starts again from the bytes in use now
    DT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  }
  // The source may be pageable: wait until the stream has consumed it.
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    cur();
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_));
    DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    cur();
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_));
    DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  // Pinned memory comes from cudaMallocHost (so the DMA engine reads it without staging
  // and copies from it are truly asynchronous); pageable from the base class.
  void* host_alloc(size_t bytes, bool pinned) override {
    if (!pinned || !bytes) return Device::host_alloc(bytes, pinned);
    cur();
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      DT_THROW(DeviceError,
               "{}: cannot pin {:.2f} GiB of host memory (cudaMallocHost: {}); set "
               "zero_optimization.offload_optimizer.pin_memory (and offload_param.pin_memory) to false, or free "
               "host memory",
               name(), static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), cudaGetErrorString(e));
    }
    device::cpu().zero(p, bytes);  // across the CPU's pool
    return p;
  }
  void host_free(void* p, bool pinned) override {
    if (!pinned) return Device::host_free(p, pinned);
    if (p) (void)cudaFreeHost(p);
  }
  void copy_h2d_async(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    cur();
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_));
  }
  void copy_d2h_async(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    cur();
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_));
  }
  void event_synchronize(Event& e) override {
    cur();
    DT_CUDA_CHECK(cudaEventSynchronize(static_cast<CudaEvent&>(e).e));
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override {
    if (!rows || !width) return;
    cur();
    DT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s_));
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    if (!bytes || dst == src) return;
    cur();
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_));
  }
  void zero(void* p, size_t bytes) override {
    if (!bytes) return;
    cur();
    DT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s_));
  }
  void synchronize() override {
    cur();
    DT_CUDA_CHECK(cudaStreamSynchronize(s_));
  }

  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, const void* B, float beta, void* C,
            DType ab_t, DType c_t) override {
    cur();
    kernels::gemm(ta, tb, M, N, K, alpha, A, B, beta, C, ab_t, c_t, s_);
  }
  void gemm_ld(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda, const void* B, int ldb,
               float beta, void* C, int ldc, DType ab_t, DType c_t) override {
    cur();
    kernels::gemm_ld(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_t, c_t, s_);
  }
  void linear_forward(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC, int ld_out,
                      DType t) override {
    cur();
    kernels::linear_forward(out, inp, w, bias, N, IC, OC, ld_out, t, s_);
  }
  // The fused bias + GELU epilogue needs OC % 8 == 0 (cuBLASLt's aux-output alignment).
  void linear_gelu_forward(void* out, void* pre, const void* inp, const void* w, const void* bias, int N, int IC,
                           int OC, DType t) override {
    cur();
    if (OC % 8 == 0) {
      kernels::linear_gelu_forward(out, pre, inp, w, bias, N, IC, OC, t, s_);
    } else {
      kernels::linear_forward(pre, inp, w, bias, N, IC, OC, OC, t, s_);
      kernels::gelu_forward(out, pre, static_cast<size_t>(N) * OC, t, s_);
    }
  }
  void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* w,
                       int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType t) override {
    cur();
    kernels::linear_backward(dinp, dweight, dbias, dout, inp, w, N, IC, OC, ld_dout, accumulate_dinp, t, s_);
  }
  // The DGELU epilogue reads pre with dpre's leading dimension: IC % 8 == 0 (as forward).
  void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp, const void* w,
                             const void* pre, int N, int IC, int OC, DType t) override {
    cur();
    if (IC % 8 == 0) {
      kernels::linear_dgelu_backward(dpre, dweight, dbias, dout, inp, w, pre, N, IC, OC, t, s_);
    } else {
      kernels::linear_backward(dpre, dweight, dbias, dout, inp, w, N, IC, OC, OC, false, t, s_);
      kernels::gelu_backward(dpre, pre, dpre, static_cast<size_t>(N) * IC, t, s_);
    }
  }

  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* bias, int N,
                         int C, float eps, DType t) override {
    cur();
    kernels::layernorm_forward(out, mean, rstd, inp, w, bias, N, C, eps, t, s_);
  }
  void residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b,
                                  const void* w, const void* bias, int N, int C, float eps, DType t) override {
    cur();
    kernels::residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C, eps, t, s_);
  }
  void layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                          const float* mean, const float* rstd, int N, int C, DType t) override {
    cur();
    kernels::layernorm_backward(dinp, dw, dbias, dout, inp, w, mean, rstd, N, C, t, s_);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                       DType t) override {
    cur();
    kernels::rmsnorm_forward(out, rstd, inp, w, N, C, eps, t, s_);
  }
  void residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* w,
                                int N, int C, float eps, DType t) override {
    cur();
    kernels::residual_rmsnorm_forward(residual, out, rstd, a, b, w, N, C, eps, t, s_);
  }
  void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                        int N, int C, DType t) override {
    cur();
    kernels::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, t, s_);
  }

  void gelu_forward(void* out, const void* inp, size_t n, DType t) override {
    cur();
    kernels::gelu_forward(out, inp, n, t, s_);
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) override {
    cur();
    kernels::gelu_backward(dinp, inp, dout, n, t, s_);
  }
  void swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                      DType t) override {
    cur();
    kernels::swiglu_forward(out, gate, up, rows, cols, ld, t, s_);
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                       size_t cols, size_t ld, DType t) override {
    cur();
    kernels::swiglu_backward(dgate, dup, dout, gate, up, rows, cols, ld, t, s_);
  }
  void dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType t) override {
    cur();
    kernels::dropout_forward(out, inp, n, p, seed, t, s_);
  }
  void dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType t) override {
    cur();
    kernels::dropout_backward(dinp, dout, n, p, seed, t, s_);
  }

  void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                    const ops::RopeFreq& rope, const int32_t* doc_start, DType t) override {
    cur();
    if (const void* table = rope_table(T, HD, rope))
      kernels::rope_forward_table(q, k, B, T, NH, NKV, HD, table, t, s_, doc_start, q_stride, kv_stride);
    else kernels::rope_forward(q, k, B, T, NH, NKV, HD, rope, t, s_, doc_start, q_stride, kv_stride);
  }
  void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                     const ops::RopeFreq& rope, const int32_t* doc_start, DType t) override {
    cur();
    if (const void* table = rope_table(T, HD, rope))
      kernels::rope_backward_table(dq, dk, B, T, NH, NKV, HD, table, t, s_, doc_start, q_stride, kv_stride);
    else kernels::rope_backward(dq, dk, B, T, NH, NKV, HD, rope, t, s_, doc_start, q_stride, kv_stride);
  }
  size_t attention_saved_floats(int B, int T, int NH) const override { return static_cast<size_t>(B) * NH * T; }
  void attention_forward(void* out, float* saved, const void* q, const void* k, const void* v, int B, int T, int NH,
                         int NKV, int HD, int q_stride, int kv_stride, int window, const int32_t* doc_start,
                         DType t) override {
    cur();
    kernels::attention_forward(out, saved, q, k, v, B, T, NH, NKV, HD, q_stride, kv_stride, t, s_, window, doc_start);
  }
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* saved,
                          const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                          int q_stride, int kv_stride, int window, const int32_t* doc_start, DType t) override {
    cur();
    kernels::attention_backward(dq, dk, dv, dout, out, saved, q, k, v, B, T, NH, NKV, HD, q_stride, kv_stride, t, s_,
                                window, doc_start);
  }

  void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                         const int32_t* doc_start, DType t) override {
    cur();
    kernels::embedding_forward(out, tokens, wte, wpe, B, T, C, V, t, s_, doc_start);
  }
  void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C, int V,
                          const int32_t* doc_start, DType t) override {
    cur();
    kernels::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, t, s_, doc_start);
  }
  void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N, int V,
                             int ld, DType t) override {
    cur();
    kernels::cross_entropy_forward(losses, mean, logits, targets, N, V, ld, IGNORE_INDEX, t, s_);
  }
  void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                              float factor, const float* count, DType t) override {
    cur();
    kernels::cross_entropy_backward(dlogits, logits, targets, N, V, ld, factor, IGNORE_INDEX, t, s_, count);
  }
  void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                      const int32_t* targets, int N, int V, int ld, float factor, const float* count,
                                      DType t) override {
    cur();
    kernels::cross_entropy_forward_backward(losses, mean, dlogits, logits, targets, N, V, ld, factor, IGNORE_INDEX, t,
                                            s_, count);
  }

  void adamw(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg, float lr,
             int64_t step, bool decay, const float* scale, void* copy, DType copy_t) override {
    if (!n) return;
    cur();
    if (copy == nullptr || copy_t == DType::F32) {
      kernels::adamw_step(param, grad, m, v, n, cfg, lr, step, decay, 1.0f, s_, scale);
      if (copy != nullptr) copy_d2d(copy, param, n * sizeof(float));  // a skipped step copies the same values
      return;
    }
    kernels::adamw_step_copy(param, grad, m, v, n, cfg, lr, step, decay, 1.0f, copy, copy_t, s_, scale);
  }
  void adamw_multi(const ops::AdamWTensor* tensors, size_t count, const ops::AdamWConfig& cfg, float lr, int64_t step,
                   const float* scale, DType copy_t) override {
    cur();
    if (copy_t != DType::F32) {
      kernels::adamw_step_multi(tensors, count, cfg, lr, step, 1.0f, copy_t, s_, scale);
      return;
    }
    // An fp32 copy is the updated parameters themselves: copied after the update.
    std::vector<ops::AdamWTensor> plain(tensors, tensors + count);
    for (auto& x : plain) x.copy = nullptr;
    kernels::adamw_step_multi(plain.data(), count, cfg, lr, step, 1.0f, copy_t, s_, scale);
    for (size_t k = 0; k < count; ++k)
      if (tensors[k].copy != nullptr && tensors[k].n)
        copy_d2d(tensors[k].copy, tensors[k].param, tensors[k].n * sizeof(float));
  }
  void norm_sq_accumulate(double* acc, const float* g, size_t n) override {
    if (!n) return;
    cur();
    kernels::grad_norm_sq(acc, g, n, DType::F32, s_);
  }
  void norm_sq_pack(float* red, const double* sq) override {
    cur();
    kernels::norm_sq_pack(red, sq, s_);
  }
  void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) override {
    cur();
    kernels::step_scale(scale, sq, red, loss_scale, max_norm, s_);
  }
  void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) override {
    cur();
    kernels::loss_sum(sum, sum_f32, means, counts, n, s_);
  }
  void add(float* dst, const float* src, size_t n) override {
    cur();
    kernels::add_f32(dst, src, n, s_);
  }
  void scale(float* p, size_t n, float s) override {
    cur();
    kernels::scale_f32(p, n, s, s_);
  }
  void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) override {
    cur();
    kernels::topk_select(residual, n, k, values, indices, s_);
  }
  void orthogonalize(float* a, size_t rows, size_t cols) override {
    cur();
    kernels::orthogonalize_columns(a, rows, cols, s_);
  }
  void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) override {
    cur();
    kernels::sparse_add(dense, values, indices, count, s_);
  }
  void cast(void* dst, DType dt, const void* src, DType st, size_t n) override {
    cur();
    kernels::dtype_cast(dst, dt, src, st, n, s_);
  }
  void round_to(float* p, size_t n, DType t) override {
    cur();
    kernels::dtype_round(p, n, t, s_);
  }

  // Thread-local capture: other host threads (other ranks in the tests, NCCL's watchdog)
  // may keep making their own CUDA calls meanwhile.
  class CudaGraph final : public Graph {
   public:
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    ~CudaGraph() override {
      if (x) (void)cudaGraphExecDestroy(x);
      if (g) (void)cudaGraphDestroy(g);
    }
  };
  bool graph_begin() override {
    cur();
    DT_CUDA_CHECK(cudaStreamBeginCapture(own_, cudaStreamCaptureModeThreadLocal));
    return true;
  }
  std::unique_ptr<Graph> graph_end() override {
    cur();
    auto graph = std::make_unique<CudaGraph>();
    const cudaError_t e = cudaStreamEndCapture(own_, &graph->g);
    if (e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureUnsupported ||
        e == cudaErrorStreamCaptureUnjoined) {
      (void)cudaGetLastError();  // not sticky: the stream is usable again
      return nullptr;
    }
    DT_CUDA_CHECK(e);
    DT_CUDA_CHECK(cudaGraphInstantiate(&graph->x, graph->g, 0));
    return graph;
  }
  void graph_launch(Graph& g) override {
    cur();
    DT_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph&>(g).x, own_));
  }

 private:
  void cur() const { DT_CUDA_CHECK(cudaSetDevice(index_)); }

  // RoPE's cos/sin tables, one per (T, head dim, frequencies) seen (fp32 whatever the
  // activation dtype), built once instead of on every call. Kept until the device goes: a
  // recorded graph may hold a table's address. Null (the op builds its own per call) while
  // the stream is being captured, or past ROPE_TABLES_MAX keys, or for no work.
  static constexpr size_t ROPE_TABLES_MAX = 32;
  struct RopeTable {
    int T, HD;
    ops::RopeFreq rope;
    void* table;
  };
  static bool rope_same(const ops::RopeFreq& a, const ops::RopeFreq& b) {
    return a.theta == b.theta && a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
           a.high_freq_factor == b.high_freq_factor && a.original_max_position == b.original_max_position;
  }
  const void* rope_table(int T, int HD, const ops::RopeFreq& rope) {
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

  int index_;
  std::string name_;
  cudaStream_t own_ = nullptr;  // the compute stream
  cudaStream_t s_ = nullptr;    // the current stream (use_stream)
  std::vector<RopeTable> rope_tables_;
};

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

#endif  // DTRAIN_HAVE_CUDA

}  // namespace dtrain::device
