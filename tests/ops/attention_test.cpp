// Causal attention with grouped KV heads: forward vs the double reference (<= 1e-5),
// saved probabilities (rows sum to 1, zero above the diagonal), backward dq/dk/dv vs
// central finite differences of the double reference (<= 1e-3) for MHA, GQA (NH=4, NKV=2)
// and MQA (NKV=1) at T=7, at sizes where the thread pool runs (the grouped-head
// reduction included) and past one causal query block; gradient accumulation; q, k, v
// read in place from a fused qkv with strided gradients, bit-identical to dense.
#include "ops/attention.h"

#include "core/error.h"
#include "reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <tuple>

using namespace dtrain;
using namespace dtrain::ops;

namespace {
void check_attention(int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fd) {
  Rng r(seed);
  const size_t nq = size_t(B) * T * NH * HD, nk = size_t(B) * T * NKV * HD;
  auto q = ref::rand_floats(r, nq), k = ref::rand_floats(r, nk), v = ref::rand_floats(r, nk);
  auto dout = ref::rand_floats(r, nq);
  std::vector<float> out(nq), att(size_t(B) * NH * T * T, -1.0f);
  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  CHECK(ref::max_rel_err(
            out, ref::attention(ref::to_double(q), ref::to_double(k), ref::to_double(v), B, T, NH, NKV, HD)) <= 1e-5);
  for (int row = 0; row < B * NH * T; ++row) {
    int t = row % T;
    double s = 0;
    for (int t2 = 0; t2 < T; ++t2) {
      float a = att[size_t(row) * T + t2];
      if (t2 > t) REQUIRE(a == 0.0f);
      s += a;
    }
    REQUIRE(s == doctest::Approx(1.0).epsilon(1e-5));
  }
  if (!fd) return;
  auto loss = [&](const ref::Vec& x) {
    return ref::dot(
        ref::attention(ref::slice(x, 0, nq), ref::slice(x, nq, nk), ref::slice(x, nq + nk, nk), B, T, NH, NKV, HD),
        ref::to_double(dout));
  };
  auto g = ref::fd_grad(loss, ref::concat({ref::to_double(q), ref::to_double(k), ref::to_double(v)}));
  std::vector<float> dq(nq), dk(nk), dv(nk);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH,
                     NKV, HD);
  CHECK(ref::max_rel_err(dq, ref::slice(g, 0, nq)) <= 1e-3);
  CHECK(ref::max_rel_err(dk, ref::slice(g, nq, nk)) <= 1e-3);
  CHECK(ref::max_rel_err(dv, ref::slice(g, nq + nk, nk)) <= 1e-3);
  auto dq1 = dq, dk1 = dk, dv1 = dv;
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH,
                     NKV, HD);
  for (size_t i = 0; i < nq; ++i) REQUIRE(dq[i] == doctest::Approx(2 * dq1[i]).epsilon(1e-5));
  for (size_t i = 0; i < nk; ++i) {
    REQUIRE(dk[i] == doctest::Approx(2 * dk1[i]).epsilon(1e-5));
    REQUIRE(dv[i] == doctest::Approx(2 * dv1[i]).epsilon(1e-5));
  }
}
}  // namespace

TEST_CASE("attention MHA (NH=NKV=3), T=7") { check_attention(2, 7, 3, 3, 4, 31, true); }
TEST_CASE("attention GQA NH=4 NKV=2, T=7") { check_attention(2, 7, 4, 2, 6, 32, true); }
TEST_CASE("attention MQA NH=4 NKV=1, T=7") { check_attention(2, 7, 4, 1, 4, 33, true); }
TEST_CASE("attention T=1 (attends only to itself)") { check_attention(3, 1, 2, 1, 5, 34, true); }
TEST_CASE("attention GQA and MQA at thread-pool sizes (B=2, T=24, HD=8) vs finite differences") {
  check_attention(2, 24, 4, 2, 8, 36, true);
  check_attention(2, 24, 4, 1, 8, 37, true);
}
TEST_CASE("attention at a larger threaded size (B=2, T=64, NH=4, NKV=2, HD=32)") {
  check_attention(2, 64, 4, 2, 32, 35, false);
}

TEST_CASE("attention past one causal query block (T=70 > 64 rows), MHA and MQA, vs finite differences") {
  check_attention(1, 70, 2, 2, 4, 38, true);
  check_attention(1, 70, 2, 1, 4, 39, true);
}

TEST_CASE("attention reads q, k, v in place from a fused qkv and writes strided gradients: the same bits as dense") {
  for (int NKV : {4, 2}) {  // MHA and GQA
    CAPTURE(NKV);
    const int B = 2, T = 70, NH = 4, HD = 8, qw = NH * HD, kw = NKV * HD, W = qw + 2 * kw;
    const size_t N = size_t(B) * T;
    Rng r(40 + NKV);
    auto qkv = ref::rand_floats(r, N * W), dout = ref::rand_floats(r, N * qw);
    std::vector<float> q(N * qw), k(N * kw), v(N * kw);
    for (size_t n = 0; n < N; ++n) {
      std::copy_n(&qkv[n * W], qw, &q[n * qw]);
      std::copy_n(&qkv[n * W + qw], kw, &k[n * kw]);
      std::copy_n(&qkv[n * W + qw + kw], kw, &v[n * kw]);
    }
    std::vector<float> out(N * qw), out_s(N * qw), att(size_t(B) * NH * T * T), att_s(att.size());
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
    attention_forward(out_s.data(), att_s.data(), &qkv[0], &qkv[qw], &qkv[qw + kw], B, T, NH, NKV, HD, W, W);
    CHECK(out == out_s);
    CHECK(att == att_s);
    std::vector<float> dq(N * qw, 0.0f), dk(N * kw, 0.0f), dv(N * kw, 0.0f), dqkv(N * W, 0.0f);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH,
                       NKV, HD);
    attention_backward(&dqkv[0], &dqkv[qw], &dqkv[qw + kw], dout.data(), att.data(), &qkv[0], &qkv[qw], &qkv[qw + kw],
                       B, T, NH, NKV, HD, W, W);
    for (size_t n = 0; n < N; ++n) {
      REQUIRE(std::equal(&dq[n * qw], &dq[n * qw] + qw, &dqkv[n * W]));
      REQUIRE(std::equal(&dk[n * kw], &dk[n * kw] + kw, &dqkv[n * W + qw]));
      REQUIRE(std::equal(&dv[n * kw], &dv[n * kw] + kw, &dqkv[n * W + qw + kw]));
    }
  }
}

TEST_CASE("attention with packed documents (doc_start): each document as if alone, past query blocks, with GQA") {
  // Two rows of 200 with documents crossing the 64-row query blocks (the skipped key ranges
  // start mid-block), a 1-token document, and a document longer than a block.
  const std::vector<std::vector<int>> docs = {{70, 1, 60, 69}, {3, 130, 67}};
  const int B = 2, T = 200, NH = 4, NKV = 2, HD = 8, QW = NH * HD, KW = NKV * HD;
  for (int window : {0, 50}) {
    CAPTURE(window);
    std::vector<int32_t> ds;
    for (const auto& lens : docs) {
      int start = 0;
      for (int len : lens) {
        ds.insert(ds.end(), static_cast<size_t>(len), start);
        start += len;
      }
    }
    REQUIRE(ds.size() == static_cast<size_t>(B) * T);
    attention_doc_starts_check(ds.data(), B, T);
    const size_t N = size_t(B) * T;
    Rng r(50 + window);
    auto q = ref::rand_floats(r, N * QW), k = ref::rand_floats(r, N * KW), v = ref::rand_floats(r, N * KW);
    auto dout = ref::rand_floats(r, N * QW);
    std::vector<float> out(N * QW), att(size_t(B) * NH * T * T), dq(N * QW, 0.0f), dk(N * KW, 0.0f), dv(N * KW, 0.0f);
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, 0, 0, window, ds.data());
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH,
                       NKV, HD, 0, 0, window, ds.data());
    double worst = 0;
    for (int b = 0; b < B; ++b) {
      int start = 0;
      for (int len : docs[size_t(b)]) {
        const size_t o = size_t(b) * T + size_t(start), n = size_t(len);
        auto rows = [&](const std::vector<float>& x, int w) {
          return std::vector<float>(x.begin() + ptrdiff_t(o * w), x.begin() + ptrdiff_t((o + n) * w));
        };
        const auto q1 = rows(q, QW), k1 = rows(k, KW), v1 = rows(v, KW), d1 = rows(dout, QW);
        std::vector<float> o1(n * QW), a1(NH * n * n), gq(n * QW, 0.0f), gk(n * KW, 0.0f), gv(n * KW, 0.0f);
        attention_forward(o1.data(), a1.data(), q1.data(), k1.data(), v1.data(), 1, len, NH, NKV, HD, 0, 0, window);
        attention_backward(gq.data(), gk.data(), gv.data(), d1.data(), a1.data(), q1.data(), k1.data(), v1.data(), 1,
                           len, NH, NKV, HD, 0, 0, window);
        for (auto [got, want, w] : {std::tuple{&out, &o1, QW}, std::tuple{&dq, &gq, QW}, std::tuple{&dk, &gk, KW},
                                    std::tuple{&dv, &gv, KW}}) {
          const auto part = rows(*got, w);
          for (size_t i = 0; i < part.size(); ++i)
            worst = std::max(worst, double(std::abs(part[i] - (*want)[i])) / (1.0 + std::abs((*want)[i])));
        }
        start += len;
      }
    }
    CHECK(worst <= 1e-5);
    // Every probability outside a query's document (and window) is 0: no cross-talk.
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < ds[size_t(b) * T + size_t(t)]; ++j)
          REQUIRE(att[((size_t(b) * NH) * T + size_t(t)) * T + size_t(j)] == 0.0f);
  }
}

TEST_CASE("attention_doc_starts_check refuses starts that are not packed documents") {
  std::vector<int32_t> ok = {0, 0, 2, 2, 2, 0, 1, 1, 1, 4};
  attention_doc_starts_check(ok.data(), 2, 5);
  for (std::vector<int32_t> bad :
       {std::vector<int32_t>{1, 1, 1, 1, 1}, {0, 0, 1, 1, 1}, {0, 0, 2, 1, 1}, {0, 0, 5, 5, 5}}) {
    CAPTURE(bad[2]);
    CHECK_THROWS_AS(attention_doc_starts_check(bad.data(), 1, 5), UsageError);
  }
}

TEST_CASE("attention rejects NH not a multiple of NKV") {
  std::vector<float> x(64), att(64);
  CHECK_THROWS_AS(attention_forward(x.data(), att.data(), x.data(), x.data(), x.data(), 1, 2, 3, 2, 2), UsageError);
}
