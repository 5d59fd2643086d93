// embedding forward vs the double reference (exact: it is a copy/add), backward vs
// central finite differences, gradient accumulation, bad token ids.
#include "ops/embedding.h"

#include "core/error.h"
#include "reference.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("embedding forward/backward with and without positions (B=2, T=7, C=12)") {
  const int B = 2, T = 7, C = 12, V = 5;
  Rng r(11);
  std::vector<int32_t> tok(B * T);
  for (auto& t : tok) t = static_cast<int32_t>(r.below(V));
  tok[3] = tok[4];  // a repeated token must accumulate both rows
  auto wte = ref::rand_floats(r, V * C), wpe = ref::rand_floats(r, T * C), w = ref::rand_floats(r, B * T * C);
  for (bool pos : {true, false}) {
    std::vector<float> out(B * T * C);
    embedding_forward(out.data(), tok.data(), wte.data(), pos ? wpe.data() : nullptr, B, T, C, V);
    ref::Vec wpe_d = ref::to_double(wpe);
    auto expect = ref::embedding(tok, ref::to_double(wte), pos ? &wpe_d : nullptr, B, T, C);
    CHECK(ref::max_rel_err(out, expect) <= 1e-7);  // one fp32 add: exact to rounding

    auto loss = [&](const ref::Vec& x) {
      ref::Vec e = ref::slice(x, 0, V * C), p = ref::slice(x, V * C, T * C);
      return ref::dot(ref::embedding(tok, e, pos ? &p : nullptr, B, T, C), ref::to_double(w));
    };
    auto g = ref::fd_grad(loss, ref::concat({ref::to_double(wte), ref::to_double(wpe)}));
    std::vector<float> dwte(V * C), dwpe(T * C);
    embedding_backward(dwte.data(), pos ? dwpe.data() : nullptr, w.data(), tok.data(), B, T, C);
    CHECK(ref::max_rel_err(dwte, ref::slice(g, 0, V * C)) <= 1e-6);
    if (pos) CHECK(ref::max_rel_err(dwpe, ref::slice(g, V * C, T * C)) <= 1e-6);
    // accumulation: a second backward doubles the gradients
    std::vector<float> once = dwte;
    embedding_backward(dwte.data(), pos ? dwpe.data() : nullptr, w.data(), tok.data(), B, T, C);
    for (size_t i = 0; i < dwte.size(); ++i) CHECK(dwte[i] == doctest::Approx(2 * once[i]).epsilon(1e-6));
  }
}

TEST_CASE("embedding with packed documents: learned positions count from each document's start") {
  const int B = 2, T = 6, C = 3, V = 4;
  const std::vector<int32_t> ds = {0, 0, 2, 2, 2, 5, 0, 1, 1, 3, 3, 3};
  std::vector<int32_t> tok = {1, 2, 3, 0, 1, 2, 3, 3, 0, 1, 2, 0};
  Rng r(12);
  auto wte = ref::rand_floats(r, V * C), wpe = ref::rand_floats(r, T * C), w = ref::rand_floats(r, B * T * C);
  std::vector<float> out(B * T * C);
  embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, V, ds.data());
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f), want(T * C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), w.data(), tok.data(), B, T, C, ds.data());
  for (int n = 0; n < B * T; ++n) {
    const int p = n % T - ds[size_t(n)];
    for (int c = 0; c < C; ++c) {
      CHECK(out[size_t(n) * C + size_t(c)] ==
            wte[size_t(tok[size_t(n)]) * C + size_t(c)] + wpe[size_t(p) * C + size_t(c)]);
      want[size_t(p) * C + size_t(c)] += w[size_t(n) * C + size_t(c)];
    }
  }
  CHECK(dwpe == want);  // row order, as the sum above
}

TEST_CASE("embedding rejects token ids outside the vocabulary") {
  std::vector<float> wte(4 * 2), out(2 * 2);
  std::vector<int32_t> tok = {1, 4};
  CHECK_THROWS_AS(embedding_forward(out.data(), tok.data(), wte.data(), nullptr, 1, 2, 2, 4), UsageError);
  tok[1] = -1;
  CHECK_THROWS_AS(embedding_forward(out.data(), tok.data(), wte.data(), nullptr, 1, 2, 2, 4), UsageError);
}
