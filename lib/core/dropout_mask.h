// The dropout mask as a pure function of (seed, element index): counter-based, so the
// CPU op and the CUDA kernel (any thread order) draw the same mask, and recomputation
// replays it from the seed alone.
#pragma once

#include "core/host_device.h"

#include <cstdint>

namespace dtrain {

/// The splitmix64 finaliser (Steele, Lea, Flood 2014).
DT_HOST_DEVICE inline uint64_t mask_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// True when element i survives dropout with probability p: a uniform draw with 24 bits
/// (exact in fp32) compared against p.
DT_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t i, float p) {
  const uint64_t h = mask_mix64(seed ^ mask_mix64(i));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f) >= p;
}

}  // namespace dtrain
