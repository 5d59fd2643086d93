// Next-token choice for generation: greedy (argmax), or sampling from the temperature-
// scaled softmax after top-k and top-p filtering, in the order and with the rules of
// Hugging Face transformers' logits warpers (temperature, then top-k, then top-p).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace dtrain::train {

struct SamplingOptions {
  double temperature = 0.0;  ///< <= 0: greedy (the first argmax); else sample from softmax(logits / temperature)
  int top_k = 0;             ///< > 0: only ids whose scaled logit is at least the k-th largest (ties kept)
  double top_p = 1.0;        ///< < 1: only the smallest set of most likely ids whose probability reaches top_p
                             ///< (0: the most likely id alone)
  uint64_t seed = 0;         ///< the sampler's generator (std::mt19937_64): same seed, same tokens
  bool greedy() const { return temperature <= 0.0; }
};

/// One stream of next-token choices. Sampling draws one uniform number per token from a
/// std::mt19937_64 seeded with options.seed (its bits turned into [0, 1) here, not by a
/// library distribution, so the choices are the same with any standard library).
class TokenSampler {
 public:
  explicit TokenSampler(const SamplingOptions& options);

  /// The next id among logits[0, n).
  int32_t next(const float* logits, int n);

  /// The probabilities next() samples from (n of them, zero for filtered ids), for tests.
  std::vector<double> probabilities(const float* logits, int n);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<double, int32_t>> kept_;  // (scaled logit, id), then (probability, id)

  void filter(const float* logits, int n);  // fills kept_ with the ids that survive, as probabilities
};

}  // namespace dtrain::train
