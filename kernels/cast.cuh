// dtype conversion on the device: fp32 <-> bf16 <-> fp16 (any pair, identity included),
// round to nearest even like core/dtype.h, 16-byte accesses when both sides allow; the
// in-place rounding of fp32 values to a 16-bit precision, and the fp32 sum of two buffers.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels {

/// out[i] = inp[i] converted from in_dtype to out_dtype, i < n (device pointers). out and
/// inp must not partially overlap; out == inp is allowed only when the dtypes are equal.
void dtype_cast(void* out, DType out_dtype, const void* inp, DType in_dtype, size_t n, cudaStream_t stream);

/// p[i] = p[i] rounded to dtype's precision (nearest even; fp16 overflows to inf), kept
/// as fp32 (n fp32 device values, in place). F32: nothing.
void dtype_round(float* p, size_t n, DType dtype, cudaStream_t stream);

/// dst[i] += src[i] over n fp32 device values (dst and src must not partially overlap).
void add_f32(float* dst, const float* src, size_t n, cudaStream_t stream);

/// p[i] *= s over n fp32 device values.
void scale_f32(float* p, size_t n, float s, cudaStream_t stream);

}  // namespace dtrain::kernels
