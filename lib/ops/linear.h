// Linear layers through OpenBLAS: out[N,OC] = inp[N,IC] @ W^T (+ bias), W stored
// [OC, IC] like torch.nn.Linear (HF weights load without transposes). Backward
// ACCUMULATES (+=) into dinp, dweight and dbias; pass null for any of them to skip that
// GEMM (frozen base weights under LoRA skip the dW GEMM).
#pragma once

namespace dtrain::ops {

/// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when trans_x.
/// A is [M,K] ([K,M] when trans_a); B is [K,N] ([N,K] when trans_b).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          const float* B, float beta, float* C);

/// out = inp @ weight^T + bias (bias may be null). Overwrites out.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC);
/// dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_rows(dout).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int IC, int OC);

}  // namespace dtrain::ops
