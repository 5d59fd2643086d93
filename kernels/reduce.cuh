// Whole-buffer reductions for the optimizer step: the gradient sum of squares (global
// grad-norm clipping) and the inf/NaN check of the fp16 loss scaler. Both accumulate
// into a device value so several buffers are checked with one read-back per step.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels {

/// *accum += sum of x[i]^2 over n elements (accum: one device double; zero it before the
/// first buffer of a step). Deterministic: a fixed partition that depends only on n and a
/// fixed-order fp64 reduction (two kernels, scratch from the stream-ordered allocator).
/// +-inf or NaN inputs give inf/NaN, as train::grad_norm_sq.
void grad_norm_sq(double* accum, const void* x, size_t n, DType dtype, cudaStream_t stream);

/// grad_norm_sq over count fp32 buffers (x[k], n[k] elements; empty ones skipped) in that
/// order: the same double, bit for bit, as one grad_norm_sq per buffer, in two launches
/// instead of two per buffer (two more per 96 buffers).
void grad_norm_sq_multi(double* accum, const float* const* x, const size_t* n, size_t count, cudaStream_t stream);

/// Sets *flag = 1 (one device int) when any of the n values is +-inf or NaN; never clears
/// it (zero it once per step). The device form of train::has_inf_or_nan.
void has_inf_or_nan(int* flag, const void* x, size_t n, DType dtype, cudaStream_t stream);

/// The optimizer step's agreement on the device (ops/step_scale.h), one thread each:
/// red[0..2] = ops::norm_sq_pack(*sq), the form an fp32 SUM across ranks keeps exact.
void norm_sq_pack(float* red, const double* sq, cudaStream_t stream);
/// With total = red ? ops::norm_sq_unpack(red) : *sq: *sq = total and scale[0..1] =
/// ops::step_scale(total, loss_scale, max_norm) (the AdamW gradient scale, skip flag).
void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm, cudaStream_t stream);

/// *sum = ops::step_loss_sum(means, counts, n), *sum_f32 = (float)*sum; one thread.
void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n, cudaStream_t stream);

}  // namespace dtrain::kernels
