// Greedy choice and temperature / top-k / top-p sampling over one row of logits.
#include "train/sampling.h"

#include "core/check.h"

#include <algorithm>
#include <cmath>

namespace dtrain::train {

TokenSampler::TokenSampler(const SamplingOptions& options) : o_(options), rng_(options.seed) {
  DT_ENFORCE(std::isfinite(o_.temperature) && o_.temperature >= 0, UsageError,
             "temperature must be a finite number >= 0 (0 = greedy), got {}", o_.temperature);
  DT_ENFORCE(o_.top_k >= 0, UsageError, "top-k must be >= 0 (0 = off), got {}", o_.top_k);
  DT_ENFORCE(o_.top_p >= 0 && o_.top_p <= 1, UsageError, "top-p must be from 0 to 1 (1 = off), got {}", o_.top_p);
}

// ----------------------------------------------------------------------------
// transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper (one token
// kept at least), then the softmax over what is left.
void TokenSampler::filter(const float* logits, int n) {
  DT_ENFORCE_GT(n, 0, InternalError, "sampling over no logits");
  kept_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) kept_[static_cast<size_t>(i)] = {static_cast<double>(logits[i]) / o_.temperature, i};
  // Top-k: drop what is below the k-th largest scaled logit (ties with it stay).
  if (o_.top_k > 0 && o_.top_k < n) {
    std::vector<double> v(kept_.size());
    for (size_t i = 0; i < kept_.size(); ++i) v[i] = kept_[i].first;
    std::nth_element(v.begin(), v.begin() + (o_.top_k - 1), v.end(), std::greater<>());
    const double kth = v[static_cast<size_t>(o_.top_k - 1)];
    std::erase_if(kept_, [kth](const auto& e) { return e.first < kth; });
  }
  // Softmax over the survivors.
  double mx = -INFINITY;
  for (const auto& e : kept_) mx = std::max(mx, e.first);
  double sum = 0;
  for (auto& e : kept_) sum += (e.first = std::exp(e.first - mx));
  for (auto& e : kept_) e.first /= sum;
  // Top-p: in ascending probability, drop the ids whose cumulative probability is at most
  // 1 - top_p; the most likely id always stays.
  if (o_.top_p < 1.0) {
    std::sort(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    double cum = 0;
    size_t drop = 0;
    for (size_t i = 0; i + 1 < kept_.size(); ++i) {
      cum += kept_[i].first;
      if (cum > 1.0 - o_.top_p) break;
      drop = i + 1;
    }
    kept_.erase(kept_.begin(), kept_.begin() + static_cast<ptrdiff_t>(drop));
    std::sort(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    double s = 0;
    for (const auto& e : kept_) s += e.first;
    for (auto& e : kept_) e.first /= s;
  }
}

int32_t TokenSampler::next(const float* logits, int n) {
  if (o_.greedy()) return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
  filter(logits, n);
  // 53 random bits -> a double in [0, 1).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double acc = 0;
  for (const auto& e : kept_) {
    acc += e.first;
    if (u < acc) return e.second;
  }
  return kept_.back().second;  // rounding left u just above the last sum
}

std::vector<double> TokenSampler::probabilities(const float* logits, int n) {
  std::vector<double> p(static_cast<size_t>(n), 0.0);
  if (o_.greedy()) {
    p[static_cast<size_t>(std::max_element(logits, logits + n) - logits)] = 1.0;
    return p;
  }
  filter(logits, n);
  for (const auto& e : kept_) p[static_cast<size_t>(e.second)] = e.first;
  return p;
}

}  // namespace dtrain::train
