// RoPE. The angles t * inv_freq are formed in double and rounded once to fp32 cos/sin,
// so the table is exact to fp32 for any position (HF forms them in fp32, which differs
// by ~t*eps at large t; both are within the ops' test tolerance).
#include "ops/rope.h"

#include "core/check.h"
#include "ops/parallel.h"
#include "ops/simd.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace dtrain::ops {

namespace {

// One head vector: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) over its two halves.
DT_OPS_SIMD void rotate(float* __restrict v, const float* __restrict c, const float* __restrict s, int half,
                        float sign) {
  for (int i = 0; i < half; ++i) {
    const float x1 = v[i], x2 = v[i + half];
    const float si = sign * s[i];
    v[i] = x1 * c[i] - x2 * si;
    v[i + half] = x2 * c[i] + x1 * si;
  }
}

void rope_apply(float* x, int B, int T, int H, int HD, size_t stride, const std::vector<float>& cs,
                const std::vector<float>& sn, float sign, const int32_t* doc_start) {
  const int half = HD / 2;
  const size_t rows = static_cast<size_t>(B) * T;
  parallel_for(rows, rows * H * HD, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const int t = static_cast<int>(r % static_cast<size_t>(T)) - (doc_start != nullptr ? doc_start[r] : 0);
      const float* c = cs.data() + static_cast<size_t>(t) * half;
      const float* s = sn.data() + static_cast<size_t>(t) * half;
      for (int h = 0; h < H; ++h) rotate(x + r * stride + static_cast<size_t>(h) * HD, c, s, half, sign);
    }
  });
}

void rope_run(float* q, float* k, int B, int T, int NH, int NKV, int HD, const RopeFreq& rope, float sign,
              const int32_t* doc_start, int q_stride, int kv_stride) {
  DT_ENFORCE(HD % 2 == 0, UsageError, "rope needs an even head dimension, got {}", HD);
  const size_t qs = q_stride > 0 ? static_cast<size_t>(q_stride) : static_cast<size_t>(NH) * HD;
  const size_t ks = kv_stride > 0 ? static_cast<size_t>(kv_stride) : static_cast<size_t>(NKV) * HD;
  DT_ENFORCE(qs >= static_cast<size_t>(NH) * HD && (k == nullptr || ks >= static_cast<size_t>(NKV) * HD), UsageError,
             "rope: a row stride ({} for q, {} for k) below the row's heads ({} x {}, {} x {})", qs, ks, NH, HD, NKV,
             HD);
  const int half = HD / 2;
  std::vector<float> cs(static_cast<size_t>(T) * half), sn(cs.size());
  for (int i = 0; i < half; ++i) {
    const double inv_freq = rope_inv_freq(rope, i, HD);
    for (int t = 0; t < T; ++t) {
      double a = t * inv_freq;
      cs[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  }
  rope_apply(q, B, T, NH, HD, qs, cs, sn, sign, doc_start);
  if (k) rope_apply(k, B, T, NKV, HD, ks, cs, sn, sign, doc_start);
}

}  // namespace

void rope_forward(float* q, float* k, int B, int T, int NH, int NKV, int HD, const RopeFreq& rope,
                  const int32_t* doc_start, int q_stride, int kv_stride) {
  rope_run(q, k, B, T, NH, NKV, HD, rope, 1.0f, doc_start, q_stride, kv_stride);
}

void rope_backward(float* dq, float* dk, int B, int T, int NH, int NKV, int HD, const RopeFreq& rope,
                   const int32_t* doc_start, int q_stride, int kv_stride) {
  rope_run(dq, dk, B, T, NH, NKV, HD, rope, -1.0f, doc_start, q_stride, kv_stride);
}

}  // namespace dtrain::ops
