// GELU, SwiGLU and residual add: elementwise loops, threaded above PARALLEL_MIN_WORK.
#include "ops/activation.h"

#include "ops/parallel.h"

#include <cmath>

namespace dtrain::ops {

namespace {
constexpr float GELU_K = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float GELU_C = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  parallel_for(n, n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::tanh(GELU_K * (x + GELU_C * x * x * x)));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  parallel_for(n, n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float x = inp[i];
      float u = GELU_K * (x + GELU_C * x * x * x);
      float th = std::tanh(u);
      float sech2 = 1.0f - th * th;
      float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
      dinp[i] = g * dout[i];
    }
  });
}

void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
  parallel_for(n, n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, size_t n) {
  parallel_for(n, n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float g = gate[i];
      float s = 1.0f / (1.0f + std::exp(-g));
      float silu = g * s;
      dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
      dup[i] = dout[i] * silu;
    }
  });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  parallel_for(n, n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  parallel_for(n, n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      da[i] += dout[i];
      db[i] += dout[i];
    }
  });
}

}  // namespace dtrain::ops
