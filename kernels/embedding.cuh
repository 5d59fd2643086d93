// Token (+ learned position) embedding on the device, as lib/ops/embedding.h. wte, wpe
// and out are `dtype`; the parameter gradients dwte / dwpe are fp32 (every kernel keeps
// parameter gradients in fp32 so micro-batch accumulation does not round) and backward
// ACCUMULATES into them, deterministically (no atomics), parallel over positions.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace dtrain::kernels {

/// out[B,T,C] = wte[tokens[b,t]] (+ wpe[p] when wpe != nullptr, p = t, or t - doc_start[b*T + t]
/// with packed documents: device int32 [B*T], ops/attention.h's layout). A token outside
/// [0, V) cannot throw from the device: its row is written as NaN (the loss then turns
/// NaN); validate tokens on the host where it matters.
void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C, int V,
                       DType dtype, cudaStream_t stream, const int32_t* doc_start = nullptr);

/// dwte[tokens[b,t]] += dout[b,t]; dwpe[p] += dout[b,t] with p as in the forward (skipped
/// when dwpe is null; each dwpe element sums its rows in row order, then adds the sum).
/// dwte has V rows: a token outside [0, V) contributes nothing (its forward row was NaN),
/// it never writes outside the table. Each dwte row adds its positions' rows in position
/// order, as the CPU reference does (equal to it in fp32); the positions are sorted by
/// token on the device (scratch of 16 bytes per position + 1 KiB per 256 positions).
void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C, int V,
                        DType dtype, cudaStream_t stream, const int32_t* doc_start = nullptr);

}  // namespace dtrain::kernels
