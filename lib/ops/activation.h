// Pointwise ops: GELU (GPT-2's tanh approximation), SwiGLU (out = silu(gate) * up with
// gate and up in SEPARATE arrays, matching HF Llama's separate gate_proj / up_proj) and
// the residual add. SwiGLU also reads (and writes) its gate and up as the column blocks of
// one fused array. GELU and SwiGLU backward WRITE their gradients (each is the only
// producer of its input's gradient); the residual backward ACCUMULATES (+=).
#pragma once

#include <cstddef>

namespace dtrain::ops {

/// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, size_t n);
/// dinp = gelu'(inp) * dout (dinp may alias dout).
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

/// out = gate * sigmoid(gate) * up
void swiglu_forward(float* out, const float* gate, const float* up, size_t n);
/// dgate = dout * up * silu'(gate); dup = dout * silu(gate).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n);
/// The same over rows: out [rows, cols] dense; gate and up (dgate and dup) have their rows ld
/// >= cols elements apart (the fused gate/up projection's [rows, 2 cols] output passes its
/// two column blocks with ld = 2 cols); dout dense like out.
void swiglu_forward(float* out, const float* gate, const float* up, size_t rows, size_t cols, size_t ld);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t rows,
                     size_t cols, size_t ld);

/// out = a + b (out may alias a or b).
void residual_forward(float* out, const float* a, const float* b, size_t n);
/// da += dout; db += dout.
void residual_backward(float* da, float* db, const float* dout, size_t n);

}  // namespace dtrain::ops
