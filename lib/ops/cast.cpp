// Casts, rounding and adds over whole buffers, split over the ops pool (parallel.h) and
// vectorised (simd.h) where the conversion is branch-free enough for the compiler.
#include "ops/cast.h"

#include "ops/parallel.h"
#include "ops/simd.h"

#include <cstring>

namespace dtrain::ops {

namespace {
DT_OPS_SIMD void to_bf16(uint16_t* __restrict d, const float* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
DT_OPS_SIMD void from_bf16(float* __restrict d, const uint16_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}
DT_OPS_SIMD void round_bf16(float* __restrict p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}
DT_OPS_SIMD void round_f16(float* __restrict p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = f16_to_f32(f32_to_f16(p[i]));
}
DT_OPS_SIMD void add_range(float* __restrict d, const float* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}
DT_OPS_SIMD void scale_range(float* __restrict p, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) p[i] *= s;
}
}  // namespace

void cast(void* dst, DType dt, const void* src, DType st, size_t n) {
  if (dt == st) {
    if (n && dst != src) std::memmove(dst, src, n * dtype_size(dt));
    return;
  }
  parallel_for(n, n, [&](size_t b, size_t e) {
    if (st == DType::F32 && dt == DType::BF16) {
      to_bf16(static_cast<uint16_t*>(dst) + b, static_cast<const float*>(src) + b, e - b);
    } else if (st == DType::BF16 && dt == DType::F32) {
      from_bf16(static_cast<float*>(dst) + b, static_cast<const uint16_t*>(src) + b, e - b);
    } else {
      for (size_t i = b; i < e; ++i) dtype_store(dst, i, dt, dtype_load(src, i, st));
    }
  });
}

void round_to(float* p, size_t n, DType t) {
  if (t == DType::F32) return;
  parallel_for(n, n, [&](size_t b, size_t e) {
    if (t == DType::BF16) round_bf16(p + b, e - b);
    else round_f16(p + b, e - b);
  });
}

void add_inplace(float* dst, const float* src, size_t n) {
  parallel_for(n, n, [&](size_t b, size_t e) { add_range(dst + b, src + b, e - b); });
}

void scale_inplace(float* p, size_t n, float s) {
  parallel_for(n, n, [&](size_t b, size_t e) { scale_range(p + b, e - b, s); });
}

}  // namespace dtrain::ops
