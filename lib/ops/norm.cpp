// LayerNorm / RMSNorm. Row statistics are accumulated in double (cheap, and keeps the
// reference close to exact); the weight/bias gradient reductions run as a second pass
// parallel over channels so every channel sums its rows in a fixed order (deterministic,
// race-free).
#include "ops/norm.h"

#include "ops/parallel.h"

#include <cmath>
#include <cstddef>

namespace dtrain::ops {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps) {
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * C, [&](size_t begin, size_t end) {
    for (int n = static_cast<int>(begin); n < static_cast<int>(end); ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      double s = 0;
      for (int c = 0; c < C; ++c) s += x[c];
      double m = s / C;
      double v = 0;
      for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
      v /= C;
      float r = static_cast<float>(1.0 / std::sqrt(v + eps));
      float mf = static_cast<float>(m);
      float* o = out + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) o[c] = (x[c] - mf) * r * weight[c] + bias[c];
      mean[n] = mf;
      rstd[n] = r;
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
  const size_t work = static_cast<size_t>(N) * C;
  if (dinp) {
    parallel_for(static_cast<size_t>(N), work, [&](size_t begin, size_t end) {
      for (int n = static_cast<int>(begin); n < static_cast<int>(end); ++n) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* d = dout + static_cast<size_t>(n) * C;
        float m = mean[n], r = rstd[n];
        // dinp = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = weight * dout
        double sd = 0, sdx = 0;
        for (int c = 0; c < C; ++c) {
          float dn = weight[c] * d[c];
          sd += dn;
          sdx += static_cast<double>(dn) * ((x[c] - m) * r);
        }
        float md = static_cast<float>(sd / C), mdx = static_cast<float>(sdx / C);
        float* di = dinp + static_cast<size_t>(n) * C;
        for (int c = 0; c < C; ++c) {
          float xhat = (x[c] - m) * r;
          di[c] += r * (weight[c] * d[c] - md - xhat * mdx);
        }
      }
    });
  }
  if (dweight || dbias) {
    parallel_for(static_cast<size_t>(C), work, [&](size_t begin, size_t end) {
      for (int c = static_cast<int>(begin); c < static_cast<int>(end); ++c) {
        float sw = 0, sb = 0;
        for (int n = 0; n < N; ++n) {
          float d = dout[static_cast<size_t>(n) * C + c];
          sw += d * (inp[static_cast<size_t>(n) * C + c] - mean[n]) * rstd[n];
          sb += d;
        }
        if (dweight) dweight[c] += sw;
        if (dbias) dbias[c] += sb;
      }
    });
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                     int C, float eps) {
  parallel_for(static_cast<size_t>(N), static_cast<size_t>(N) * C, [&](size_t begin, size_t end) {
    for (int n = static_cast<int>(begin); n < static_cast<int>(end); ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      double s = 0;
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[c]) * x[c];
      float r = static_cast<float>(1.0 / std::sqrt(s / C + eps));
      float* o = out + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
      rstd[n] = r;
    }
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  const size_t work = static_cast<size_t>(N) * C;
  if (dinp) {
    parallel_for(static_cast<size_t>(N), work, [&](size_t begin, size_t end) {
      for (int n = static_cast<int>(begin); n < static_cast<int>(end); ++n) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* d = dout + static_cast<size_t>(n) * C;
        float r = rstd[n];
        // y = x r w; dx = r (w d) - x r^3 mean(w d x)
        double s = 0;
        for (int c = 0; c < C; ++c) s += static_cast<double>(weight[c] * d[c]) * x[c];
        float k = static_cast<float>(s / C) * r * r * r;
        float* di = dinp + static_cast<size_t>(n) * C;
        for (int c = 0; c < C; ++c) di[c] += r * weight[c] * d[c] - x[c] * k;
      }
    });
  }
  if (dweight) {
    parallel_for(static_cast<size_t>(C), work, [&](size_t begin, size_t end) {
      for (int c = static_cast<int>(begin); c < static_cast<int>(end); ++c) {
        float sw = 0;
        for (int n = 0; n < N; ++n)
          sw += dout[static_cast<size_t>(n) * C + c] * inp[static_cast<size_t>(n) * C + c] * rstd[n];
        dweight[c] += sw;
      }
    });
  }
}

}  // namespace dtrain::ops
