// GELU, SwiGLU and residual add: elementwise loops, threaded above PARALLEL_MIN_WORK and
// vectorised (simd.h: the tanh / sigmoid are built on a vectorisable expf). Elements are
// independent, so any thread count gives the same bits.
#include "ops/activation.h"

#include "core/check.h"
#include "ops/parallel.h"
#include "ops/simd.h"

namespace dtrain::ops {

namespace {
constexpr float GELU_K = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float GELU_C = 0.044715f;

DT_OPS_SIMD void gelu_fwd_range(float* __restrict out, const float* __restrict inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + simd::tanh(GELU_K * (x + GELU_C * x * x * x)));
  }
}

// dinp may alias dout (one read and one write of the same element per iteration).
DT_OPS_SIMD void gelu_bwd_range(float* dinp, const float* __restrict inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float th = simd::tanh(GELU_K * (x + GELU_C * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    dinp[i] = g * dout[i];
  }
}

DT_OPS_SIMD void swiglu_fwd_range(float* __restrict out, const float* __restrict gate, const float* __restrict up,
                                  size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * simd::sigmoid(g) * up[i];
  }
}

DT_OPS_SIMD void swiglu_bwd_range(float* __restrict dgate, float* __restrict dup, const float* __restrict dout,
                                  const float* __restrict gate, const float* __restrict up, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = simd::sigmoid(g);
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dout[i] * (g * s);
  }
}

DT_OPS_SIMD void add_range(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  parallel_for(n, n * 8, [&](size_t b, size_t e) { gelu_fwd_range(out + b, inp + b, e - b); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  parallel_for(n, n * 8, [&](size_t b, size_t e) { gelu_bwd_range(dinp + b, inp + b, dout + b, e - b); });
}

void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
  parallel_for(n, n * 8, [&](size_t b, size_t e) { swiglu_fwd_range(out + b, gate + b, up + b, e - b); });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
  parallel_for(n, n * 8,
               [&](size_t b, size_t e) { swiglu_bwd_range(dgate + b, dup + b, dout + b, gate + b, up + b, e - b); });
}

void swiglu_forward(float* out, const float* gate, const float* up, size_t rows, size_t cols, size_t ld) {
  DT_ENFORCE(ld >= cols, UsageError, "swiglu: the input row pitch {} is below the row width {}", ld, cols);
  if (ld == cols) return swiglu_forward(out, gate, up, rows * cols);
  parallel_for(rows, rows * cols * 8, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) swiglu_fwd_range(out + r * cols, gate + r * ld, up + r * ld, cols);
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t rows,
                     size_t cols, size_t ld) {
  DT_ENFORCE(ld >= cols, UsageError, "swiglu: the input row pitch {} is below the row width {}", ld, cols);
  if (ld == cols) return swiglu_backward(dgate, dup, dout, gate, up, rows * cols);
  parallel_for(rows, rows * cols * 8, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r)
      swiglu_bwd_range(dgate + r * ld, dup + r * ld, dout + r * cols, gate + r * ld, up + r * ld, cols);
  });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  parallel_for(n, n, [&](size_t s, size_t e) { add_range(out + s, a + s, b + s, e - s); });
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  parallel_for(n, n, [&](size_t s, size_t e) {
    add_range(da + s, da + s, dout + s, e - s);
    add_range(db + s, db + s, dout + s, e - s);
  });
}

}  // namespace dtrain::ops
