// Whole-buffer conversions and adds of the CPU device: fp32 <-> bf16/fp16 casts, rounding
// fp32 values to bf16/fp16 precision in place, and dst += src. Threaded and vectorised;
// every element is independent, so any thread count gives the same bits.
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>

namespace dtrain::ops {

/// dst[i] = src[i] converted from st to dt (round to nearest even; dst must not alias src
/// unless the types are equal).
void cast(void* dst, DType dt, const void* src, DType st, size_t n);
/// p[i] = p[i] rounded to t's precision (a no-op for fp32).
void round_to(float* p, size_t n, DType t);
/// dst[i] += src[i]
void add_inplace(float* dst, const float* src, size_t n);
/// p[i] *= s
void scale_inplace(float* p, size_t n, float s);

}  // namespace dtrain::ops
