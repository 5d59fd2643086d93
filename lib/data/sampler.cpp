// DistributedSampler. The permutation uses its own generator (splitmix64 + Lemire's
// unbiased bounded draw + Fisher-Yates) so the order is identical on every platform
// and standard library, which std::shuffle does not promise.
#include "data/sampler.h"

#include "core/check.h"

#include <numeric>

namespace dtrain::data {

namespace {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound >= 1.
  uint64_t below(uint64_t bound) {
    __uint128_t m = static_cast<__uint128_t>(next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<__uint128_t>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

}  // namespace

DistributedSampler::DistributedSampler(size_t num_samples, int rank, int world_size, uint64_t seed, bool shuffle,
                                       bool drop_last)
    : n_(num_samples), rank_(rank), world_(world_size), seed_(seed), shuffle_(shuffle), drop_last_(drop_last) {
  DT_ENFORCE_GT(n_, size_t{0}, ConfigError, "the dataset has no samples");
  DT_ENFORCE_GT(world_, 0, ConfigError, "world size must be positive");
  DT_ENFORCE(rank_ >= 0 && rank_ < world_, ConfigError, "rank {} is outside [0, {})", rank_, world_);
  DT_ENFORCE(!drop_last_ || n_ >= static_cast<size_t>(world_), ConfigError,
             "{} samples cannot give each of {} ranks one sample with drop_last; use a larger dataset or "
             "drop_last: false",
             n_, world_);
}

std::vector<size_t> DistributedSampler::permutation(uint64_t epoch) const {
  std::vector<size_t> p(n_);
  std::iota(p.begin(), p.end(), size_t{0});
  if (!shuffle_) return p;
  SplitMix64 mix{seed_};
  SplitMix64 rng{mix.next() ^ (epoch * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull)};
  for (size_t i = n_ - 1; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
  return p;
}

bool DistributedSampler::step_fits(uint64_t offset) const {
  return drop_last_ ? offset + static_cast<uint64_t>(world_) <= n_ : offset < n_;
}

size_t DistributedSampler::steps_per_epoch() const {
  const size_t w = static_cast<size_t>(world_);
  return drop_last_ ? n_ / w : (n_ + w - 1) / w;
}

size_t DistributedSampler::next() {
  if (!step_fits(offset_)) {
    ++epoch_;
    offset_ = 0;
  }
  if (perm_epoch_ != epoch_) {
    perm_ = permutation(epoch_);
    perm_epoch_ = epoch_;
  }
  const size_t idx = perm_[(offset_ + static_cast<uint64_t>(rank_)) % n_];
  offset_ += static_cast<uint64_t>(world_);
  return idx;
}

void DistributedSampler::set_position(SamplerPosition position) {
  epoch_ = position.epoch;
  offset_ = position.offset;
}

}  // namespace dtrain::data
