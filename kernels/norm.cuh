// LayerNorm and RMSNorm on the device, as lib/ops/norm.h, plus the forms fused with the
// residual add before them (residual = a + b; out = norm(residual) in one pass). Rows
// [N, C] of `dtype`; the statistics (mean, rstd) are fp32 [N]; the parameter gradients
// dweight / dbias are fp32 (accumulated deterministically: fixed row chunks, fixed-order
// sums). Backward ACCUMULATES (+=) into dinp, dweight, dbias; any may be null.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

namespace dtrain::kernels {

/// out = (inp - mean) * rstd * weight + bias (bias may be null: no bias).
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                       int N, int C, float eps, DType dtype, cudaStream_t stream);
/// residual = a + b (rounded to dtype; may alias a or b), then layernorm_forward of residual.
void residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b,
                                const void* weight, const void* bias, int N, int C, float eps, DType dtype,
                                cudaStream_t stream);
void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight,
                        const float* mean, const float* rstd, int N, int C, DType dtype, cudaStream_t stream);

/// out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps).
void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C, float eps, DType dtype,
                     cudaStream_t stream);
/// residual = a + b (rounded to dtype; may alias a or b), then rmsnorm_forward of residual.
void residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* weight,
                              int N, int C, float eps, DType dtype, cudaStream_t stream);
void rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp, const void* weight,
                      const float* rstd, int N, int C, DType dtype, cudaStream_t stream);

}  // namespace dtrain::kernels
