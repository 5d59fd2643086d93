// cblas_sgemm wrappers. OpenBLAS threads these itself; they are never called from inside
// an OpenMP region (ops/parallel.h).
#include "ops/linear.h"

#include "ops/parallel.h"

#include <cblas.h>

#include <cstddef>

namespace dtrain::ops {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
  float beta = 0.0f;
  if (bias) {
    for (int n = 0; n < N; ++n) {
      float* o = out + static_cast<size_t>(n) * OC;
      for (int c = 0; c < OC; ++c) o[c] = bias[c];
    }
    beta = 1.0f;
  }
  gemm(false, true, N, OC, IC, 1.0f, inp, weight, beta, out);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int IC, int OC) {
  if (dinp) gemm(false, false, N, IC, OC, 1.0f, dout, weight, 1.0f, dinp);
  if (dweight) gemm(true, false, OC, IC, N, 1.0f, dout, inp, 1.0f, dweight);
  if (dbias) {
#pragma omp parallel for schedule(static) if (static_cast<size_t>(N) * OC > PARALLEL_MIN_WORK)
    for (int c = 0; c < OC; ++c) {
      float s = 0;
      for (int n = 0; n < N; ++n) s += dout[static_cast<size_t>(n) * OC + c];
      dbias[c] += s;
    }
  }
}

}  // namespace dtrain::ops
