// Inverted dropout with the counter-based mask of core/dropout_mask.h: no mask is stored,
// backward redraws it from the seed (the same mask as the CPU op).
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::kernels {

/// out[i] = keep(seed, i, p) ? inp[i] / (1 - p) : 0. out may not alias inp.
void dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType dtype, cudaStream_t stream);
/// dinp[i] += keep(seed, i, p) ? dout[i] / (1 - p) : 0.
void dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType dtype, cudaStream_t stream);

}  // namespace dtrain::kernels
