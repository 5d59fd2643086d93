// The preference objectives' gradients against central finite differences of their own
// loss, the row-weighted backward against the mean-loss backward, and the adapters-off
// reference against a separate frozen copy of the base (bit for bit).
#include "core/error.h"
#include "train/preference.h"
#include "zero_harness.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

using namespace dtrain;
using namespace dtrain::train;

namespace {

std::vector<RowLogp> rows_of(const std::vector<double>& sums, const std::vector<int64_t>& counts) {
  std::vector<RowLogp> r;
  for (size_t i = 0; i < sums.size(); ++i) r.push_back({sums[i], counts[i]});
  return r;
}

}  // namespace

TEST_CASE("each objective's gradient equals central differences of its loss") {
  const std::vector<double> sums{-12.5, -30.25, -7.0, -14.0, -29.0, -9.5};  // 3 pairs: chosen, then rejected
  const std::vector<int64_t> counts{5, 11, 3, 6, 9, 4};
  const std::vector<double> ref{-13.0, -29.0, -8.0, -13.5, -30.0, -9.0};
  for (PrefLoss loss : {PrefLoss::SIGMOID, PrefLoss::ORPO, PrefLoss::SIMPO})
    for (double ftx : {0.0, 0.7}) {
      PrefOptions o;
      o.loss = loss;
      o.beta = loss == PrefLoss::SIMPO ? 2.0 : 0.3;
      o.label_smoothing = loss == PrefLoss::SIGMOID ? 0.15 : 0.0;
      o.simpo_gamma = 0.6;
      o.ftx = ftx;
      const std::vector<double> r = loss == PrefLoss::SIGMOID ? ref : std::vector<double>{};
      const PrefResult at = pref_evaluate(o, rows_of(sums, counts), r);
      REQUIRE(at.dsum.size() == sums.size());
      for (size_t k = 0; k < sums.size(); ++k) {
        const double h = 1e-5;
        std::vector<double> up = sums, down = sums;
        up[k] += h;
        down[k] -= h;
        const double fd =
            (pref_evaluate(o, rows_of(up, counts), r).loss_sum - pref_evaluate(o, rows_of(down, counts), r).loss_sum) /
            (2 * h);
        CAPTURE(static_cast<int>(loss));
        CAPTURE(ftx);
        CAPTURE(k);
        CHECK(at.dsum[k] == doctest::Approx(fd).epsilon(1e-6));
        CHECK(at.dsum[k] != 0.0);
      }
    }
}

TEST_CASE("DPO's loss and rewards at a known point; accuracy counts chosen above rejected") {
  PrefOptions o;
  o.beta = 0.5;
  // pair 0: the policy gains 2 on chosen and loses 1 on rejected against the reference
  // (h = 3); pair 1: it gains 1 on both (h = 0, a tie: not counted as accurate).
  const PrefResult r = pref_evaluate(o, rows_of({-8.0, -10.0, -6.0, -7.0}, {4, 4, 4, 4}), {-10.0, -11.0, -5.0, -8.0});
  const double want = std::log1p(std::exp(-1.5)) + std::log(2.0);
  CHECK(r.loss_sum == doctest::Approx(want).epsilon(1e-12));
  CHECK(r.stats.pairs == 2.0);
  CHECK(r.stats.accuracy == 1.0);
  CHECK(r.stats.chosen_reward == doctest::Approx(0.5 * 2.0 + 0.5 * 1.0));
  CHECK(r.stats.rejected_reward == doctest::Approx(0.5 * -1.0 + 0.5 * 1.0));
  const auto m = r.stats.means();
  REQUIRE(m.size() == 6);
  CHECK(m[0].first == "rewards/chosen");
  CHECK(m[2].first == "rewards/accuracies");
  CHECK(m[2].second == doctest::Approx(0.5));
  CHECK_THROWS_AS(pref_evaluate(o, rows_of({-1.0, -2.0}, {1, 1}), {}), InternalError);  // DPO without a reference
  CHECK_THROWS_AS(pref_evaluate(o, rows_of({-1.0, -2.0}, {1, 0}), {-1.0, -1.0}), InternalError);  // an empty side
}

TEST_CASE("backward_rows with every row at 1/count equals backward of the mean loss") {
  for (bool llama : {false, true}) {
    zero_test::RunSpec spec;
    spec.llama = llama;
    auto a = zero_test::model_build(spec);
    auto b = zero_test::model_build(spec);
    const int B = 4, T = 16;
    std::vector<int32_t> tok, tgt;
    zero_test::batch_rows(1, 0, B, T, a->config().vocab_size, tok, tgt);
    for (int t = 0; t < 3; ++t) tgt[static_cast<size_t>(t)] = -100;  // a masked prompt on row 0
    a->forward(tok.data(), tgt.data(), B, T);
    a->zero_grad();
    a->backward(1.0f);
    b->forward(tok.data(), tgt.data(), B, T);
    b->zero_grad();
    const float n = static_cast<float>(b->num_targets());
    std::vector<float> scales(B, 1.0f / n);
    b->backward_rows(scales.data());
    for (size_t i = 0; i < a->params().size(); ++i) {
      const auto& pa = a->params()[i];
      const auto& pb = b->params()[i];
      for (size_t k = 0; k < pa.size; ++k) REQUIRE(pb.grad[k] == doctest::Approx(pa.grad[k]).epsilon(1e-5).scale(1e-6));
    }
    // A row scaled by 0 contributes nothing: the gradient of rows 1..3 alone differs.
    b->forward(tok.data(), tgt.data(), B, T);
    b->zero_grad();
    scales[0] = 0.0f;
    b->backward_rows(scales.data());
    bool differs = false;
    for (size_t k = 0; k < a->params()[1].size && !differs; ++k)
      differs = std::fabs(a->params()[1].grad[k] - b->params()[1].grad[k]) > 1e-6f;
    CHECK(differs);
  }
}

TEST_CASE("the adapters-off forward is a separate frozen base copy's, bit for bit") {
  for (bool llama : {false, true}) {
    zero_test::RunSpec spec;
    spec.llama = llama;
    spec.lora = true;  // adapters with non-zero B
    auto m = zero_test::model_build(spec);
    spec.lora = false;
    auto base = zero_test::model_build(spec);  // the same init seed: the same base weights
    const int B = 2, T = 16;
    std::vector<int32_t> tok, tgt;
    zero_test::batch_rows(3, 0, B, T, m->config().vocab_size, tok, tgt);
    const size_t n = static_cast<size_t>(B) * T * static_cast<size_t>(m->config().vocab_size);
    base->forward(tok.data(), tgt.data(), B, T);
    std::vector<float> want(base->logits(), base->logits() + n);
    m->forward(tok.data(), tgt.data(), B, T);
    CHECK(std::memcmp(m->logits(), want.data(), n * sizeof(float)) != 0);  // the adapters matter
    m->set_adapters_enabled(false);
    m->forward(tok.data(), tgt.data(), B, T);
    CHECK(std::memcmp(m->logits(), want.data(), n * sizeof(float)) == 0);
    CHECK_THROWS_AS(m->backward(1.0f), UsageError);  // no gradient through a reference pass
    m->set_adapters_enabled(true);
    m->forward(tok.data(), tgt.data(), B, T);
    CHECK(std::memcmp(m->logits(), want.data(), n * sizeof(float)) != 0);
  }
}
