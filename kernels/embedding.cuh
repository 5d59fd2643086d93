// Token (+ learned position) embedding on the device, as lib/ops/embedding.h. wte, wpe
// and out are `dtype`; the parameter gradients dwte / dwpe are fp32 (every kernel keeps
// parameter gradients in fp32 so micro-batch accumulation does not round) and backward
// ACCUMULATES into them, deterministically (no atomics).
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace dtrain::kernels {

/// out[B,T,C] = wte[tokens[b,t]] (+ wpe[t] when wpe != nullptr). A token outside [0, V)
/// cannot throw from the device: its row is written as NaN (the loss then turns NaN);
/// validate tokens on the host where it matters.
void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                       int T, int C, int V, DType dtype, cudaStream_t stream);

/// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t] (skipped when dwpe is null).
/// dwte has V rows: a token outside [0, V) contributes nothing (its forward row was NaN),
/// it never writes outside the table.
void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B,
                        int T, int C, int V, DType dtype, cudaStream_t stream);

}  // namespace dtrain::kernels
