// CUDA execution engine (test-only): the subset of cuda_fp16.h dtrain uses. IEEE
// binary16 storage; float -> half rounds to nearest even with gradual underflow and
// overflow to infinity, as __float2half_rn.
#pragma once

#include <cstdint>
#include <cstring>

struct __half {
  uint16_t __x;
};
using half = __half;

inline __half __float2half_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return __half{static_cast<uint16_t>(sign | 0x7e00u)};
  if (abs >= 0x477ff000u) return __half{static_cast<uint16_t>(sign | 0x7c00u)};
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return __half{static_cast<uint16_t>(sign)};
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u, rshift = 126u - (abs >> 23);
    uint32_t h = mant >> rshift;
    const uint32_t rem = mant & ((1u << rshift) - 1u), mid = 1u << (rshift - 1u);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return __half{static_cast<uint16_t>(sign | h)};
  }
  uint32_t r = abs - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return __half{static_cast<uint16_t>(sign | (r >> 13))};
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.__x & 0x8000u) << 16, exp = (h.__x >> 10) & 0x1fu,
                 mant = h.__x & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
      return sign ? -v : v;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The bit pattern as an unsigned short and back (no conversion).
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
