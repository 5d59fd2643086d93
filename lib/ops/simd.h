// Vectorisable building blocks of the CPU ops (private to lib/ops): an expf the compiler
// turns into SIMD code (libm's expf is a call per element), tanh and sigmoid built on it,
// lane-wise sums with a fixed order, and DT_OPS_SIMD, which compiles a hot loop twice
// (AVX2+FMA and the baseline) and picks one at load time.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

// x86-64-v3 = AVX2 + FMA; the baseline clone keeps the binary running anywhere. The
// project builds in ISO C++ mode, so GCC does not contract a*b+c into FMAs
// (-ffp-contract=off): both clones compute bit-identical results, only wider.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
#define DT_OPS_SIMD __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DT_OPS_SIMD
#endif

namespace dtrain::ops::simd {

/// Lanes of the fixed-order reductions: sums are accumulated in LANES interleaved
/// partial sums (element i into lane i % LANES) and the lanes added in a fixed tree, so
/// the result does not depend on the instruction set or the thread count.
inline constexpr size_t LANES = 8;

/// expf with about 2 ulp of error over the normal range, branch-free so loops of it
/// vectorise (Cephes' polynomial after a round-to-nearest range reduction). Inputs below
/// -87.3 give ~1e-38 instead of a denormal or 0; above 88 they saturate at ~1.65e38
/// (the ops only pass max-shifted, non-positive values, or clamp first). NaN stays NaN.
inline float exp(float x) {
  constexpr float hi = 88.0f, lo = -87.3f;  // round(hi / ln2) + 127 must stay below 255
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  // n = round(x / ln2) by the 1.5 * 2^23 trick (round-to-nearest, no libm call).
  constexpr float magic = 12582912.0f;
  const float fn = (x * 1.44269504088896341f + magic) - magic;
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = static_cast<int32_t>(fn) + 127;
  return p * std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
}

/// tanh(x) = 1 - 2 / (1 + e^{2x}): absolute error ~1e-7 (all GELU needs: it adds 1).
inline float tanh(float x) { return 1.0f - 2.0f / (1.0f + exp(2.0f * x)); }

/// 1 / (1 + e^{-x})
inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

/// Adds LANES partial sums in a fixed tree.
inline double lanes_sum(const float* acc) {
  return ((static_cast<double>(acc[0]) + acc[4]) + (static_cast<double>(acc[1]) + acc[5])) +
         ((static_cast<double>(acc[2]) + acc[6]) + (static_cast<double>(acc[3]) + acc[7]));
}

}  // namespace dtrain::ops::simd
