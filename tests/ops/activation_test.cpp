// GELU (tanh), SwiGLU and residual add: forward vs double reference (<= 1e-5, the GELU
// tanh in fp32 limits it), backward vs central finite differences (<= 1e-3), GELU and
// SwiGLU backward overwriting (GELU's also in place over dout), the residual backward
// accumulating, and the threaded path.
#include "ops/activation.h"

#include "core/error.h"

#include "reference.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("gelu forward/backward (n odd, includes large |x|)") {
  for (size_t n : {size_t(37), size_t(100003)}) {
    Rng r(41);
    auto x = ref::rand_floats(r, n, 3.0f), dout = ref::rand_floats(r, n);
    x[0] = 12.0f;
    x[1] = -12.0f;
    x[2] = 0.0f;
    std::vector<float> out(n);
    gelu_forward(out.data(), x.data(), n);
    CHECK(ref::max_rel_err(out, ref::gelu(ref::to_double(x))) <= 1e-5);
    if (n > 1000) continue;
    auto g = ref::fd_grad([&](const ref::Vec& p) { return ref::dot(ref::gelu(p), ref::to_double(dout)); },
                          ref::to_double(x));
    std::vector<float> dx(n, NAN);  // written, never read
    gelu_backward(dx.data(), x.data(), dout.data(), n);
    CHECK(ref::max_rel_err(dx, g) <= 1e-3);
    auto d1 = dx;
    gelu_backward(dx.data(), x.data(), dout.data(), n);
    for (size_t i = 0; i < n; ++i) CHECK(dx[i] == d1[i]);
    auto inplace = dout;
    gelu_backward(inplace.data(), x.data(), inplace.data(), n);
    for (size_t i = 0; i < n; ++i) CHECK(inplace[i] == d1[i]);
  }
}

TEST_CASE("swiglu forward/backward with separate gate and up arrays") {
  const size_t n = 45;
  Rng r(42);
  auto gate = ref::rand_floats(r, n, 2.0f), up = ref::rand_floats(r, n), dout = ref::rand_floats(r, n);
  std::vector<float> out(n);
  swiglu_forward(out.data(), gate.data(), up.data(), n);
  CHECK(ref::max_rel_err(out, ref::swiglu(ref::to_double(gate), ref::to_double(up))) <= 1e-5);
  auto loss = [&](const ref::Vec& p) {
    return ref::dot(ref::swiglu(ref::slice(p, 0, n), ref::slice(p, n, n)), ref::to_double(dout));
  };
  auto g = ref::fd_grad(loss, ref::concat({ref::to_double(gate), ref::to_double(up)}));
  std::vector<float> dg(n, NAN), du(n, NAN);  // written, never read
  swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
  CHECK(ref::max_rel_err(dg, ref::slice(g, 0, n)) <= 1e-3);
  CHECK(ref::max_rel_err(du, ref::slice(g, n, n)) <= 1e-3);
  auto dg1 = dg, du1 = du;
  swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
  for (size_t i = 0; i < n; ++i) {
    CHECK(dg[i] == dg1[i]);
    CHECK(du[i] == du1[i]);
  }
}

TEST_CASE("residual forward (in place) and backward accumulate") {
  const size_t n = 70001;
  Rng r(43);
  auto a = ref::rand_floats(r, n), b = ref::rand_floats(r, n), d = ref::rand_floats(r, n);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == a[i] + b[i]);
  auto a0 = a;
  residual_forward(a.data(), a.data(), b.data(), n);  // aliasing out == a
  for (size_t i = 0; i < n; ++i) REQUIRE(a[i] == a0[i] + b[i]);
  std::vector<float> da(n, 1.0f), db(n);
  residual_backward(da.data(), db.data(), d.data(), n);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(da[i] == 1.0f + d[i]);
    REQUIRE(db[i] == d[i]);
  }
}

TEST_CASE("swiglu over the column blocks of a fused gate/up array equals the dense op row by row") {
  const size_t rows = 6, cols = 11, ld = 2 * cols + 3;  // gate | up | 3 pad columns
  Rng r(43);
  auto gu = ref::rand_floats(r, rows * ld, 2.0f), dout = ref::rand_floats(r, rows * cols);
  std::vector<float> out(rows * cols), dgu(rows * ld, 7.0f);
  swiglu_forward(out.data(), gu.data(), gu.data() + cols, rows, cols, ld);
  swiglu_backward(dgu.data(), dgu.data() + cols, dout.data(), gu.data(), gu.data() + cols, rows, cols, ld);
  for (size_t i = 0; i < rows; ++i) {
    std::vector<float> o(cols), dg(cols), du(cols);
    const float* g = &gu[i * ld];
    swiglu_forward(o.data(), g, g + cols, cols);
    swiglu_backward(dg.data(), du.data(), &dout[i * cols], g, g + cols, cols);
    for (size_t c = 0; c < cols; ++c) {
      REQUIRE(out[i * cols + c] == o[c]);
      REQUIRE(dgu[i * ld + c] == dg[c]);
      REQUIRE(dgu[i * ld + cols + c] == du[c]);
    }
    for (size_t c = 2 * cols; c < ld; ++c) REQUIRE(dgu[i * ld + c] == 7.0f);  // the pad is never written
  }
  CHECK_THROWS_AS(swiglu_forward(out.data(), gu.data(), gu.data() + cols, rows, cols, cols - 1), UsageError);
}
