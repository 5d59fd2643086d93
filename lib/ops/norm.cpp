// LayerNorm / RMSNorm, plain and fused with the residual add before them. Row loops are
// split over the ops pool; row sums run in simd::LANES interleaved fp32 partial sums
// added in double in a fixed tree (vectorised, and the same bits for any thread count
// or instruction set). The weight/bias gradient reductions run as a second pass split
// over channel blocks: each block walks the rows in order (contiguous loads), so every
// channel sums its rows in a fixed order (deterministic, race-free).
#include "ops/norm.h"

#include "ops/parallel.h"
#include "ops/simd.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace dtrain::ops {

namespace {

using simd::LANES;

DT_OPS_SIMD double sum(const float* __restrict x, int C) {
  float acc[LANES] = {};
  size_t c = 0;
  const size_t n = static_cast<size_t>(C);
  for (; c + LANES <= n; c += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] += x[c + k];
  for (size_t k = 0; c + k < n; ++k) acc[k] += x[c + k];
  return simd::lanes_sum(acc);
}

// out = a + b, and returns sum(out) (the fused residual + norm's first pass). out may be
// a or b (no __restrict): each element is read before it is written.
DT_OPS_SIMD double add_sum(float* out, const float* a, const float* b, int C) {
  float acc[LANES] = {};
  size_t c = 0;
  const size_t n = static_cast<size_t>(C);
  for (; c + LANES <= n; c += LANES)
    for (size_t k = 0; k < LANES; ++k) {
      const float r = a[c + k] + b[c + k];
      out[c + k] = r;
      acc[k] += r;
    }
  for (size_t k = 0; c + k < n; ++k) {
    const float r = a[c + k] + b[c + k];
    out[c + k] = r;
    acc[k] += r;
  }
  return simd::lanes_sum(acc);
}

DT_OPS_SIMD double centered_sq_sum(const float* __restrict x, float m, int C) {
  float acc[LANES] = {};
  size_t c = 0;
  const size_t n = static_cast<size_t>(C);
  for (; c + LANES <= n; c += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] += (x[c + k] - m) * (x[c + k] - m);
  for (size_t k = 0; c + k < n; ++k) acc[k] += (x[c + k] - m) * (x[c + k] - m);
  return simd::lanes_sum(acc);
}

DT_OPS_SIMD double sq_sum(const float* __restrict x, int C) {
  float acc[LANES] = {};
  size_t c = 0;
  const size_t n = static_cast<size_t>(C);
  for (; c + LANES <= n; c += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] += x[c + k] * x[c + k];
  for (size_t k = 0; c + k < n; ++k) acc[k] += x[c + k] * x[c + k];
  return simd::lanes_sum(acc);
}

// (sum(w d), sum(w d (x - m) r)) of one row.
DT_OPS_SIMD void ln_dot(double* sd, double* sdx, const float* __restrict w, const float* __restrict d,
                        const float* __restrict x, float m, float r, int C) {
  float a[LANES] = {}, b[LANES] = {};
  size_t c = 0;
  const size_t n = static_cast<size_t>(C);
  for (; c + LANES <= n; c += LANES)
    for (size_t k = 0; k < LANES; ++k) {
      const float dn = w[c + k] * d[c + k];
      a[k] += dn;
      b[k] += dn * ((x[c + k] - m) * r);
    }
  for (size_t k = 0; c + k < n; ++k) {
    const float dn = w[c + k] * d[c + k];
    a[k] += dn;
    b[k] += dn * ((x[c + k] - m) * r);
  }
  *sd = simd::lanes_sum(a);
  *sdx = simd::lanes_sum(b);
}

// sum(w d x) of one row.
DT_OPS_SIMD double rms_dot(const float* __restrict w, const float* __restrict d, const float* __restrict x, int C) {
  float acc[LANES] = {};
  size_t c = 0;
  const size_t n = static_cast<size_t>(C);
  for (; c + LANES <= n; c += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] += (w[c + k] * d[c + k]) * x[c + k];
  for (size_t k = 0; c + k < n; ++k) acc[k] += (w[c + k] * d[c + k]) * x[c + k];
  return simd::lanes_sum(acc);
}

DT_OPS_SIMD void ln_out(float* __restrict o, const float* __restrict x, float m, float r, const float* __restrict w,
                        const float* __restrict b, int C) {
  for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * w[c] + b[c];
}

DT_OPS_SIMD void rms_out(float* __restrict o, const float* __restrict x, float r, const float* __restrict w, int C) {
  for (int c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
}

DT_OPS_SIMD void ln_dinp(float* __restrict di, const float* __restrict x, const float* __restrict d,
                         const float* __restrict w, float m, float r, float md, float mdx, int C) {
  for (int c = 0; c < C; ++c) {
    const float xhat = (x[c] - m) * r;
    di[c] += r * (w[c] * d[c] - md - xhat * mdx);
  }
}

DT_OPS_SIMD void rms_dinp(float* __restrict di, const float* __restrict x, const float* __restrict d,
                          const float* __restrict w, float r, float k, int C) {
  for (int c = 0; c < C; ++c) di[c] += r * w[c] * d[c] - x[c] * k;
}

// Channel block [c0, c1) of the weight (and bias) gradients, rows in order.
DT_OPS_SIMD void ln_dw_block(float* __restrict sw, float* __restrict sb, const float* dout, const float* inp,
                             const float* mean, const float* rstd, int N, int C, int c0, int c1) {
  const int w = c1 - c0;
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<size_t>(n) * C + c0;
    const float* x = inp + static_cast<size_t>(n) * C + c0;
    const float m = mean[n], r = rstd[n];
    for (int c = 0; c < w; ++c) {
      sw[c] += d[c] * (x[c] - m) * r;
      sb[c] += d[c];
    }
  }
}

DT_OPS_SIMD void rms_dw_block(float* __restrict sw, const float* dout, const float* inp, const float* rstd, int N,
                              int C, int c0, int c1) {
  const int w = c1 - c0;
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<size_t>(n) * C + c0;
    const float* x = inp + static_cast<size_t>(n) * C + c0;
    const float r = rstd[n];
    for (int c = 0; c < w; ++c) sw[c] += d[c] * x[c] * r;
  }
}

void ln_rows(float* out, float* mean, float* rstd, float* residual, const float* a, const float* b, const float* weight,
             const float* bias, int N, int C, float eps) {
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * C * 2, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const size_t off = n * static_cast<size_t>(C);
      const float* x = residual ? residual + off : a + off;
      const double s = residual ? add_sum(residual + off, a + off, b + off, C) : sum(x, C);
      const float mf = static_cast<float>(s / C);
      const double v = centered_sq_sum(x, mf, C) / C;
      const float r = static_cast<float>(1.0 / std::sqrt(v + eps));
      ln_out(out + off, x, mf, r, weight, bias, C);
      mean[n] = mf;
      rstd[n] = r;
    }
  });
}

void rms_rows(float* out, float* rstd, float* residual, const float* a, const float* b, const float* weight, int N,
              int C, float eps) {
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * C * 2, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const size_t off = n * static_cast<size_t>(C);
      const float* x = a + off;
      if (residual) {
        add_sum(residual + off, a + off, b + off, C);
        x = residual + off;
      }
      const float r = static_cast<float>(1.0 / std::sqrt(sq_sum(x, C) / C + eps));
      rms_out(out + off, x, r, weight, C);
      rstd[n] = r;
    }
  });
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps) {
  ln_rows(out, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C, eps);
}

void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C, float eps) {
  ln_rows(out, mean, rstd, residual, a, b, weight, bias, N, C, eps);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  const size_t work = static_cast<size_t>(N) * C * 2;
  if (dinp) {
    parallel_for(static_cast<size_t>(N), work, [&](size_t begin, size_t end) {
      for (size_t n = begin; n < end; ++n) {
        const size_t off = n * static_cast<size_t>(C);
        // dinp = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = weight * dout
        double sd, sdx;
        ln_dot(&sd, &sdx, weight, dout + off, inp + off, mean[n], rstd[n], C);
        ln_dinp(dinp + off, inp + off, dout + off, weight, mean[n], rstd[n], static_cast<float>(sd / C),
                static_cast<float>(sdx / C), C);
      }
    });
  }
  if (dweight || dbias) {
    parallel_for(static_cast<size_t>(C), work, [&](size_t begin, size_t end) {
      const int c0 = static_cast<int>(begin), c1 = static_cast<int>(end);
      std::vector<float> sw(end - begin, 0.0f), sb(end - begin, 0.0f);
      ln_dw_block(sw.data(), sb.data(), dout, inp, mean, rstd, N, C, c0, c1);
      for (int c = c0; c < c1; ++c) {
        if (dweight) dweight[c] += sw[static_cast<size_t>(c - c0)];
        if (dbias) dbias[c] += sb[static_cast<size_t>(c - c0)];
      }
    });
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  rms_rows(out, rstd, nullptr, inp, nullptr, weight, N, C, eps);
}

void residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* a, const float* b,
                              const float* weight, int N, int C, float eps) {
  rms_rows(out, rstd, residual, a, b, weight, N, C, eps);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  const size_t work = static_cast<size_t>(N) * C * 2;
  if (dinp) {
    parallel_for(static_cast<size_t>(N), work, [&](size_t begin, size_t end) {
      for (size_t n = begin; n < end; ++n) {
        const size_t off = n * static_cast<size_t>(C);
        const float r = rstd[n];
        // y = x r w; dx = r (w d) - x r^3 mean(w d x)
        const float k = static_cast<float>(rms_dot(weight, dout + off, inp + off, C) / C) * r * r * r;
        rms_dinp(dinp + off, inp + off, dout + off, weight, r, k, C);
      }
    });
  }
  if (dweight) {
    parallel_for(static_cast<size_t>(C), work, [&](size_t begin, size_t end) {
      const int c0 = static_cast<int>(begin), c1 = static_cast<int>(end);
      std::vector<float> sw(end - begin, 0.0f);
      rms_dw_block(sw.data(), dout, inp, rstd, N, C, c0, c1);
      for (int c = c0; c < c1; ++c) dweight[c] += sw[static_cast<size_t>(c - c0)];
    });
  }
}

}  // namespace dtrain::ops
