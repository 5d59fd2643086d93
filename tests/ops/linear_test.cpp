// linear through OpenBLAS: forward vs double reference (<= 1e-5) with and without bias,
// backward dinp/dW/dbias vs central finite differences (<= 1e-3), null gradients skip
// their GEMM, accumulation (dinp written or accumulated as asked), padded output / dout
// rows, and the generic gemm() in every transpose combination, also split into row
// blocks over several threads; the fused linear + GELU against the two ops in sequence.
#include "ops/linear.h"

#include "core/error.h"
#include "ops/activation.h"
#include "ops/parallel.h"
#include "reference.h"

#include <doctest/doctest.h>

#include <tuple>
#include <utility>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("linear forward/backward, odd sizes (N=14, IC=12, OC=5)") {
  const int N = 14, IC = 12, OC = 5;
  Rng r(51);
  auto x = ref::rand_floats(r, N * IC), W = ref::rand_floats(r, OC * IC), b = ref::rand_floats(r, OC);
  auto dout = ref::rand_floats(r, N * OC);
  for (bool with_bias : {true, false}) {
    std::vector<float> out(N * OC, 123.0f);  // forward must overwrite
    linear_forward(out.data(), x.data(), W.data(), with_bias ? b.data() : nullptr, N, IC, OC, OC);
    ref::Vec bd = ref::to_double(b);
    CHECK(ref::max_rel_err(
              out, ref::linear(ref::to_double(x), ref::to_double(W), with_bias ? &bd : nullptr, N, IC, OC)) <= 1e-5);
  }
  auto loss = [&](const ref::Vec& p) {
    ref::Vec bb = ref::slice(p, N * IC + OC * IC, OC);
    return ref::dot(ref::linear(ref::slice(p, 0, N * IC), ref::slice(p, N * IC, OC * IC), &bb, N, IC, OC),
                    ref::to_double(dout));
  };
  auto g = ref::fd_grad(loss, ref::concat({ref::to_double(x), ref::to_double(W), ref::to_double(b)}));
  std::vector<float> dx(N * IC, NAN), dW(OC * IC), db(OC);  // dx written: its NaNs are never read
  linear_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, IC, OC, OC, false);
  CHECK(ref::max_rel_err(dx, ref::slice(g, 0, N * IC)) <= 1e-3);
  CHECK(ref::max_rel_err(dW, ref::slice(g, N * IC, OC * IC)) <= 1e-3);
  CHECK(ref::max_rel_err(db, ref::slice(g, N * IC + OC * IC, OC)) <= 1e-3);
  auto dx1 = dx, dW1 = dW, db1 = db;
  linear_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, IC, OC, OC, true);
  for (int i = 0; i < N * IC; ++i) CHECK(dx[i] == doctest::Approx(2 * dx1[i]).epsilon(1e-6));
  for (int i = 0; i < OC * IC; ++i) CHECK(dW[i] == doctest::Approx(2 * dW1[i]).epsilon(1e-6));
  for (int i = 0; i < OC; ++i) CHECK(db[i] == doctest::Approx(2 * db1[i]).epsilon(1e-6));
  // null dW / dbias: only dinp is touched
  std::vector<float> dx2(N * IC, NAN);
  linear_backward(dx2.data(), nullptr, nullptr, dout.data(), x.data(), W.data(), N, IC, OC, OC, false);
  CHECK(ref::max_rel_err(dx2, ref::slice(g, 0, N * IC)) <= 1e-3);
  // written again: the same values, not twice them
  linear_backward(dx2.data(), nullptr, nullptr, dout.data(), x.data(), W.data(), N, IC, OC, OC, false);
  for (int i = 0; i < N * IC; ++i) CHECK(dx2[i] == dx1[i]);
}

TEST_CASE("linear with padded rows (a logits pitch past OC): the same numbers, the padding untouched and unread") {
  const int N = 37, IC = 12, OC = 11, ld = 16;  // N > 16: several row blocks
  Rng r(54);
  auto x = ref::rand_floats(r, N * IC), W = ref::rand_floats(r, OC * IC), b = ref::rand_floats(r, OC);
  auto dout = ref::rand_floats(r, N * OC);
  std::vector<float> out(N * OC), out_p(N * ld, NAN);
  linear_forward(out.data(), x.data(), W.data(), b.data(), N, IC, OC, OC);
  linear_forward(out_p.data(), x.data(), W.data(), b.data(), N, IC, OC, ld);
  std::vector<float> dout_p(N * ld, NAN);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < ld; ++c) {
      if (c < OC) CHECK(out_p[n * ld + c] == out[n * OC + c]);
      else CHECK(std::isnan(out_p[n * ld + c]));
      if (c < OC) dout_p[n * ld + c] = dout[n * OC + c];
    }
  std::vector<float> dx(N * IC), dW(OC * IC, 0.5f), db(OC, 0.25f), dx_p(N * IC), dW_p = dW, db_p = db;
  linear_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, IC, OC, OC, false);
  linear_backward(dx_p.data(), dW_p.data(), db_p.data(), dout_p.data(), x.data(), W.data(), N, IC, OC, ld, false);
  CHECK(dx_p == dx);
  CHECK(dW_p == dW);
  CHECK(db_p == db);
  CHECK_THROWS_AS(linear_forward(out.data(), x.data(), W.data(), b.data(), N, IC, OC, OC - 1), UsageError);
}

TEST_CASE("gemm handles every transpose combination, alpha and beta") {
  const int M = 3, N = 5, K = 4;
  Rng r(52);
  auto A = ref::rand_floats(r, M * K), Bm = ref::rand_floats(r, K * N), C0 = ref::rand_floats(r, M * N);
  // transposed copies
  std::vector<float> At(K * M), Bt(N * K);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) At[k * M + i] = A[i * K + k];
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) Bt[j * K + k] = Bm[k * N + j];
  ref::Vec expect(M * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(A[i * K + k]) * Bm[k * N + j];
      expect[i * N + j] = 0.5 * s + 2.0 * C0[i * N + j];
    }
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      auto C = C0;
      gemm(ta, tb, M, N, K, 0.5f, ta ? At.data() : A.data(), tb ? Bt.data() : Bm.data(), 2.0f, C.data());
      CHECK(ref::max_rel_err(C, expect) <= 1e-6);
    }
}

TEST_CASE("threaded gemm (row or column blocks over the pool) in every transpose combination") {
  // M > N splits rows, M < N splits columns; neither a multiple of the 16-wide block.
  for (auto [M, N] : {std::pair{203, 97}, std::pair{97, 203}}) {
    CAPTURE(M);
    const int K = 130;
    Rng r(53 + M);
    auto A = ref::rand_floats(r, M * K), Bm = ref::rand_floats(r, K * N), C0 = ref::rand_floats(r, M * N);
    std::vector<float> At(K * M), Bt(N * K);
    for (int i = 0; i < M; ++i)
      for (int k = 0; k < K; ++k) At[k * M + i] = A[i * K + k];
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < N; ++j) Bt[j * K + k] = Bm[k * N + j];
    ref::Vec expect(M * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k) s += double(A[i * K + k]) * Bm[k * N + j];
        expect[i * N + j] = s + 0.5 * C0[i * N + j];
      }
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          auto C = C0;
          gemm(ta, tb, M, N, K, 1.0f, ta ? At.data() : A.data(), tb ? Bt.data() : Bm.data(), 0.5f, C.data());
          CHECK(ref::max_rel_err(C, expect) <= 1e-5);
        }
    }
  }
  set_num_threads(2);
}

TEST_CASE("linear + GELU fused equals linear then GELU, forward and backward, bit for bit") {
  // Sizes large enough to go threaded: (70, 24, 96) splits the forward by columns (OC >
  // N) and the backward by rows (N > IC); (40, 300, 200) splits both by columns.
  for (auto [N, IC, OC] : {std::tuple{70, 24, 96}, std::tuple{40, 300, 200}})
    for (int th : {1, 3}) {
      CAPTURE(N);
      set_num_threads(th);
      Rng r(120 + th + N);
      auto x = ref::rand_floats(r, N * IC), w = ref::rand_floats(r, OC * IC, 0.3f), b = ref::rand_floats(r, OC);
      std::vector<float> out(N * OC), pre(N * OC), pre2(N * OC), out2(N * OC);
      linear_gelu_forward(out.data(), pre.data(), x.data(), w.data(), b.data(), N, IC, OC);
      linear_forward(pre2.data(), x.data(), w.data(), b.data(), N, IC, OC, OC);
      gelu_forward(out2.data(), pre2.data(), out2.size());
      CHECK(pre == pre2);
      CHECK(out == out2);
      // Backward of the next layer (input width OC... here IC) whose input was gelu(pre_in).
      auto dout = ref::rand_floats(r, N * OC), pre_in = ref::rand_floats(r, N * IC);
      std::vector<float> dpre(N * IC), dw(OC * IC, 0.5f), db(OC, 0.25f), dpre2(N * IC), dw2 = dw, db2 = db;
      linear_dgelu_backward(dpre.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), pre_in.data(), N, IC,
                            OC);
      linear_backward(dpre2.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(), N, IC, OC, OC, false);
      gelu_backward(dpre2.data(), pre_in.data(), dpre2.data(), dpre2.size());
      CHECK(dpre == dpre2);
      CHECK(dw == dw2);
      CHECK(db == db2);
    }
  set_num_threads(2);
}
