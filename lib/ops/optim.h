// The optimizer's element loops on the host: AdamW with decoupled weight decay, exactly
// as torch.optim.AdamW (amsgrad off, maximize off): one fused, vectorisable pass over a flat fp32 shard of parameters,
// optionally writing the bf16/fp16 compute copy of the updated parameters as well, and
// the gradient sum of squares for global-norm clipping.
#pragma once

#include "core/dtype.h"
#include "core/op_params.h"

#include <cstddef>
#include <cstdint>

namespace dtrain::ops {

using dtrain::AdamWConfig;
using dtrain::AdamWTensor;

/// One AdamW update of n elements, in place on param, m (exp_avg) and v (exp_avg_sq):
///   g  = grad * grad_scale
///   p -= lr * wd * p                          (only when decay)
///   m  = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
///   p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
/// `step` is 1-based (the number of updates including this one) and drives the bias
/// correction; `grad_scale` folds loss-scale unscaling and the clip coefficient in.
/// The config's lr is ignored in favour of `lr` (the scheduled value).
void adamw_step(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                int64_t step, bool decay, float grad_scale = 1.0f);

/// adamw_step that also stores the updated parameters, rounded to nearest even, into
/// compute_copy (n elements of compute_dtype, which must be BF16 or F16) in the same pass.
void adamw_step_copy(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                     int64_t step, bool decay, float grad_scale, uint16_t* compute_copy, DType compute_dtype);

/// Sum of squares of n fp32 gradients, accumulated in double. +-inf or NaN inputs give
/// inf/NaN, which the caller treats as an overflow.
double grad_norm_sq(const float* g, size_t n);

}  // namespace dtrain::ops
