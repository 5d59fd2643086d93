// LayerNorm and RMSNorm: forward vs the double reference (max-normalised error <= 1e-5),
// backward (dinp, dweight, dbias) vs central finite differences of the double reference
// (h = 1e-3, error <= 1e-3), saved statistics, gradient accumulation, a large-row case that
// takes the OpenMP path. (C=1 RMSNorm and C<=2 LayerNorm are left out: their input
// gradients are analytically ~0, so a relative error is meaningless there.)
#include "ops/norm.h"

#include "reference.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::ops;

namespace {
void check_layernorm(int N, int C, uint64_t seed) {
  const float eps = 1e-5f;
  Rng r(seed);
  auto x = ref::rand_floats(r, N * C, 2.0f), w = ref::rand_floats(r, C), b = ref::rand_floats(r, C);
  for (auto& v : x) v += 1.5f;  // non-zero mean
  auto dout = ref::rand_floats(r, N * C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  CHECK(ref::max_rel_err(out, ref::layernorm(ref::to_double(x), ref::to_double(w), ref::to_double(b), N, C, eps)) <=
        1e-5);

  auto loss = [&](const ref::Vec& p) {
    return ref::dot(
        ref::layernorm(ref::slice(p, 0, N * C), ref::slice(p, N * C, C), ref::slice(p, N * C + C, C), N, C, eps),
        ref::to_double(dout));
  };
  auto g = ref::fd_grad(loss, ref::concat({ref::to_double(x), ref::to_double(w), ref::to_double(b)}));
  std::vector<float> dx(N * C), dw(C), db(C);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  CHECK(ref::max_rel_err(dx, ref::slice(g, 0, N * C)) <= 1e-3);
  CHECK(ref::max_rel_err(dw, ref::slice(g, N * C, C)) <= 1e-3);
  CHECK(ref::max_rel_err(db, ref::slice(g, N * C + C, C)) <= 1e-3);
  auto dx1 = dx, dw1 = dw, db1 = db;
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) CHECK(dx[i] == 2 * dx1[i]);
  for (int i = 0; i < C; ++i) {
    CHECK(dw[i] == 2 * dw1[i]);
    CHECK(db[i] == 2 * db1[i]);
  }
}

void check_rmsnorm(int N, int C, uint64_t seed) {
  const float eps = 1e-6f;
  Rng r(seed);
  auto x = ref::rand_floats(r, N * C, 2.0f), w = ref::rand_floats(r, C), dout = ref::rand_floats(r, N * C);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  CHECK(ref::max_rel_err(out, ref::rmsnorm(ref::to_double(x), ref::to_double(w), N, C, eps)) <= 1e-5);
  auto loss = [&](const ref::Vec& p) {
    return ref::dot(ref::rmsnorm(ref::slice(p, 0, N * C), ref::slice(p, N * C, C), N, C, eps), ref::to_double(dout));
  };
  auto g = ref::fd_grad(loss, ref::concat({ref::to_double(x), ref::to_double(w)}));
  std::vector<float> dx(N * C), dw(C);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  CHECK(ref::max_rel_err(dx, ref::slice(g, 0, N * C)) <= 1e-3);
  CHECK(ref::max_rel_err(dw, ref::slice(g, N * C, C)) <= 1e-3);
  auto dx1 = dx, dw1 = dw;
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) CHECK(dx[i] == 2 * dx1[i]);
  for (int i = 0; i < C; ++i) CHECK(dw[i] == 2 * dw1[i]);
}
}  // namespace

TEST_CASE("layernorm forward/backward, odd sizes (N=14, C=12) and tiny C") {
  check_layernorm(14, 12, 1);
  check_layernorm(3, 3, 2);
  check_layernorm(5, 5, 3);
}

TEST_CASE("rmsnorm forward/backward, odd sizes (N=14, C=12) and tiny C") {
  check_rmsnorm(14, 12, 4);
  check_rmsnorm(3, 2, 5);
  check_rmsnorm(5, 3, 6);
}

TEST_CASE("norms on rows large enough to run threaded match the reference") {
  const int N = 96, C = 512;  // N*C above PARALLEL_MIN_WORK
  Rng r(7);
  auto x = ref::rand_floats(r, N * C), w = ref::rand_floats(r, C), b = ref::rand_floats(r, C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  CHECK(ref::max_rel_err(out, ref::layernorm(ref::to_double(x), ref::to_double(w), ref::to_double(b), N, C, 1e-5)) <=
        1e-5);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  CHECK(ref::max_rel_err(out, ref::rmsnorm(ref::to_double(x), ref::to_double(w), N, C, 1e-5)) <= 1e-5);
  // the saved rstd is 1/sqrt(mean(x^2) + eps)
  double s = 0;
  for (int c = 0; c < C; ++c) s += double(x[c]) * x[c];
  CHECK(rstd[0] == doctest::Approx(1.0 / std::sqrt(s / C + 1e-5)).epsilon(1e-6));
}

TEST_CASE("residual + norm fused equals the residual add followed by the norm, bit for bit") {
  for (int C : {7, 64, 771}) {
    const int N = 37;
    Rng r(90 + C);
    auto a = ref::rand_floats(r, N * C), b = ref::rand_floats(r, N * C), w = ref::rand_floats(r, C),
         bias = ref::rand_floats(r, C);
    std::vector<float> res(N * C), out(N * C), mean(N), rstd(N), res2(N * C), out2(N * C), mean2(N), rstd2(N);
    residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                               bias.data(), N, C, 1e-5f);
    for (int i = 0; i < N * C; ++i) res2[i] = a[i] + b[i];
    layernorm_forward(out2.data(), mean2.data(), rstd2.data(), res2.data(), w.data(), bias.data(), N, C, 1e-5f);
    CHECK(res == res2);
    CHECK(out == out2);
    CHECK(mean == mean2);
    CHECK(rstd == rstd2);
    residual_rmsnorm_forward(res.data(), out.data(), rstd.data(), a.data(), b.data(), w.data(), N, C, 1e-6f);
    rmsnorm_forward(out2.data(), rstd2.data(), res2.data(), w.data(), N, C, 1e-6f);
    CHECK(res == res2);
    CHECK(out == out2);
    CHECK(rstd == rstd2);
    // In place over the first input, as the model's residual stream uses it.
    auto a3 = a;
    residual_rmsnorm_forward(a3.data(), out.data(), rstd.data(), a3.data(), b.data(), w.data(), N, C, 1e-6f);
    CHECK(a3 == res2);
    CHECK(out == out2);
  }
}
