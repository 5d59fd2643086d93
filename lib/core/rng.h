// Deterministic, seedable random numbers (xoshiro256** seeded through splitmix64):
// uniform floats, normals (Box-Muller), unbiased integers below n, and the raw state
// so checkpoints can save and restore a stream exactly.
#pragma once

#include <array>
#include <cstdint>

namespace dtrain {

class Rng {
 public:
  using State = std::array<uint64_t, 4>;

  /// Seeds the 256-bit state from `seed` through splitmix64 (any seed, 0 included, is fine).
  explicit Rng(uint64_t seed = 0) { seed_reset(seed); }
  void seed_reset(uint64_t seed);

  /// Next raw 64-bit output.
  uint64_t next_u64();
  /// Uniform in [0, 1) with 24 random bits (every value exactly representable in fp32).
  float uniform();
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  /// Standard normal * stddev + mean (Box-Muller; consumes two outputs per call, caches
  /// nothing, so state() alone describes the stream).
  float normal(float mean = 0.0f, float stddev = 1.0f);
  /// Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject); n must be > 0.
  uint64_t below(uint64_t n);

  /// The full generator state; set_state(state()) continues the stream exactly.
  State state() const { return s_; }
  void set_state(const State& s) { s_ = s; }

 private:
  State s_{};
};

/// splitmix64 mixing step: derive independent seeds from (seed, counter) pairs.
uint64_t splitmix64(uint64_t x);

}  // namespace dtrain
