// AdamW: a two-step example recomputed independently in double, torch's first-step
// property (|dp| = lr for any non-tiny gradient), weight decay, grad_scale, and the
// fused bf16/fp16 compute copy.
#include "ops/optim.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace dtrain;
using namespace dtrain::ops;

namespace {

// Reference written from the torch.optim.AdamW documentation, all in double.
struct RefState {
  double p, m = 0, v = 0;
};
void ref_step(RefState& s, double g, double lr, double b1, double b2, double eps, double wd, int t) {
  s.p = s.p - lr * wd * s.p;
  s.m = b1 * s.m + (1 - b1) * g;
  s.v = b2 * s.v + (1 - b2) * g * g;
  const double mhat = s.m / (1 - std::pow(b1, t));
  const double vhat = s.v / (1 - std::pow(b2, t));
  s.p = s.p - lr * mhat / (std::sqrt(vhat) + eps);
}

}  // namespace

TEST_CASE("adamw two steps match a double-precision reference") {
  AdamWConfig cfg;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-6f;
  cfg.weight_decay = 0.1f;
  std::vector<float> p = {1.0f, -0.5f, 0.25f, 3.0f, 0.0f};
  const std::vector<float> g1 = {0.1f, -2.0f, 1e-4f, 0.0f, 5.0f};
  const std::vector<float> g2 = {-0.3f, -1.0f, 2e-4f, 0.7f, 5.0f};
  std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f);
  std::vector<RefState> ref;
  for (float x : p) ref.push_back(RefState{x});

  const float lr1 = 0.01f, lr2 = 0.02f;
  adamw_step(p.data(), g1.data(), m.data(), v.data(), p.size(), cfg, lr1, 1, true);
  adamw_step(p.data(), g2.data(), m.data(), v.data(), p.size(), cfg, lr2, 2, true);
  for (size_t i = 0; i < p.size(); ++i) {
    ref_step(ref[i], g1[i], lr1, 0.9, 0.95, 1e-6, 0.1, 1);
    ref_step(ref[i], g2[i], lr2, 0.9, 0.95, 1e-6, 0.1, 2);
    CHECK(p[i] == doctest::Approx(ref[i].p).epsilon(1e-6));
    CHECK(m[i] == doctest::Approx(ref[i].m).epsilon(1e-6));
    CHECK(v[i] == doctest::Approx(ref[i].v).epsilon(1e-6));
  }
}

TEST_CASE("adamw hand arithmetic for one element") {
  // p=1, g=0.5, lr=0.1, b1=0.9, b2=0.999, eps=0, wd=0.
  // step 1: m=0.05, v=0.00025, mhat=0.5, vhat=0.25 -> p = 1 - 0.1*0.5/0.5 = 0.9
  // step 2 (g=0.5): m=0.095, v=0.00049975, mhat=0.095/0.19=0.5, vhat=0.00049975/0.001999=0.25
  //   -> p = 0.9 - 0.1 = 0.8
  AdamWConfig cfg;
  cfg.eps = 0.0f;
  cfg.weight_decay = 0.0f;
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  adamw_step(&p, &g, &m, &v, 1, cfg, 0.1f, 1, false);
  CHECK(p == doctest::Approx(0.9).epsilon(1e-6));
  CHECK(m == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(v == doctest::Approx(0.00025).epsilon(1e-6));
  adamw_step(&p, &g, &m, &v, 1, cfg, 0.1f, 2, false);
  CHECK(p == doctest::Approx(0.8).epsilon(1e-6));
}

TEST_CASE("adamw first step moves every parameter by lr against the gradient sign") {
  AdamWConfig cfg;  // eps 1e-8, decay off below
  const size_t n = 1000;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    p[i] = 0.001f * static_cast<float>(i);
    g[i] = (i % 2 ? 1.0f : -1.0f) * (0.01f + static_cast<float>(i));
  }
  const std::vector<float> p0 = p;
  adamw_step(p.data(), g.data(), m.data(), v.data(), n, cfg, 1e-3f, 1, false);
  for (size_t i = 0; i < n; ++i) {
    const float dp = p[i] - p0[i];
    CHECK(std::fabs(dp) == doctest::Approx(1e-3).epsilon(1e-4));
    CHECK((dp > 0) == (g[i] < 0));
  }
}

TEST_CASE("adamw decoupled decay: zero gradient only shrinks decayed parameters") {
  AdamWConfig cfg;
  cfg.weight_decay = 0.5f;
  float p[2] = {2.0f, 2.0f}, g[2] = {0.0f, 0.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  adamw_step(p, g, m, v, 1, cfg, 0.1f, 1, true);
  adamw_step(p + 1, g + 1, m + 1, v + 1, 1, cfg, 0.1f, 1, false);
  CHECK(p[0] == doctest::Approx(2.0 * (1 - 0.1 * 0.5)));
  CHECK(p[1] == 2.0f);
}

TEST_CASE("adamw grad_scale equals pre-scaled gradients") {
  AdamWConfig cfg;
  std::vector<float> pa = {1, 2, 3}, pb = pa, ma(3, 0), va(3, 0), mb(3, 0), vb(3, 0);
  const std::vector<float> g_scaled = {1024.0f, -2048.0f, 512.0f};
  std::vector<float> g_plain;
  for (float x : g_scaled) g_plain.push_back(x / 1024.0f * 0.5f);
  for (int t = 1; t <= 3; ++t) {
    adamw_step(pa.data(), g_scaled.data(), ma.data(), va.data(), 3, cfg, 0.01f, t, true, 0.5f / 1024.0f);
    adamw_step(pb.data(), g_plain.data(), mb.data(), vb.data(), 3, cfg, 0.01f, t, true);
  }
  for (size_t i = 0; i < 3; ++i) {
    CHECK(pa[i] == doctest::Approx(pb[i]).epsilon(1e-6));
    CHECK(ma[i] == doctest::Approx(mb[i]).epsilon(1e-6));
  }
}

TEST_CASE("adamw_step_copy writes the rounded updated parameters and the same fp32 state") {
  AdamWConfig cfg;
  const size_t n = 257;
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::sin(static_cast<float>(i)) * 3.0f;
    g[i] = std::cos(static_cast<float>(i) * 0.7f);
  }
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<float> pa = p, pb = p, ma(n, 0), va(n, 0), mb(n, 0), vb(n, 0);
    std::vector<uint16_t> copy(n, 0);
    adamw_step(pa.data(), g.data(), ma.data(), va.data(), n, cfg, 0.01f, 3, true, 0.5f);
    adamw_step_copy(pb.data(), g.data(), mb.data(), vb.data(), n, cfg, 0.01f, 3, true, 0.5f, copy.data(), dt);
    for (size_t i = 0; i < n; ++i) {
      CHECK(pa[i] == pb[i]);
      CHECK(ma[i] == mb[i]);
      CHECK(va[i] == vb[i]);
      CHECK(copy[i] == (dt == DType::BF16 ? f32_to_bf16(pb[i]) : f32_to_f16(pb[i])));
    }
  }
  std::vector<uint16_t> copy(1);
  float x = 1, gx = 1, mx = 0, vx = 0;
  CHECK_THROWS_AS(adamw_step_copy(&x, &gx, &mx, &vx, 1, cfg, 0.1f, 1, true, 1.0f, copy.data(), DType::F32),
                  InternalError);
  CHECK_THROWS_AS(adamw_step(&x, &gx, &mx, &vx, 1, cfg, 0.1f, 0, true), InternalError);
}
