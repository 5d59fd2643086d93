// LayerNorm (weight, bias) and RMSNorm (weight) over the last dimension of [N, C] rows
// (N = B*T). Forward saves the per-row statistics backward needs (mean/rstd, rstd).
// Backward ACCUMULATES (+=) into dinp, dweight and dbias (any may be null to skip it).
#pragma once

namespace dtrain::ops {

/// out = (inp - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps) (biased variance,
/// like torch.nn.LayerNorm). mean and rstd are [N].
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

/// residual = a + b, then layernorm_forward of residual in the same row pass (the
/// residual stream's add fused with the next block's norm). residual may alias a or b.
void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C, float eps);
/// out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps) (HF LlamaRMSNorm). rstd is [N].
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
/// residual = a + b, then rmsnorm_forward of residual in the same row pass.
void residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* a, const float* b,
                              const float* weight, int N, int C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);

}  // namespace dtrain::ops
