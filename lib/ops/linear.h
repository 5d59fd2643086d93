// Linear layers through OpenBLAS: out[N,OC] = inp[N,IC] @ W^T (+ bias), W stored
// [OC, IC] like torch.nn.Linear (HF weights load without transposes). Backward
// ACCUMULATES (+=) into dweight and dbias, and into dinp or writes it (the first of the
// projections that share an input gradient writes it: no zeroing pass); pass null for
// any of them to skip that GEMM (frozen base weights under LoRA skip the dW GEMM).
#pragma once

#include <cstdint>

namespace dtrain::ops {

/// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when trans_x.
/// A is [M,K] ([K,M] when trans_a); B is [K,N] ([N,K] when trans_b).
/// GEMM accounting for benchmarks: when enabled, every BLAS sgemm call adds its time on
/// the thread that ran it (pool threads included: thread-seconds, not wall time) and
/// its 2*M*N*K flops to process-wide counters, and its thread CPU time (relaxed atomics;
/// off by default).
struct GemmStats {
  uint64_t calls = 0;
  double flops = 0;
  double seconds = 0;      ///< wall time inside sgemm, summed over threads
  double cpu_seconds = 0;  ///< CPU time of the threads inside sgemm
};
void gemm_stats_enable(bool on);
GemmStats gemm_stats();
void gemm_stats_reset();

/// One row-major GEMM with explicit leading dimensions (strided views such as one head
/// of [T, NH, HD]), run on the calling thread: for callers that parallelise over many
/// small GEMMs themselves. Counted by gemm_stats like gemm().
void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
             int ldb, float beta, float* C, int ldc);

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, const float* B, float beta,
          float* C);
/// gemm() with row pitches (each at least its matrix's row width), threaded like gemm().
void gemm_strided(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc);

/// out = inp @ weight^T + bias (bias may be null). Overwrites out's N x OC elements, rows
/// ld_out >= OC apart (the columns past OC are left as they are).
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC,
                    int ld_out);
/// pre = inp @ weight^T + bias and out = gelu(pre), each row block's GELU right after
/// its GEMM (rows OC apart).
void linear_gelu_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int N,
                         int IC, int OC);
/// dinp (+)= dout @ weight (+= when accumulate_dinp, else =); dweight += dout^T @ inp;
/// dbias += sum_rows(dout). dout's rows are ld_dout >= OC apart (only OC columns read).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, int ld_dout, bool accumulate_dinp);

/// The backward of a linear layer whose input was gelu(pre): dpre = gelu'(pre) * (dout @
/// weight) (written, each row block's GELU' right after its GEMM), dweight += dout^T @
/// inp, dbias += sum_rows(dout). dout's rows are OC apart, dpre's and pre's IC apart.
void linear_dgelu_backward(float* dpre, float* dweight, float* dbias, const float* dout, const float* inp,
                           const float* weight, const float* pre, int N, int IC, int OC);

}  // namespace dtrain::ops
