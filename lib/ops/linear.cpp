// cblas_sgemm wrappers. OpenBLAS is pinned to one thread and big GEMMs are split into
// row blocks of the output across the ops thread pool (ops/parallel.h): one sleeping
// pool for all CPU parallelism, so nothing spin-waits for a core another pool holds.
#include "ops/linear.h"

#include "core/check.h"
#include "ops/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include <cstddef>
#include <mutex>

namespace dtrain::ops {

namespace {
// Row blocks smaller than this many output rows are not worth a thread.
constexpr int GEMM_MIN_ROWS = 16;
std::once_flag g_blas_once;
}  // namespace

namespace {
std::atomic<bool> g_stats_on{false};
std::atomic<uint64_t> g_stats_calls{0};
std::atomic<uint64_t> g_stats_ns{0};
std::atomic<uint64_t> g_stats_mflop{0};  // flops / 1e6, so 64 bits never overflow

// Adds one GEMM's time to the counters when accounting is on.
struct GemmTimer {
  bool on = g_stats_on.load(std::memory_order_relaxed);
  std::chrono::steady_clock::time_point t0 = on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  double flops;
  explicit GemmTimer(double f) : flops(f) {}
  ~GemmTimer() {
    if (!on) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    g_stats_calls.fetch_add(1, std::memory_order_relaxed);
    g_stats_ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
    g_stats_mflop.fetch_add(static_cast<uint64_t>(flops / 1e6), std::memory_order_relaxed);
  }
};
}  // namespace

void gemm_stats_enable(bool on) { g_stats_on = on; }

GemmStats gemm_stats() {
  return {g_stats_calls.load(), static_cast<double>(g_stats_mflop.load()) * 1e6, g_stats_ns.load() * 1e-9};
}

void gemm_stats_reset() {
  g_stats_calls = 0;
  g_stats_ns = 0;
  g_stats_mflop = 0;
}

void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
             const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  std::call_once(g_blas_once, [] { openblas_set_num_threads(1); });
  GemmTimer timer(2.0 * M * N * static_cast<double>(K));
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {
// gemm() with leading dimensions (row pitches): the linear layers' padded logits rows.
void gemm_rows(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  GemmTimer timer(2.0 * M * N * static_cast<double>(K));
  std::call_once(g_blas_once, [] { openblas_set_num_threads(1); });
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const size_t blocks = static_cast<size_t>((M + GEMM_MIN_ROWS - 1) / GEMM_MIN_ROWS);
  // Work is counted in multiply-adds / 64 so a GEMM goes threaded at ~2M flops.
  const size_t work = static_cast<size_t>(M) * N * static_cast<size_t>(K) / 64;
  parallel_for(blocks, work, [&](size_t begin, size_t end) {
    const int m0 = static_cast<int>(begin) * GEMM_MIN_ROWS;
    const int m1 = std::min(M, static_cast<int>(end) * GEMM_MIN_ROWS);
    // Rows m0..m1 of op(A): row offset in A, or column offset when A is transposed.
    const float* a = trans_a ? A + m0 : A + static_cast<size_t>(m0) * lda;
    cblas_sgemm(CblasRowMajor, ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta,
                C + static_cast<size_t>(m0) * ldc, ldc);
  });
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  gemm_rows(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC, int ld_out) {
  DT_ENFORCE_GE(ld_out, OC, UsageError, "linear_forward: the output's row pitch is below its width");
  float beta = 0.0f;
  if (bias) {
    for (int n = 0; n < N; ++n) {
      float* o = out + static_cast<size_t>(n) * ld_out;
      for (int c = 0; c < OC; ++c) o[c] = bias[c];
    }
    beta = 1.0f;
  }
  gemm_rows(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, ld_out);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int IC, int OC, int ld_dout,
                     bool accumulate_dinp) {
  DT_ENFORCE_GE(ld_dout, OC, UsageError, "linear_backward: dout's row pitch is below its width");
  if (dinp)
    gemm_rows(false, false, N, IC, OC, 1.0f, dout, ld_dout, weight, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
  if (dweight) gemm_rows(true, false, OC, IC, N, 1.0f, dout, ld_dout, inp, IC, 1.0f, dweight, IC);
  if (dbias) {
    parallel_for(static_cast<size_t>(OC), static_cast<size_t>(N) * OC, [&](size_t begin, size_t end) {
      for (int c = static_cast<int>(begin); c < static_cast<int>(end); ++c) {
        float s = 0;
        for (int n = 0; n < N; ++n) s += dout[static_cast<size_t>(n) * ld_dout + c];
        dbias[c] += s;
      }
    });
  }
}

}  // namespace dtrain::ops
