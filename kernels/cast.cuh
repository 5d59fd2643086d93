// dtype conversion on the device: fp32 <-> bf16 <-> fp16 (any pair, identity included),
// round to nearest even like core/dtype.h, 16-byte accesses when both sides allow.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels {

/// out[i] = inp[i] converted from in_dtype to out_dtype, i < n (device pointers). out and
/// inp must not partially overlap; out == inp is allowed only when the dtypes are equal.
void dtype_cast(void* out, DType out_dtype, const void* inp, DType in_dtype, size_t n,
                cudaStream_t stream);

}  // namespace dtrain::kernels
