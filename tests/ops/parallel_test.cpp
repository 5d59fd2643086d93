// parallel_for: every index visited exactly once for any thread count, nested and
// concurrent callers, exceptions rethrown in the caller, and ops bit-identical between
// 1 and several threads (what recomputation relies on): every threaded op, fused ones
// included.
#include "ops/parallel.h"

#include "core/error.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/optim.h"
#include "ops/rope.h"
#include "reference.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("parallel_for visits each index once for 1..5 threads") {
  for (int th = 1; th <= 5; ++th) {
    set_num_threads(th);
    CHECK(num_threads() == th);
    for (size_t n : {size_t(1), size_t(2), size_t(3), size_t(7), size_t(1000)}) {
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, PARALLEL_MIN_WORK, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (auto& h : hits) REQUIRE(h.load() == 1);
    }
  }
  parallel_for(0, PARALLEL_MIN_WORK, [&](size_t, size_t) { FAIL("called for n = 0"); });
  CHECK_THROWS_AS(set_num_threads(0), UsageError);
  set_num_threads(2);
}

TEST_CASE("nested and concurrent parallel_for calls complete correctly") {
  set_num_threads(3);
  std::atomic<long> sum{0};
  parallel_for(6, PARALLEL_MIN_WORK, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      parallel_for(10, PARALLEL_MIN_WORK, [&](size_t b2, size_t e2) { sum += long(e2 - b2); });
  });
  CHECK(sum.load() == 60);
  std::atomic<long> total{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep)
        parallel_for(100, PARALLEL_MIN_WORK, [&](size_t b, size_t e) { total += long(e - b); });
    });
  for (auto& t : ts) t.join();
  CHECK(total.load() == 4 * 50 * 100);
}

TEST_CASE("an exception in any chunk reaches the caller and the pool stays usable") {
  set_num_threads(3);
  for (size_t bad : {size_t(0), size_t(8)}) {
    CHECK_THROWS_AS(parallel_for(9, PARALLEL_MIN_WORK,
                                 [&](size_t b, size_t e) {
                                   if (bad >= b && bad < e) throw std::runtime_error("boom");
                                 }),
                    std::runtime_error);
  }
  std::atomic<int> n{0};
  parallel_for(9, PARALLEL_MIN_WORK, [&](size_t b, size_t e) { n += int(e - b); });
  CHECK(n.load() == 9);
}

TEST_CASE("threaded ops are bit-identical to serial ones (norms, attention, AdamW)") {
  const int N = 128, C = 384, B = 2, T = 48, NH = 4, NKV = 2, HD = 16;
  Rng r(1);
  auto x = ref::rand_floats(r, N * C), w = ref::rand_floats(r, C), bias = ref::rand_floats(r, C),
       d = ref::rand_floats(r, N * C);
  auto q = ref::rand_floats(r, B * T * NH * HD), k = ref::rand_floats(r, B * T * NKV * HD),
       v = ref::rand_floats(r, B * T * NKV * HD);
  auto dq_in = ref::rand_floats(r, q.size());
  std::vector<float> res[2];
  for (int th : {1, 2}) {
    set_num_threads(th == 1 ? 1 : 3);
    std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C, 1e-5f);
    layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    std::vector<float> ao(q.size()), att(size_t(B) * NH * T * T), dq(q.size()), dk(k.size()), dv(v.size());
    attention_forward(ao.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
    attention_backward(dq.data(), dk.data(), dv.data(), dq_in.data(), att.data(), q.data(), k.data(), v.data(), B, T,
                       NH, NKV, HD);
    // AdamW over more elements than one chunk (PARALLEL_MIN_WORK), plain and with a bf16 copy.
    const size_t P = 3 * PARALLEL_MIN_WORK + 7;
    Rng rp(2);
    auto p = ref::rand_floats(rp, P), g = ref::rand_floats(rp, P), m = ref::rand_floats(rp, P),
         mv = ref::rand_floats(rp, P);
    for (auto& x2 : mv) x2 = x2 * x2;  // second moments are non-negative
    auto p2 = p, m2 = m, v2 = mv;
    std::vector<uint16_t> copy(P);
    AdamWConfig ac;
    adamw_step(p.data(), g.data(), m.data(), mv.data(), P, ac, 1e-3f, 3, true, 0.5f);
    adamw_step_copy(p2.data(), g.data(), m2.data(), v2.data(), P, ac, 1e-3f, 3, true, 0.5f, copy.data(), DType::BF16);
    std::vector<float> copy_f(copy.begin(), copy.end());
    auto& o = res[th - 1];
    for (auto* vec : {&out, &dx, &dw, &db, &ao, &dq, &dk, &dv, &p, &m, &mv, &p2, &m2, &v2, &copy_f})
      o.insert(o.end(), vec->begin(), vec->end());
  }
  REQUIRE(res[0].size() == res[1].size());
  CHECK(std::memcmp(res[0].data(), res[1].data(), res[0].size() * sizeof(float)) == 0);
  set_num_threads(2);
}

TEST_CASE("every threaded op matches its single-threaded run (bit for bit; GEMMs within 1e-6)") {
  const int N = 160, C = 320, V = 1000, B = 4, T = 40, NH = 4, NKV = 2, HD = 16, IC = 96, OC = 384;
  Rng r(7);
  auto a = ref::rand_floats(r, N * C), b = ref::rand_floats(r, N * C), d = ref::rand_floats(r, N * C);
  auto w = ref::rand_floats(r, C), bias = ref::rand_floats(r, C);
  auto logits = ref::rand_floats(r, N * V, 3.0f);
  std::vector<int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
  tgt[3] = IGNORE_INDEX;
  std::vector<int32_t> tokens(size_t(B) * T);
  for (auto& t : tokens) t = static_cast<int32_t>(r.below(50));  // repeated tokens: dwte rows collide
  auto wte = ref::rand_floats(r, 50 * C), wpe = ref::rand_floats(r, T * C), demb = ref::rand_floats(r, B * T * C);
  auto q = ref::rand_floats(r, B * T * NH * HD), k = ref::rand_floats(r, B * T * NKV * HD);
  auto lin_in = ref::rand_floats(r, N * IC), lin_w = ref::rand_floats(r, OC * IC, 0.1f),
       lin_b = ref::rand_floats(r, OC);
  auto lin_d = ref::rand_floats(r, N * OC), big = ref::rand_floats(r, 5 * PARALLEL_MIN_WORK + 3);
  std::vector<float> res[2], gemm_res[2];
  for (int th : {1, 2}) {
    set_num_threads(th == 1 ? 1 : 3);
    const size_t n = a.size();
    std::vector<float> g(n), gb(n), sg(n), sgd(n), sud(n), res_out(n), ln(n), mean(N), rstd(N), rres(n), rms(n),
        rrstd(N), dx(n), dw(C), db(C), dxr(n), dwr(C);
    gelu_forward(g.data(), a.data(), n);
    gelu_backward(gb.data(), a.data(), d.data(), n);
    swiglu_forward(sg.data(), a.data(), b.data(), n);
    swiglu_backward(sgd.data(), sud.data(), d.data(), a.data(), b.data(), n);
    residual_layernorm_forward(res_out.data(), ln.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                               bias.data(), N, C, 1e-5f);
    residual_rmsnorm_forward(rres.data(), rms.data(), rrstd.data(), a.data(), b.data(), w.data(), N, C, 1e-5f);
    layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), res_out.data(), w.data(), mean.data(), rstd.data(), N,
                       C);
    rmsnorm_backward(dxr.data(), dwr.data(), d.data(), rres.data(), w.data(), rrstd.data(), N, C);
    std::vector<float> losses(N), lse(N), dl(logits.size());
    const float mloss =
        cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, V, IGNORE_INDEX, lse.data());
    cross_entropy_backward(dl.data(), logits.data(), tgt.data(), N, V, V, 0.25f, IGNORE_INDEX, lse.data());
    std::vector<float> emb(size_t(B) * T * C), dwte(wte.size()), dwpe(wpe.size());
    embedding_forward(emb.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 50);
    embedding_backward(dwte.data(), dwpe.data(), demb.data(), tokens.data(), B, T, C);
    auto rq = q, rk = k;
    rope_forward(rq.data(), rk.data(), B, T, NH, NKV, HD, RopeFreq{10000.0f});
    std::vector<float> lo(size_t(N) * OC), lpre(lo.size()), ldp(size_t(N) * IC), ldw(lin_w.size()), ldb(OC);
    linear_gelu_forward(lo.data(), lpre.data(), lin_in.data(), lin_w.data(), lin_b.data(), N, IC, OC);
    linear_dgelu_backward(ldp.data(), ldw.data(), ldb.data(), lin_d.data(), lin_in.data(), lin_w.data(), lin_in.data(),
                          N, IC, OC);
    const float gn = static_cast<float>(grad_norm_sq(big.data(), big.size()));
    auto& o = res[th - 1];
    for (auto* vec : {&g,  &gb, &sg,  &sgd, &sud,    &res_out, &ln, &mean, &rstd, &rres, &rms, &rrstd, &dx,
                      &dw, &db, &dxr, &dwr, &losses, &lse,     &dl, &emb,  &dwte, &dwpe, &rq,  &rk})
      o.insert(o.end(), vec->begin(), vec->end());
    for (auto* vec : {&lo, &lpre, &ldp, &ldw, &ldb})
      gemm_res[th - 1].insert(gemm_res[th - 1].end(), vec->begin(), vec->end());
    o.push_back(mloss);
    o.push_back(gn);
  }
  REQUIRE(res[0].size() == res[1].size());
  size_t diff = 0;
  for (size_t i = 0; i < res[0].size(); ++i) {
    const bool d = std::memcmp(&res[0][i], &res[1][i], sizeof(float)) != 0;
    if (d && diff < 5) MESSAGE("first differences at flat index " << i);
    diff += d;
  }
  CHECK(diff == 0);
  // The BLAS may round differently for a row block than for the whole matrix, so GEMM
  // results (the fused linear + GELU) are compared within a tolerance instead.
  CHECK(ref::max_rel_err(gemm_res[1], ref::to_double(gemm_res[0])) <= 1e-6);
  set_num_threads(2);
}
