// cblas_sgemm wrappers. OpenBLAS is pinned to one thread and big GEMMs are split into
// row or column blocks of the output across the ops thread pool (ops/parallel.h): one
// sleeping pool for all CPU parallelism, so nothing spin-waits for a core another pool
// holds. The bias fill and the GELU (forward) or GELU' (backward) of the fused linear +
// GELU run in the same block right after its GEMM, while the block is still in cache.
#include "ops/linear.h"

#include "core/check.h"
#include "ops/activation.h"
#include "ops/parallel.h"
#include "ops/simd.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

namespace dtrain::ops {

namespace {
// Blocks narrower than this many output rows (or columns) are not worth a thread.
constexpr int GEMM_MIN_ROWS = 16;
std::once_flag g_blas_once;

std::atomic<bool> g_stats_on{false};
std::atomic<uint64_t> g_stats_calls{0};
std::atomic<uint64_t> g_stats_ns{0};
std::atomic<uint64_t> g_stats_kflop{0};  // flops / 1e3, so 64 bits never overflow

std::atomic<uint64_t> g_stats_cpu_ns{0};

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// One cblas_sgemm on the calling thread, its time and flops added to the counters when
// accounting is on: wall time on the thread (two threads in GEMM for 1 ms count 2 ms)
// and the thread's CPU time (what other load on the machine does not inflate).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc) {
  const bool on = g_stats_on.load(std::memory_order_relaxed);
  const auto t0 = on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  const int64_t c0 = on ? thread_cpu_ns() : 0;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
  if (!on) return;
  const int64_t cpu = thread_cpu_ns() - c0;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  g_stats_calls.fetch_add(1, std::memory_order_relaxed);
  g_stats_ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  g_stats_cpu_ns.fetch_add(static_cast<uint64_t>(cpu), std::memory_order_relaxed);
  g_stats_kflop.fetch_add(static_cast<uint64_t>(2.0 * M * N * static_cast<double>(K) / 1e3), std::memory_order_relaxed);
}

void blas_init() {
  std::call_once(g_blas_once, [] { openblas_set_num_threads(1); });
}

// Calls fn(m0, m1, n0, n1) on blocks of an M x N GEMM output across the pool, splitting
// the longer side: every sgemm call packs its whole slice of A and of B, so cutting the
// shorter side would pack the big operand once per block (the 124M model's lm_head,
// M = 256 tokens by N = 50304, packed its 154 MB weight 8 times a step). Two blocks per
// thread: enough to rebalance when the OS deschedules a worker, few enough that packing
// stays a small share (bench_cpu_step: 4 per thread and rows only cost 7-13% more wall
// time per step on the 124M, d256-V50304 and d256-V512 shapes).
constexpr int GEMM_CHUNKS_PER_THREAD = 2;

template <class Fn>
void gemm_blocks(int M, int N, int K, Fn&& fn) {
  const bool by_rows = M >= N;
  const int len = by_rows ? M : N;
  const size_t blocks = static_cast<size_t>((len + GEMM_MIN_ROWS - 1) / GEMM_MIN_ROWS);
  // Work is counted in multiply-adds / 64 so a GEMM goes threaded at ~2M flops.
  const size_t work = static_cast<size_t>(M) * N * static_cast<size_t>(K) / 64;
  parallel_for(
      blocks, work,
      [&](size_t begin, size_t end) {
        const int b0 = static_cast<int>(begin) * GEMM_MIN_ROWS,
                  b1 = std::min(len, static_cast<int>(end) * GEMM_MIN_ROWS);
        if (by_rows) fn(b0, b1, 0, N);
        else fn(0, M, b0, b1);
      },
      GEMM_CHUNKS_PER_THREAD);
}

// Rows m0..m1 of op(A): the row offset in A, or the column offset when A is transposed.
const float* a_rows(bool trans_a, const float* A, int lda, int m0) {
  return trans_a ? A + m0 : A + static_cast<size_t>(m0) * lda;
}
// Columns n0..n1 of op(B): the column offset in B, or the row offset when B is transposed.
const float* b_cols(bool trans_b, const float* B, int ldb, int n0) {
  return trans_b ? B + static_cast<size_t>(n0) * ldb : B + n0;
}

// gemm() with leading dimensions (row pitches): the linear layers' padded logits rows.
void gemm_rows(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  blas_init();
  gemm_blocks(M, N, K, [&](int m0, int m1, int n0, int n1) {
    sgemm(trans_a, trans_b, m1 - m0, n1 - n0, K, alpha, a_rows(trans_a, A, lda, m0), lda, b_cols(trans_b, B, ldb, n0),
          ldb, beta, C + static_cast<size_t>(m0) * ldc + n0, ldc);
  });
}

// Block [m0, m1) x [n0, n1) of out = inp @ W^T + bias.
void linear_block(float* out, const float* inp, const float* weight, const float* bias, int IC, int ld_out, int m0,
                  int m1, int n0, int n1) {
  if (bias)
    for (int n = m0; n < m1; ++n)
      std::memcpy(out + static_cast<size_t>(n) * ld_out + n0, bias + n0, sizeof(float) * static_cast<size_t>(n1 - n0));
  sgemm(false, true, m1 - m0, n1 - n0, IC, 1.0f, inp + static_cast<size_t>(m0) * IC, IC,
        weight + static_cast<size_t>(n0) * IC, IC, bias ? 1.0f : 0.0f, out + static_cast<size_t>(m0) * ld_out + n0,
        ld_out);
}

// dbias[c0..c1) += column sums of dout, rows in order (contiguous loads).
DT_OPS_SIMD void colsum_block(float* __restrict acc, const float* dout, int N, int ld, int c0, int c1) {
  const int w = c1 - c0;
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<size_t>(n) * ld + c0;
    for (int c = 0; c < w; ++c) acc[c] += d[c];
  }
}

void bias_grad(float* dbias, const float* dout, int N, int OC, int ld) {
  parallel_for(static_cast<size_t>(OC), static_cast<size_t>(N) * OC, [&](size_t begin, size_t end) {
    const int c0 = static_cast<int>(begin), c1 = static_cast<int>(end);
    std::vector<float> acc(end - begin, 0.0f);
    colsum_block(acc.data(), dout, N, ld, c0, c1);
    for (int c = c0; c < c1; ++c) dbias[c] += acc[static_cast<size_t>(c - c0)];
  });
}
}  // namespace

void gemm_stats_enable(bool on) { g_stats_on = on; }

GemmStats gemm_stats() {
  return {g_stats_calls.load(), static_cast<double>(g_stats_kflop.load()) * 1e3, g_stats_ns.load() * 1e-9,
          g_stats_cpu_ns.load() * 1e-9};
}

void gemm_stats_reset() {
  g_stats_calls = 0;
  g_stats_ns = 0;
  g_stats_kflop = 0;
  g_stats_cpu_ns = 0;
}

void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
             int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  blas_init();
  sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, const float* B, float beta,
          float* C) {
  gemm_rows(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

void gemm_strided(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc) {
  DT_ENFORCE(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N, UsageError,
             "gemm_strided: a row pitch (lda {}, ldb {}, ldc {}) is below its matrix's row width", lda, ldb, ldc);
  gemm_rows(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC,
                    int ld_out) {
  DT_ENFORCE_GE(ld_out, OC, UsageError, "linear_forward: the output's row pitch is below its width");
  if (N == 0 || OC == 0) return;
  blas_init();
  gemm_blocks(N, OC, IC, [&](int m0, int m1, int n0, int n1) {
    linear_block(out, inp, weight, bias, IC, ld_out, m0, m1, n0, n1);
  });
}

void linear_gelu_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int N,
                         int IC, int OC) {
  if (N == 0 || OC == 0) return;
  blas_init();
  gemm_blocks(N, OC, IC, [&](int m0, int m1, int n0, int n1) {
    linear_block(pre, inp, weight, bias, IC, OC, m0, m1, n0, n1);
    if (n0 == 0 && n1 == OC) {  // whole rows: one contiguous pass (serial inside the pool)
      const size_t off = static_cast<size_t>(m0) * OC;
      gelu_forward(out + off, pre + off, static_cast<size_t>(m1 - m0) * OC);
      return;
    }
    for (int m = m0; m < m1; ++m) {
      const size_t off = static_cast<size_t>(m) * OC + n0;
      gelu_forward(out + off, pre + off, static_cast<size_t>(n1 - n0));
    }
  });
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, int ld_dout, bool accumulate_dinp) {
  DT_ENFORCE_GE(ld_dout, OC, UsageError, "linear_backward: dout's row pitch is below its width");
  if (dinp)
    gemm_rows(false, false, N, IC, OC, 1.0f, dout, ld_dout, weight, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
  if (dweight) gemm_rows(true, false, OC, IC, N, 1.0f, dout, ld_dout, inp, IC, 1.0f, dweight, IC);
  if (dbias) bias_grad(dbias, dout, N, OC, ld_dout);
}

void linear_dgelu_backward(float* dpre, float* dweight, float* dbias, const float* dout, const float* inp,
                           const float* weight, const float* pre, int N, int IC, int OC) {
  if (N > 0 && IC > 0) {
    blas_init();
    gemm_blocks(N, IC, OC, [&](int m0, int m1, int n0, int n1) {
      const size_t off = static_cast<size_t>(m0) * IC + n0;
      sgemm(false, false, m1 - m0, n1 - n0, OC, 1.0f, dout + static_cast<size_t>(m0) * OC, OC, weight + n0, IC, 0.0f,
            dpre + off, IC);
      if (n0 == 0 && n1 == IC) {
        gelu_backward(dpre + off, pre + off, dpre + off, static_cast<size_t>(m1 - m0) * IC);
        return;
      }
      for (int m = m0; m < m1; ++m) {
        const size_t o = static_cast<size_t>(m) * IC + n0;
        gelu_backward(dpre + o, pre + o, dpre + o, static_cast<size_t>(n1 - n0));
      }
    });
  }
  if (dweight) gemm_rows(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias) bias_grad(dbias, dout, N, OC, OC);
}

}  // namespace dtrain::ops
