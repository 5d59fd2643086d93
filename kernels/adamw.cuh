// AdamW on the device: the fused update of the fp32 master weights and moments, and the
// variant that also writes the bf16/fp16 compute copy in the same pass. Same math and
// same per-step scalars (computed once in double on the host) as train/adamw.h.
#pragma once

#include "core/dtype.h"
#include "ops/optim.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::kernels {

/// ops::adamw_step on device pointers (param, grad, m, v: n fp32 each). Throws
/// InternalError when step < 1 and ConfigError for betas outside [0, 1). With
/// dev_scale (5 floats of device memory: ops::step_scale's [grad scale, skip], then
/// ops::adamw_step_values for this lr and step) the kernel reads the gradient scale and
/// the lr-dependent values there instead of from the arguments, and writes nothing when
/// dev_scale[1] != 0: clipping and the overflow skip are decided on the device, and a
/// captured step replays with each step's lr.
void adamw_step(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg, float lr,
                int64_t step, bool decay, float grad_scale, cudaStream_t stream, const float* dev_scale = nullptr);

/// ops::adamw_step_copy: also stores the updated parameters, rounded to nearest even,
/// into compute_copy (n elements of compute_dtype: BF16 or F16, else InternalError).
void adamw_step_copy(float* param, const float* grad, float* m, float* v, size_t n, const ops::AdamWConfig& cfg,
                     float lr, int64_t step, bool decay, float grad_scale, void* compute_copy, DType compute_dtype,
                     cudaStream_t stream, const float* dev_scale = nullptr);

/// adamw_step / adamw_step_copy over many tensors in few launches: the tensors go to the
/// kernel as a table in its parameters (up to ADAMW_MULTI_MAX per launch, tensors with a
/// compute copy and without in separate launches); each block updates one 4096-element
/// chunk of one tensor. The same element math as the per-tensor kernel, so the results
/// are bit for bit those of one adamw_step(_copy) per tensor. A tensor's copy (when not
/// null) is of compute_dtype, which must then be BF16 or F16.
void adamw_step_multi(const ops::AdamWTensor* tensors, size_t count, const ops::AdamWConfig& cfg, float lr,
                      int64_t step, float grad_scale, DType compute_dtype, cudaStream_t stream,
                      const float* dev_scale = nullptr);

/// Tensors per adamw_step_multi launch (the table must fit the 4 KB of kernel parameters
/// every architecture takes).
constexpr int ADAMW_MULTI_MAX = 36;

}  // namespace dtrain::kernels
