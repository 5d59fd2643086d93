// RoPE vs HF's apply_rotary_pos_emb written in double (rotate_half convention), the
// backward as the exact inverse/transpose (FD of the double reference), GQA head counts,
// norm preservation and position 0 being the identity.
#include "ops/rope.h"

#include "core/error.h"
#include "reference.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("rope forward matches HF rotate_half, backward matches finite differences") {
  const int B = 2, T = 7, NH = 4, NKV = 2, HD = 6;
  const float theta = 10000.0f;
  Rng r(21);
  auto q = ref::rand_floats(r, B * T * NH * HD), k = ref::rand_floats(r, B * T * NKV * HD);
  auto q0 = q, k0 = k;
  rope_forward(q.data(), k.data(), B, T, NH, NKV, HD, RopeFreq{theta});
  CHECK(ref::max_rel_err(q, ref::rope(ref::to_double(q0), B, T, NH, HD, theta)) <= 1e-6);
  CHECK(ref::max_rel_err(k, ref::rope(ref::to_double(k0), B, T, NKV, HD, theta)) <= 1e-6);
  // position 0 is the identity; every position preserves the norm of each head vector
  for (int i = 0; i < NH * HD; ++i) CHECK(q[i] == q0[i]);
  double n0 = 0, n1 = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    n0 += double(q0[i]) * q0[i];
    n1 += double(q[i]) * q[i];
  }
  CHECK(n1 == doctest::Approx(n0).epsilon(1e-6));

  auto dq = ref::rand_floats(r, q.size()), dk = ref::rand_floats(r, k.size());
  auto lq = [&](const ref::Vec& x) { return ref::dot(ref::rope(x, B, T, NH, HD, theta), ref::to_double(dq)); };
  auto lk = [&](const ref::Vec& x) { return ref::dot(ref::rope(x, B, T, NKV, HD, theta), ref::to_double(dk)); };
  auto gq = ref::fd_grad(lq, ref::to_double(q0)), gk = ref::fd_grad(lk, ref::to_double(k0));
  rope_backward(dq.data(), dk.data(), B, T, NH, NKV, HD, RopeFreq{theta});
  CHECK(ref::max_rel_err(dq, gq) <= 1e-4);
  CHECK(ref::max_rel_err(dk, gk) <= 1e-4);
  // backward(forward(x)) == x: the rotation is orthogonal
  auto x = q0;
  rope_forward(x.data(), nullptr, B, T, NH, 0, HD, RopeFreq{500000.0f});
  rope_backward(x.data(), nullptr, B, T, NH, 0, HD, RopeFreq{500000.0f});
  CHECK(ref::max_rel_err(x, ref::to_double(q0)) <= 1e-6);
}

TEST_CASE("rope with a small theta and long sequence (large angles)") {
  const int B = 1, T = 300, H = 1, HD = 8;
  Rng r(22);
  auto q = ref::rand_floats(r, T * HD), q0 = q;
  rope_forward(q.data(), nullptr, B, T, H, 0, HD, RopeFreq{100.0f});
  CHECK(ref::max_rel_err(q, ref::rope(ref::to_double(q0), B, T, H, HD, 100.0)) <= 1e-5);
}

TEST_CASE("rope rejects an odd head dimension") {
  std::vector<float> q(3);
  CHECK_THROWS_AS(rope_forward(q.data(), nullptr, 1, 1, 1, 0, 3, RopeFreq{10000.0f}), UsageError);
}

TEST_CASE("rope with packed documents: positions restart at each document's start, forward and backward") {
  const int B = 2, T = 9, NH = 2, NKV = 1, HD = 4;
  const std::vector<int32_t> ds = {0, 0, 0, 3, 3, 5, 5, 5, 5, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  Rng r(23);
  auto q = ref::rand_floats(r, B * T * NH * HD), k = ref::rand_floats(r, B * T * NKV * HD);
  for (bool bwd : {false, true}) {
    auto qp = q, kp = k;
    (bwd ? rope_backward : rope_forward)(qp.data(), kp.data(), B, T, NH, NKV, HD, RopeFreq{10000.0f}, ds.data(), 0, 0);
    // Each position alone, as position t - start of a sequence: the same rotation.
    for (int n = 0; n < B * T; ++n) {
      const int p = n % T - ds[size_t(n)];
      std::vector<float> q1(size_t(p + 1) * NH * HD, 0.0f), k1(size_t(p + 1) * NKV * HD, 0.0f);
      std::copy_n(&q[size_t(n) * NH * HD], NH * HD, &q1[size_t(p) * NH * HD]);
      std::copy_n(&k[size_t(n) * NKV * HD], NKV * HD, &k1[size_t(p) * NKV * HD]);
      (bwd ? rope_backward : rope_forward)(q1.data(), k1.data(), 1, p + 1, NH, NKV, HD, RopeFreq{10000.0f}, nullptr, 0,
                                           0);
      for (int i = 0; i < NH * HD; ++i)
        REQUIRE(qp[size_t(n) * NH * HD + size_t(i)] == q1[size_t(p) * NH * HD + size_t(i)]);
      for (int i = 0; i < NKV * HD; ++i)
        REQUIRE(kp[size_t(n) * NKV * HD + size_t(i)] == k1[size_t(p) * NKV * HD + size_t(i)]);
    }
  }
}

TEST_CASE("rope over the column blocks of a fused q/k/v array: row strides give the dense result, v untouched") {
  const int B = 2, T = 5, NH = 4, NKV = 2, HD = 6, ld = (NH + 2 * NKV) * HD + 2;  // + 2 pad columns
  Rng r(24);
  auto x = ref::rand_floats(r, size_t(B) * T * ld);
  for (bool bwd : {false, true}) {
    auto fused = x;
    (bwd ? rope_backward : rope_forward)(fused.data(), fused.data() + NH * HD, B, T, NH, NKV, HD, RopeFreq{10000.0f},
                                         nullptr, ld, ld);
    // The same rows copied out dense, rotated, and compared bit for bit.
    std::vector<float> q(size_t(B) * T * NH * HD), k(size_t(B) * T * NKV * HD);
    for (int n = 0; n < B * T; ++n) {
      std::copy_n(&x[size_t(n) * ld], NH * HD, &q[size_t(n) * NH * HD]);
      std::copy_n(&x[size_t(n) * ld + NH * HD], NKV * HD, &k[size_t(n) * NKV * HD]);
    }
    (bwd ? rope_backward : rope_forward)(q.data(), k.data(), B, T, NH, NKV, HD, RopeFreq{10000.0f}, nullptr, 0, 0);
    for (int n = 0; n < B * T; ++n) {
      const float* row = &fused[size_t(n) * ld];
      for (int i = 0; i < NH * HD; ++i) REQUIRE(row[i] == q[size_t(n) * NH * HD + size_t(i)]);
      for (int i = 0; i < NKV * HD; ++i) REQUIRE(row[NH * HD + i] == k[size_t(n) * NKV * HD + size_t(i)]);
      for (int i = (NH + NKV) * HD; i < ld; ++i) REQUIRE(row[i] == x[size_t(n) * ld + size_t(i)]);  // v, pad
    }
  }
  std::vector<float> small(static_cast<size_t>(ld), 0.0f);
  CHECK_THROWS_AS(rope_forward(small.data(), nullptr, 1, 1, NH, 0, HD, RopeFreq{10000.0f}, nullptr, NH * HD - 1),
                  UsageError);
}
