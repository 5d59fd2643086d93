// dtype conversions: exhaustive fp16/bf16 round trips, round-to-nearest-even ties,
// overflow and underflow behaviour checked against a double-precision reference.
#include "core/dtype.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace dtrain;

namespace {
// Reference: nearest representable value by exhaustive search over all 65536 fp16
// patterns is too slow per call, so compare against the neighbours instead.
double f16_value(uint16_t h) { return static_cast<double>(f16_to_f32(h)); }
}  // namespace

TEST_CASE("every finite fp16 and bf16 value round-trips exactly") {
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t x = static_cast<uint16_t>(h);
    float f = f16_to_f32(x);
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      CHECK(f32_to_f16(f) == x);
    }
    float b = bf16_to_f32(x);
    if (std::isnan(b)) {
      CHECK(std::isnan(bf16_to_f32(f32_to_bf16(b))));
    } else {
      CHECK(f32_to_bf16(b) == x);
    }
  }
}

TEST_CASE("fp16 conversion rounds to the nearest value, ties to even") {
  // Walk every adjacent pair of positive finite fp16 values and test the midpoint and
  // points just either side of it.
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    double lo = f16_value(h), hi = f16_value(static_cast<uint16_t>(h + 1));
    double mid = (lo + hi) / 2;
    float below = std::nextafter(static_cast<float>(mid), -1.0f);
    float above = std::nextafter(static_cast<float>(mid), 2.0f * static_cast<float>(hi));
    if (static_cast<double>(static_cast<float>(mid)) == mid) {
      uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
      REQUIRE(f32_to_f16(static_cast<float>(mid)) == even);
    }
    if (below > lo) REQUIRE(f32_to_f16(below) == h);
    if (above < hi) REQUIRE(f32_to_f16(above) == h + 1);
  }
  CHECK(f32_to_f16(65520.0f) == 0x7c00);  // rounds up to inf
  CHECK(f32_to_f16(65519.0f) == 0x7bff);  // largest finite
  CHECK(f32_to_f16(-1e10f) == 0xfc00);
  CHECK(f32_to_f16(1e-10f) == 0x0000);
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // tie with zero -> even (0)
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
}

TEST_CASE("bf16 conversion rounds to nearest even") {
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(f32_to_bf16(bits_f32(0x3f808001u)) == 0x3f81);
  CHECK(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  DType t;
  CHECK(dtype_parse("bf16", &t));
  CHECK(t == DType::BF16);
  CHECK_FALSE(dtype_parse("int8", &t));
}
