// Storage dtypes (fp32, bf16, fp16) and round-to-nearest-even conversions between
// them. Header-only and C++17 so CUDA host code can include it; bf16 and fp16 are
// stored as raw uint16_t bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace dtrain {

enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  return t == DType::F32 ? "float32" : t == DType::BF16 ? "bfloat16" : "float16";
}
// Accepts the names used in configs, safetensors and nccl-tests: float/float32/fp32/f32,
// bfloat16/bf16, half/float16/fp16/f16. Returns false when unknown.
inline bool dtype_parse(std::string_view s, DType* out) {
  if (s == "float32" || s == "float" || s == "fp32" || s == "f32" || s == "F32") {
    *out = DType::F32;
    return true;
  }
  if (s == "bfloat16" || s == "bf16" || s == "BF16") {
    *out = DType::BF16;
    return true;
  }
  if (s == "float16" || s == "half" || s == "fp16" || s == "f16" || s == "F16") {
    *out = DType::F16;
    return true;
  }
  return false;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------
// bf16: the top 16 bits of an fp32, rounded to nearest even; NaN stays a quiet NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// ---------------------------------------------------------------------------
// fp16 (IEEE binary16): round to nearest even, overflow to inf, gradual underflow.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs < 0x38800000u) {                                               // < 2^-14: subnormal
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);           // < 2^-25: zero
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(e-150); in units of the fp16 subnormal step 2^-24 that is
    // mant >> (126 - e), with e in 102..112 here.
    uint32_t rshift = 126u - (abs >> 23);
    uint32_t half = mant >> rshift;
    uint32_t rem = mant & ((1u << rshift) - 1u);
    uint32_t mid = 1u << (rshift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even on 13 dropped bits
  return static_cast<uint16_t>(sign | (r >> 13));
}
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Convert one element between dtypes (slow path; loops belong to ops/kernels).
inline float dtype_load(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}
inline void dtype_store(void* p, size_t i, DType t, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
  }
}

}  // namespace dtrain
