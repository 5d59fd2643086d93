// The CPU device: every op is the lib/ops implementation on host memory, fp32 only, fused
// ops included (residual + norm and linear + GELU are single lib/ops passes). The
// cross-entropy forward keeps each row's logsumexp for the backward of the same logits
// (llm.c's fused classifier, split at the API). Each op is timed into its class for
// bench_cpu_step's breakdown when ops::op_stats is on.
#include "device/device.h"

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
#include "ops/parallel.h"
#include "ops/rope.h"
#include "ops/step_scale.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
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

class CpuDevice final : public Device {
 public:
  Kind kind() const override { return Kind::CPU; }
  std::string name() const override { return "cpu"; }
  void* stream() const override { return nullptr; }
  void* use_stream(void*) override { return nullptr; }
  std::unique_ptr<Event> event_create() override { return std::make_unique<Event>(); }
  void event_record(Event&, void*) override {}
  void stream_wait(void*, Event&) override {}

  void* alloc(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded >= kCacheMin) {
      if (void* p = cache_take(rounded)) {
        forget(p);
        zero(p, rounded);
        return p;
      }
    }
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (rounded >= kCacheMin) sizes_[p] = rounded;
    used_add_locked(static_cast<ptrdiff_t>(rounded >= kCacheMin ? rounded : ::malloc_usable_size(p)));
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    forget(p);
    if (!cache_put(p)) std::free(p);
  }
  MemoryStats memory_stats() override {
    std::lock_guard<std::mutex> lock(cache_mu_);
    return {used_, used_peak_, used_ + cached_bytes_};
  }
  void memory_peak_reset() override {
    std::lock_guard<std::mutex> lock(cache_mu_);
    used_peak_ = used_;
  }
  void memory_trim() override {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      for (const auto& c : cached_) {
        drop.push_back(c.first);
        sizes_.erase(c.first);
      }
      cached_.clear();
      cached_bytes_ = 0;
    }
    for (void* q : drop) std::free(q);
  }
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    copy(dst, src, bytes);
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    copy(dst, src, bytes);
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    forget(dst);
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    copy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    forget(p);
    // Gradient buffers are zeroed every step: in 64 KiB blocks across the pool.
    constexpr size_t BLOCK = 64 * 1024;
    char* c = static_cast<char*>(p);
    ops::parallel_for((bytes + BLOCK - 1) / BLOCK, bytes / 4, [&](size_t b, size_t e) {
      std::memset(c + b * BLOCK, 0, std::min(bytes, e * BLOCK) - b * BLOCK);
    });
  }
  void synchronize() override {}

  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, const void* B, float beta, void* C,
            DType ab_t, DType c_t) override {
    ops::OpScope scope(ops::OpClass::LINEAR);
    f32(ab_t);
    f32(c_t);
    forget(C);
    ops::gemm(ta, tb, M, N, K, alpha, F(A), F(B), beta, F(C));
  }
  void gemm_ld(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda, const void* B, int ldb,
               float beta, void* C, int ldc, DType ab_t, DType c_t) override {
    ops::OpScope scope(ops::OpClass::LINEAR);
    f32(ab_t);
    f32(c_t);
    forget(C);
    ops::gemm_strided(ta, tb, M, N, K, alpha, F(A), lda, F(B), ldb, beta, F(C), ldc);
  }
  void linear_forward(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC, int ld_out,
                      DType t) override {
    ops::OpScope scope(ops::OpClass::LINEAR);
    f32(t);
    forget(out);
    ops::linear_forward(F(out), F(inp), F(w), F(bias), N, IC, OC, ld_out);
  }
  void linear_gelu_forward(void* out, void* pre, const void* inp, const void* w, const void* bias, int N, int IC,
                           int OC, DType t) override {
    ops::OpScope scope(ops::OpClass::LINEAR);
    f32(t);
    ops::linear_gelu_forward(F(out), F(pre), F(inp), F(w), F(bias), N, IC, OC);
  }
  void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* w,
                       int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType t) override {
    ops::OpScope scope(ops::OpClass::LINEAR);
    f32(t);
    ops::linear_backward(F(dinp), dweight, dbias, F(dout), F(inp), F(w), N, IC, OC, ld_dout, accumulate_dinp);
  }
  void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp, const void* w,
                             const void* pre, int N, int IC, int OC, DType t) override {
    ops::OpScope scope(ops::OpClass::LINEAR);
    f32(t);
    ops::linear_dgelu_backward(F(dpre), dweight, dbias, F(dout), F(inp), F(w), F(pre), N, IC, OC);
  }

  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* bias, int N,
                         int C, float eps, DType t) override {
    ops::OpScope scope(ops::OpClass::NORM);
    f32(t);
    ops::layernorm_forward(F(out), mean, rstd, F(inp), F(w), F(bias), N, C, eps);
  }
  void residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b,
                                  const void* w, const void* bias, int N, int C, float eps, DType t) override {
    ops::OpScope scope(ops::OpClass::NORM);
    f32(t);
    ops::residual_layernorm_forward(F(residual), F(out), mean, rstd, F(a), F(b), F(w), F(bias), N, C, eps);
  }
  void layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                          const float* mean, const float* rstd, int N, int C, DType t) override {
    ops::OpScope scope(ops::OpClass::NORM);
    f32(t);
    ops::layernorm_backward(F(dinp), dw, dbias, F(dout), F(inp), F(w), mean, rstd, N, C);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                       DType t) override {
    ops::OpScope scope(ops::OpClass::NORM);
    f32(t);
    ops::rmsnorm_forward(F(out), rstd, F(inp), F(w), N, C, eps);
  }
  void residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* w,
                                int N, int C, float eps, DType t) override {
    ops::OpScope scope(ops::OpClass::NORM);
    f32(t);
    ops::residual_rmsnorm_forward(F(residual), F(out), rstd, F(a), F(b), F(w), N, C, eps);
  }
  void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                        int N, int C, DType t) override {
    ops::OpScope scope(ops::OpClass::NORM);
    f32(t);
    ops::rmsnorm_backward(F(dinp), dw, F(dout), F(inp), F(w), rstd, N, C);
  }

  void gelu_forward(void* out, const void* inp, size_t n, DType t) override {
    ops::OpScope scope(ops::OpClass::ACTIVATION);
    f32(t);
    ops::gelu_forward(F(out), F(inp), n);
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) override {
    ops::OpScope scope(ops::OpClass::ACTIVATION);
    f32(t);
    ops::gelu_backward(F(dinp), F(inp), F(dout), n);
  }
  void swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                      DType t) override {
    ops::OpScope scope(ops::OpClass::ACTIVATION);
    f32(t);
    ops::swiglu_forward(F(out), F(gate), F(up), rows, cols, ld);
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                       size_t cols, size_t ld, DType t) override {
    ops::OpScope scope(ops::OpClass::ACTIVATION);
    f32(t);
    ops::swiglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), rows, cols, ld);
  }
  void dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType t) override {
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
  void dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType t) override {
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

  void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                    const ops::RopeFreq& rope, const int32_t* doc_start, DType t) override {
    ops::OpScope scope(ops::OpClass::ROPE);
    f32(t);
    ops::rope_forward(F(q), F(k), B, T, NH, NKV, HD, rope, doc_start, q_stride, kv_stride);
  }
  void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                     const ops::RopeFreq& rope, const int32_t* doc_start, DType t) override {
    ops::OpScope scope(ops::OpClass::ROPE);
    f32(t);
    ops::rope_backward(F(dq), F(dk), B, T, NH, NKV, HD, rope, doc_start, q_stride, kv_stride);
  }
  size_t attention_saved_floats(int B, int T, int NH) const override { return static_cast<size_t>(B) * NH * T * T; }
  void attention_forward(void* out, float* saved, const void* q, const void* k, const void* v, int B, int T, int NH,
                         int NKV, int HD, int q_stride, int kv_stride, int window, const int32_t* doc_start,
                         DType t) override {
    ops::OpScope scope(ops::OpClass::ATTENTION);
    f32(t);
    // q, k and v are read in place (strided column slices of a fused qkv): no copies.
    ops::attention_forward(F(out), saved, F(q), F(k), F(v), B, T, NH, NKV, HD, q_stride, kv_stride, window, doc_start);
  }
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* /*out*/, const float* saved,
                          const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                          int q_stride, int kv_stride, int window, const int32_t* doc_start, DType t) override {
    ops::OpScope scope(ops::OpClass::ATTENTION);
    f32(t);
    // The device writes dq/dk/dv; ops::attention_backward accumulates, so zero them first.
    const size_t N = static_cast<size_t>(B) * T;
    zero_rows(F(dq), N, NH * HD, q_stride);
    zero_rows(F(dk), N, NKV * HD, kv_stride);
    zero_rows(F(dv), N, NKV * HD, kv_stride);
    ops::attention_backward(F(dq), F(dk), F(dv), F(dout), saved, F(q), F(k), F(v), B, T, NH, NKV, HD, q_stride,
                            kv_stride, window, doc_start);
  }

  void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                         const int32_t* doc_start, DType t) override {
    ops::OpScope scope(ops::OpClass::EMBEDDING);
    f32(t);
    ops::embedding_forward(F(out), tokens, F(wte), F(wpe), B, T, C, V, doc_start);
  }
  void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C,
                          int /*V*/, const int32_t* doc_start, DType t) override {
    ops::OpScope scope(ops::OpClass::EMBEDDING);
    f32(t);
    ops::embedding_backward(dwte, dwpe, F(dout), tokens, B, T, C, doc_start);
  }
  void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N, int V,
                             int ld, DType t) override {
    ops::OpScope scope(ops::OpClass::CROSS_ENTROPY);
    f32(t);
    t_ce.logits = nullptr;
    t_ce_lse.resize(static_cast<size_t>(N));
    const float m =
        ops::cross_entropy_forward(losses, F(logits), targets, N, V, ld, ops::IGNORE_INDEX, t_ce_lse.data());
    t_ce = CeKey{logits, N, V, ld};
    if (mean) *mean = m;
  }
  void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                              float factor, const float* count, DType t) override {
    ops::OpScope scope(ops::OpClass::CROSS_ENTROPY);
    const float scale = ops::ce_backward_scale(factor, *count);
    f32(t);
    const bool cached = t_ce.logits == logits && t_ce.N == N && t_ce.V == V && t_ce.ld == ld;
    t_ce.logits = nullptr;  // the backward overwrites the logits when dlogits aliases them
    ops::cross_entropy_backward(F(dlogits), F(logits), targets, N, V, ld, scale, ops::IGNORE_INDEX,
                                cached ? t_ce_lse.data() : nullptr);
  }

  void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                      const int32_t* targets, int N, int V, int ld, float factor, const float* count,
                                      DType t) override {
    cross_entropy_forward(losses, mean, logits, targets, N, V, ld, t);
    cross_entropy_backward(dlogits, logits, targets, N, V, ld, factor, count, t);
  }

  void adamw(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg, float lr,
             int64_t step, bool decay, const float* scale, void* copy, DType copy_t) override {
    ops::OpScope scope(ops::OpClass::OPTIMIZER);
    if (scale[1] != 0.0f) return;  // a skipped step
    const float grad_scale = scale[0];
    if (copy == nullptr || copy_t == DType::F32) {
      ops::adamw_step(param, grad, m, v, n, cfg, lr, step, decay, grad_scale);
      if (copy != nullptr) CpuDevice::copy(copy, param, n * sizeof(float));
      return;
    }
    ops::adamw_step_copy(param, grad, m, v, n, cfg, lr, step, decay, grad_scale, static_cast<uint16_t*>(copy), copy_t);
  }
  void adamw_multi(const ops::AdamWTensor* tensors, size_t count, const ops::AdamWConfig& cfg, float lr, int64_t step,
                   const float* scale, DType copy_t) override {
    for (size_t k = 0; k < count; ++k) {
      const ops::AdamWTensor& x = tensors[k];
      adamw(x.param, x.grad, x.m, x.v, x.n, cfg, lr, step, x.decay, scale, x.copy, copy_t);
    }
  }
  void norm_sq_accumulate(double* acc, const float* g, size_t n) override {
    ops::OpScope scope(ops::OpClass::OPTIMIZER);
    *acc += ops::grad_norm_sq(g, n);
  }
  void norm_sq_pack(float* red, const double* sq) override { ops::norm_sq_pack(red, *sq); }
  void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) override {
    *sum = ops::step_loss_sum(means, counts, n);
    *sum_f32 = static_cast<float>(*sum);
  }
  void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) override {
    ops::OpScope scope(ops::OpClass::OPTIMIZER);
    *sq = red != nullptr ? ops::norm_sq_unpack(red) : *sq;
    ops::step_scale(scale, *sq, loss_scale, max_norm);
  }
  void add(float* dst, const float* src, size_t n) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    ops::add_inplace(dst, src, n);
  }
  void scale(float* p, size_t n, float s) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    ops::scale_inplace(p, n, s);
  }
  void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    forget(residual);
    forget(values);
    forget(indices);
    ops::topk_select(residual, n, k, values, indices);
  }
  void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    forget(dense);
    ops::sparse_add(dense, values, indices, count);
  }
  void orthogonalize(float* a, size_t rows, size_t cols) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    forget(a);
    ops::orthogonalize_columns(a, rows, cols);
  }
  void cast(void* dst, DType dt, const void* src, DType st, size_t n) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    if (dt != st) {
      DT_ENFORCE(dst != src, UsageError, "cast {} -> {} in place", dtype_name(st), dtype_name(dt));
    }
    forget(dst);
    ops::cast(dst, dt, src, st, n);
  }
  void round_to(float* p, size_t n, DType t) override {
    ops::OpScope scope(ops::OpClass::OTHER);
    ops::round_to(p, n, t);
  }

 private:
  void copy(void* dst, const void* src, size_t bytes) {
    forget(dst);
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  // ---- Freed blocks kept for reuse. A ZeRO-3 step gathers each layer into a new buffer and
  // frees it after the layer, stages 2-3 give each layer's gradient a working buffer, and
  // the buckets come and go: the same few large sizes every layer and step. From malloc
  // each is a fresh mmap whose pages the kernel faults in and zeroes again, so a step spent
  // more system than user time. Blocks of kCacheMin bytes and more are kept (at most
  // kCachePerSize of a size, kCacheBytes in all, the oldest dropped first) and handed out
  // again, zeroed, for the same size. A size's blocks cycle (a layer's gathers freed, the
  // next layer's taken), so what the cache holds is bounded by the most blocks of each
  // size in use at once: the memory plan counts exactly that (train/zero_plan.h). Keeping
  // one block of a size left ZeRO-3's prefetched layers (several of a size live at once)
  // to mmap and fault in each step: 102 s of system time in issue 50's 2-rank job, 57 s
  // with up to 64 kept.
  static constexpr size_t kCacheMin = size_t{1} << 20;
  static constexpr size_t kCachePerSize = 64;
  static constexpr size_t kCacheBytes = size_t{4} << 30;
  std::mutex cache_mu_;
  std::unordered_map<void*, size_t> sizes_;      // live and cached blocks of kCacheMin and more
  std::deque<std::pair<void*, size_t>> cached_;  // freed blocks, oldest first
  size_t cached_bytes_ = 0;
  size_t used_ = 0, used_peak_ = 0;  // bytes of live allocations (memory_stats)

  // Under cache_mu_.
  void used_add_locked(ptrdiff_t bytes) {
    used_ = static_cast<size_t>(static_cast<ptrdiff_t>(used_) + bytes);
    used_peak_ = std::max(used_peak_, used_);
  }
  // A kept block of exactly `bytes` (counted in use again), or nullptr.
  void* cache_take(size_t bytes) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (auto it = cached_.rbegin(); it != cached_.rend(); ++it)
      if (it->second == bytes) {
        void* p = it->first;
        cached_.erase(std::next(it).base());
        cached_bytes_ -= bytes;
        used_add_locked(static_cast<ptrdiff_t>(bytes));
        return p;
      }
    return nullptr;
  }
  // Counts p out of use; true when it is kept (the caller must not free it).
  bool cache_put(void* p) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = sizes_.find(p);
      if (it == sizes_.end()) {
        used_add_locked(-static_cast<ptrdiff_t>(::malloc_usable_size(p)));
        return false;
      }
      const size_t bytes = it->second;
      used_add_locked(-static_cast<ptrdiff_t>(bytes));
      size_t same = 0;
      for (const auto& c : cached_) same += c.second == bytes;
      if (same >= kCachePerSize || bytes > kCacheBytes) {
        sizes_.erase(it);
        return false;
      }
      cached_.emplace_back(p, bytes);
      cached_bytes_ += bytes;
      while (cached_bytes_ > kCacheBytes) {
        drop.push_back(cached_.front().first);
        cached_bytes_ -= cached_.front().second;
        sizes_.erase(cached_.front().first);
        cached_.pop_front();
      }
    }
    for (void* q : drop) std::free(q);
    return true;
  }
  // (The device lives as long as the process; the blocks still cached at exit stay
  // reachable from it and go with the process.)

  static void forget(const void* p) {
    CeKey& ce = t_ce;
    if (!ce.logits || !p) return;
    const char* lo = static_cast<const char*>(ce.logits);
    const char* c = static_cast<const char*>(p);
    if (c >= lo && c < lo + static_cast<size_t>(ce.N) * ce.ld * sizeof(float)) ce.logits = nullptr;
  }
  static void f32(DType t) {
    DT_ENFORCE(t == DType::F32, UsageError,
               "the CPU device computes in fp32 (got {}): its mixed-precision compute copy is fp32 values "
               "rounded to bf16/fp16",
               dtype_name(t));
  }
};

}  // namespace

// Pageable host memory, 64-byte aligned and zeroed (the CPU has nothing to pin for).
void* Device::host_alloc(size_t bytes, bool /*pinned*/) {
  if (!bytes) return nullptr;
  void* p = ::operator new (bytes, std::align_val_t{64}, std::nothrow);
  DT_ENFORCE(p != nullptr, DeviceError, "{}: cannot allocate {:.2f} GiB of host memory", name(),
             static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  cpu().zero(p, bytes);  // across the pool: offloaded state is many GiB
  return p;
}

void Device::host_free(void* p, bool /*pinned*/) {
  if (p) ::operator delete (p, std::align_val_t{64}, std::nothrow);
}

Device& cpu() {
  // Never destroyed: a DeviceBuffer in another static object may be freed after this one's
  // destructor would have run, and its free takes the block cache's lock.
  static CpuDevice* dev = new CpuDevice;
  return *dev;
}

}  // namespace dtrain::device
