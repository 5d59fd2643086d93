// xoshiro256** (Blackman and Vigna) with splitmix64 seeding, plus the float, normal and
// bounded-integer conversions used by weight init, dropout and data shuffling.
#include "core/rng.h"

#include "core/check.h"

#include <cmath>

namespace dtrain {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void Rng::seed_reset(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    w = z ^ (z >> 31);
  }
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

float Rng::normal(float mean, float stddev) {
  // u1 in (0, 1] keeps log() finite; computed in double so the tails are accurate.
  double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  return mean + stddev * static_cast<float>(z);
}

uint64_t Rng::below(uint64_t n) {
  DT_ENFORCE_GT(n, 0u, UsageError, "Rng::below needs a positive bound");
  unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * n;
  uint64_t lo = static_cast<uint64_t>(m);
  if (lo < n) {
    uint64_t threshold = (0 - n) % n;
    while (lo < threshold) {
      m = static_cast<unsigned __int128>(next_u64()) * n;
      lo = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace dtrain
