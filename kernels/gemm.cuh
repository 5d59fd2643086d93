// GEMMs and linear layers through cuBLASLt (fp32 compute, CUBLAS_COMPUTE_32F: no TF32),
// row-major like lib/ops/linear.h with the weight stored [OC, IC] as nn.Linear. Epilogues:
// bias, bias + GELU (tanh) storing the pre-activation for backward, and the GELU
// derivative applied to the input-gradient GEMM (DGELU) reading it back; the weight
// gradient GEMM produces the bias gradient through CUBLASLT_EPILOGUE_BGRADB. One cuBLASLt
// handle and one 32 MiB workspace per device; descriptors, layouts and the heuristic's
// algorithm are cached per (shape, dtypes, epilogue, pointer alignment). GEMMs on one
// device share its workspace: issue them from one stream at a time.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels {

/// The cuBLASLt workspace each device holds (one per device, shared by its GEMMs).
inline constexpr size_t GEMM_WORKSPACE_BYTES = 32u << 20;

/// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when trans_x (as
/// ops::gemm). A is [M,K] ([K,M] when trans_a), B is [K,N] ([N,K] when trans_b), both of
/// ab_dtype; C is c_dtype: equal to ab_dtype, or F32 with bf16/fp16 inputs. Throws
/// DeviceError when cuBLASLt has no algorithm for the combination.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, const void* B, float beta,
          void* C, DType ab_dtype, DType c_dtype, cudaStream_t stream);

/// gemm() with row pitches (elements): A's rows lda apart, B's ldb, C's ldc, each at least
/// its row width (a column block of a wider array: a fused projection's output).
void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
             int ldb, float beta, void* C, int ldc, DType ab_dtype, DType c_dtype, cudaStream_t stream);

/// out[N,OC] = inp[N,IC] @ weight^T + bias (bias may be null); all of `dtype`. Overwrites
/// out's N x OC elements, rows ld_out >= OC apart (a padded vocabulary: the logits GEMM's
/// leading dimension a multiple of 128 keeps every row 16-byte aligned); the columns past
/// OC are neither read nor written.
void linear_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC, int ld_out,
                    DType dtype, cudaStream_t stream);

/// pre_gelu = inp @ weight^T + bias; out = gelu(pre_gelu) (tanh approximation), one GEMM
/// (CUBLASLT_EPILOGUE_GELU_AUX_BIAS). bias may be null. OC must be a multiple of 8 (a
/// cuBLASLt rule for the auxiliary output), else UsageError. Backward through the next
/// layer: linear_dgelu_backward.
void linear_gelu_forward(void* out, void* pre_gelu, const void* inp, const void* weight, const void* bias, int N,
                         int IC, int OC, DType dtype, cudaStream_t stream);

/// dinp (+)= dout @ weight (`dtype`; += when accumulate_dinp, else written by the GEMM
/// with beta = 0: never read, no zeroing needed); dweight += dout^T @ inp and dbias +=
/// sum_rows(dout) (both fp32: parameter gradients stay fp32). dout's rows are ld_dout >=
/// OC apart (only OC columns read). Any output may be null to skip it. The bias gradient
/// comes from the dW GEMM's BGRADB epilogue (into an OC-float scratch added to dbias)
/// when cuBLASLt offers one for the shape, else from a deterministic column-sum kernel.
void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight,
                     int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType dtype, cudaStream_t stream);

/// The backward of a linear layer whose input was inp = gelu(pre_gelu) (pre_gelu [N, IC]
/// as linear_gelu_forward stored it): WRITES dpre = gelu'(pre_gelu) * (dout @ weight) in
/// one GEMM (CUBLASLT_EPILOGUE_DGELU: d(inp) is never stored), and dweight += dout^T @ inp,
/// dbias += sum_rows(dout) as linear_backward. IC must be a multiple of 8 (the GELU
/// input's leading dimension rule), else UsageError.
void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp,
                           const void* weight, const void* pre_gelu, int N, int IC, int OC, DType dtype,
                           cudaStream_t stream);

}  // namespace dtrain::kernels
