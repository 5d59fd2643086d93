// Naive double-precision reference versions of every CPU op, plus the helpers the op
// tests use: random inputs, central finite differences (double, h = 1e-3) of a scalar
// loss L = sum(w * out) and a max-normalised error: max|got - ref| / max|ref|.
#pragma once

#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace dtrain::ops::ref {

using Vec = std::vector<double>;

inline std::vector<float> rand_floats(Rng& r, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal(0.0f, scale);
  return v;
}
inline Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
inline std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

// max|got - ref| / max(max|ref|, 1e-30)
inline double max_rel_err(const float* got, const Vec& ref) {
  double e = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e = std::max(e, std::abs(static_cast<double>(got[i]) - ref[i]));
    m = std::max(m, std::abs(ref[i]));
  }
  return e / std::max(m, 1e-30);
}
inline double max_rel_err(const std::vector<float>& got, const Vec& ref) { return max_rel_err(got.data(), ref); }

// Central differences of f at x, in double.
inline Vec fd_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-3) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = f(x);
    x[i] = x0 - h;
    double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}
inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
// Slice [off, off + n) of v.
inline Vec slice(const Vec& v, size_t off, size_t n) { return Vec(v.begin() + off, v.begin() + off + n); }
inline Vec concat(std::initializer_list<Vec> parts) {
  Vec out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---------------------------------------------------------------------------
inline Vec embedding(const std::vector<int32_t>& tok, const Vec& wte, const Vec* wpe, int B, int T, int C) {
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + (wpe ? (*wpe)[t * C + c] : 0.0);
  return out;
}

inline Vec layernorm(const Vec& x, const Vec& w, const Vec& bias, int N, int C, double eps) {
  Vec out(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + eps) * w[c] + bias[c];
  }
  return out;
}

inline Vec rmsnorm(const Vec& x, const Vec& w, int N, int C, double eps) {
  Vec out(x.size());
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int c = 0; c < C; ++c) s += x[n * C + c] * x[n * C + c];
    double r = 1.0 / std::sqrt(s / C + eps);
    for (int c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] * r * w[c];
  }
  return out;
}

// HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1).
inline Vec rope(const Vec& x, int B, int T, int H, int HD, double theta) {
  Vec out(x.size());
  int half = HD / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < HD; ++i) {
          int j = i % half;
          double a = t * std::pow(theta, -2.0 * j / HD);
          size_t base = ((static_cast<size_t>(b) * T + t) * H + h) * HD;
          double rot = i < half ? -x[base + i + half] : x[base + i - half];
          out[base + i] = x[base + i] * std::cos(a) + rot * std::sin(a);
        }
  return out;
}

inline Vec attention(const Vec& q, const Vec& k, const Vec& v, int B, int T, int NH, int NKV, int HD) {
  Vec out(q.size());
  int G = NH / NKV;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        int kh = h / G;
        Vec s(t + 1);
        double mx = -1e300;
        for (int t2 = 0; t2 <= t; ++t2) {
          double d = 0;
          for (int i = 0; i < HD; ++i) d += q[((b * T + t) * NH + h) * HD + i] * k[((b * T + t2) * NKV + kh) * HD + i];
          s[t2] = d / std::sqrt(static_cast<double>(HD));
          mx = std::max(mx, s[t2]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (int i = 0; i < HD; ++i) {
          double o = 0;
          for (int t2 = 0; t2 <= t; ++t2) o += s[t2] / z * v[((b * T + t2) * NKV + kh) * HD + i];
          out[((b * T + t) * NH + h) * HD + i] = o;
        }
      }
  return out;
}

inline Vec gelu(const Vec& x) {
  Vec o(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    o[i] = 0.5 * x[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return o;
}

inline Vec swiglu(const Vec& g, const Vec& u) {
  Vec o(g.size());
  for (size_t i = 0; i < g.size(); ++i) o[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return o;
}

// out[N,OC] = x[N,IC] @ W[OC,IC]^T + b
inline Vec linear(const Vec& x, const Vec& W, const Vec* b, int N, int IC, int OC) {
  Vec o(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int oc = 0; oc < OC; ++oc) {
      double s = b ? (*b)[oc] : 0.0;
      for (int ic = 0; ic < IC; ++ic) s += x[n * IC + ic] * W[oc * IC + ic];
      o[n * OC + oc] = s;
    }
  return o;
}

// Per-row losses (0 for ignored rows); returns the mean over unmasked rows.
inline double cross_entropy(const Vec& logits, const std::vector<int32_t>& tgt, int N, int V, Vec* losses = nullptr,
                            int32_t ignore = -100) {
  double sum = 0;
  int cnt = 0;
  if (losses) losses->assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    if (tgt[n] == ignore) continue;
    double mx = -1e300;
    for (int i = 0; i < V; ++i) mx = std::max(mx, logits[n * V + i]);
    double z = 0;
    for (int i = 0; i < V; ++i) z += std::exp(logits[n * V + i] - mx);
    double l = std::log(z) + mx - logits[n * V + tgt[n]];
    if (losses) (*losses)[n] = l;
    sum += l;
    ++cnt;
  }
  return cnt ? sum / cnt : 0.0;
}

}  // namespace dtrain::ops::ref
