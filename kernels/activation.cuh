// Pointwise ops on the device: GELU (tanh approximation), SwiGLU (gate and up in separate
// arrays), residual add. Same semantics as lib/ops/activation.h: forward overwrites, GELU
// and SwiGLU backward overwrite, the residual backward ACCUMULATES (+=). All tensors are
// n elements of `dtype` (fp32/bf16/fp16), math in fp32, 16-byte accesses when every
// pointer is 16-byte aligned.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::kernels {

/// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); out may alias inp.
void gelu_forward(void* out, const void* inp, size_t n, DType dtype, cudaStream_t stream);
/// dinp = gelu'(inp) * dout (dinp may alias dout).
void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dtype, cudaStream_t stream);

/// out = gate * sigmoid(gate) * up over rows x cols: out dense, gate's and up's rows ld >=
/// cols elements apart (ld = cols: dense; the fused gate/up projection's [rows, 2 cols]
/// output passes its two column blocks with ld = 2 cols).
void swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld, DType dtype,
                    cudaStream_t stream);
/// dgate = dout * up * silu'(gate); dup = dout * silu(gate). dgate and dup must differ; their
/// rows are ld apart like gate's and up's, dout dense like out.
void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                     size_t cols, size_t ld, DType dtype, cudaStream_t stream);

/// out = a + b (out may alias a or b).
void residual_forward(void* out, const void* a, const void* b, size_t n, DType dtype, cudaStream_t stream);
/// da += dout; db += dout (da and db must differ).
void residual_backward(void* da, void* db, const void* dout, size_t n, DType dtype, cudaStream_t stream);

}  // namespace dtrain::kernels
