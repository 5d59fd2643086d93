// Cross-entropy: per-row losses and the unmasked mean vs the double reference (<= 1e-5),
// the fused backward vs central finite differences of the mean (<= 1e-3), the ignore
// index (masked rows give loss 0 and dlogits 0 and do not change the mean), the scale
// argument, in-place dlogits, padded rows (a row pitch past V), all-masked input and bad
// targets.
#include "ops/cross_entropy.h"

#include "core/error.h"
#include "reference.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::ops;

TEST_CASE("cross entropy forward/backward with masked rows (N=7, V=11)") {
  const int N = 7, V = 11;
  Rng r(61);
  auto logits = ref::rand_floats(r, N * V, 3.0f);
  std::vector<int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
  tgt[2] = IGNORE_INDEX;
  tgt[5] = IGNORE_INDEX;
  CHECK(cross_entropy_count(tgt.data(), N) == 5);
  std::vector<float> losses(N, -1.0f);
  float mean = cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, V);
  ref::Vec ref_losses;
  double ref_mean = ref::cross_entropy(ref::to_double(logits), tgt, N, V, &ref_losses);
  CHECK(ref::max_rel_err(losses, ref_losses) <= 1e-5);
  CHECK(mean == doctest::Approx(ref_mean).epsilon(1e-6));
  CHECK(losses[2] == 0.0f);
  CHECK(losses[5] == 0.0f);

  // masked rows do not change the mean: dropping them gives the same value
  std::vector<int32_t> tgt_kept;
  std::vector<float> logits_kept;
  for (int n = 0; n < N; ++n)
    if (tgt[n] != IGNORE_INDEX) {
      tgt_kept.push_back(tgt[n]);
      logits_kept.insert(logits_kept.end(), logits.begin() + n * V, logits.begin() + (n + 1) * V);
    }
  std::vector<float> l2(tgt_kept.size());
  CHECK(cross_entropy_forward(l2.data(), logits_kept.data(), tgt_kept.data(), int(tgt_kept.size()), V, V) ==
        doctest::Approx(mean).epsilon(1e-6));

  // backward of upstream * mean, upstream = 0.25 (e.g. 1/grad_accum)
  const float up = 0.25f;
  auto g =
      ref::fd_grad([&](const ref::Vec& x) { return up * ref::cross_entropy(x, tgt, N, V); }, ref::to_double(logits));
  std::vector<float> d(N * V, 99.0f);
  cross_entropy_backward(d.data(), logits.data(), tgt.data(), N, V, V, up / cross_entropy_count(tgt.data(), N));
  CHECK(ref::max_rel_err(d, g) <= 1e-3);
  for (int i = 0; i < V; ++i) {
    CHECK(d[2 * V + i] == 0.0f);
    CHECK(d[5 * V + i] == 0.0f);
  }
  // each unmasked row of (softmax - onehot) sums to 0
  double rs = 0;
  for (int i = 0; i < V; ++i) rs += d[i];
  CHECK(std::abs(rs) < 1e-6);
  // in place: dlogits aliasing logits gives the same result
  auto inplace = logits;
  cross_entropy_backward(inplace.data(), inplace.data(), tgt.data(), N, V, V, up / 5);
  for (int i = 0; i < N * V; ++i) CHECK(inplace[i] == d[i]);
}

TEST_CASE("cross entropy with every row masked has mean 0 and zero gradient") {
  const int N = 3, V = 4;
  std::vector<float> logits(N * V, 1.0f), losses(N), d(N * V, 5.0f);
  std::vector<int32_t> tgt(N, IGNORE_INDEX);
  CHECK(cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, V) == 0.0f);
  cross_entropy_backward(d.data(), logits.data(), tgt.data(), N, V, V, 1.0f);
  for (float x : d) CHECK(x == 0.0f);
}

TEST_CASE("cross entropy is stable for huge logits and at a threaded size") {
  const int N = 64, V = 1000;
  Rng r(62);
  auto logits = ref::rand_floats(r, N * V, 50.0f);
  logits[0] = 1e4f;
  std::vector<int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
  std::vector<float> losses(N);
  float mean = cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, V);
  CHECK(std::isfinite(mean));
  ref::Vec rl;
  CHECK(mean == doctest::Approx(ref::cross_entropy(ref::to_double(logits), tgt, N, V, &rl)).epsilon(1e-5));
  CHECK(ref::max_rel_err(losses, rl) <= 1e-5);
}

TEST_CASE("cross entropy backward from the forward's logsumexp equals the recomputing one, bit for bit") {
  const int N = 33, V = 517, ld = 520;
  Rng r(64);
  auto logits = ref::rand_floats(r, N * ld, 4.0f);
  std::vector<int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
  tgt[0] = tgt[5] = IGNORE_INDEX;
  std::vector<float> losses(N), losses2(N), lse(N);
  const float m1 = cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, ld, IGNORE_INDEX, lse.data());
  const float m2 = cross_entropy_forward(losses2.data(), logits.data(), tgt.data(), N, V, ld);
  CHECK(m1 == m2);
  CHECK(losses == losses2);
  CHECK(std::isnan(lse[0]));  // ignored rows are not computed
  std::vector<float> d1(N * ld, 7.0f), d2(N * ld, 7.0f);
  cross_entropy_backward(d1.data(), logits.data(), tgt.data(), N, V, ld, 0.5f, IGNORE_INDEX, lse.data());
  cross_entropy_backward(d2.data(), logits.data(), tgt.data(), N, V, ld, 0.5f);
  CHECK(d1 == d2);
  // A row ignored in the forward but not in the backward is recomputed, not read as 0.
  auto tgt2 = tgt;
  tgt2[0] = 3;
  cross_entropy_backward(d1.data(), logits.data(), tgt2.data(), N, V, ld, 0.5f, IGNORE_INDEX, lse.data());
  cross_entropy_backward(d2.data(), logits.data(), tgt2.data(), N, V, ld, 0.5f);
  CHECK(d1 == d2);
  double row0 = 0;
  for (int i = 0; i < V; ++i) row0 += d1[i];
  CHECK(row0 == doctest::Approx(0.0).epsilon(1e-5));  // softmax - onehot sums to 0
}

TEST_CASE("cross entropy rejects targets outside the vocabulary") {
  std::vector<float> logits(4), losses(1);
  std::vector<int32_t> tgt = {4};
  CHECK_THROWS_AS(cross_entropy_forward(losses.data(), logits.data(), tgt.data(), 1, 4, 4), UsageError);
  tgt[0] = -1;
  CHECK_THROWS_AS(cross_entropy_backward(logits.data(), logits.data(), tgt.data(), 1, 4, 4, 1.0f), UsageError);
}

TEST_CASE("cross entropy over padded rows reads and writes only the first V columns") {
  const int N = 5, V = 11, ld = 16;
  Rng r(63);
  auto logits = ref::rand_floats(r, N * V, 3.0f);
  std::vector<int32_t> tgt(N);
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
  tgt[1] = IGNORE_INDEX;
  std::vector<float> padded(N * ld, NAN);  // the padding is NaN: reading it would show
  for (int n = 0; n < N; ++n) std::copy(logits.begin() + n * V, logits.begin() + (n + 1) * V, padded.begin() + n * ld);
  std::vector<float> losses(N), losses_p(N), d(N * V);
  const float mean = cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, V);
  CHECK(cross_entropy_forward(losses_p.data(), padded.data(), tgt.data(), N, V, ld) == mean);
  CHECK(losses_p == losses);
  cross_entropy_backward(d.data(), logits.data(), tgt.data(), N, V, V, 0.5f);
  cross_entropy_backward(padded.data(), padded.data(), tgt.data(), N, V, ld, 0.5f);  // in place
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < ld; ++i) {
      if (i < V) CHECK(padded[n * ld + i] == d[n * V + i]);
      else CHECK(std::isnan(padded[n * ld + i]));  // never written
    }
  CHECK_THROWS_AS(cross_entropy_forward(losses.data(), logits.data(), tgt.data(), N, V, V - 1), UsageError);
}
