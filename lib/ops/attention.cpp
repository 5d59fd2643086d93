// Attention as explicit loops (llm.c style). Forward is parallel over (b, h, t) query
// rows; backward over (b, h) pairs, with grouped heads' dk/dv contributions reduced in a
// fixed order afterwards (race-free and deterministic). Per-(b,h) BLAS GEMMs do not pay
// at the head sizes and sequence lengths CPU training uses.
#include "ops/attention.h"

#include "core/check.h"
#include "ops/parallel.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace dtrain::ops {

namespace {
void attention_check(int NH, int NKV, int HD) {
  DT_ENFORCE(NKV > 0 && NH % NKV == 0, UsageError,
             "attention needs n_head ({}) to be a multiple of n_kv_head ({})", NH, NKV);
  DT_ENFORCE_GT(HD, 0, UsageError, "attention head dimension");
}
}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int NH, int NKV, int HD) {
  attention_check(NH, NKV, HD);
  const int G = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const size_t rows = static_cast<size_t>(B) * NH * T;
  const size_t qs = static_cast<size_t>(NH) * HD, ks = static_cast<size_t>(NKV) * HD;
  parallel_for(rows, rows * T * HD / 2, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const int t = static_cast<int>(r % T);
      const int h = static_cast<int>((r / T) % NH);
      const int b = static_cast<int>(r / (static_cast<size_t>(T) * NH));
      const int kh = h / G;
      const float* qr = q + (static_cast<size_t>(b) * T + t) * qs + static_cast<size_t>(h) * HD;
      float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
      float mx = -INFINITY;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* kr = k + (static_cast<size_t>(b) * T + t2) * ks + static_cast<size_t>(kh) * HD;
        float s = 0;
        for (int i = 0; i < HD; ++i) s += qr[i] * kr[i];
        s *= scale;
        a[t2] = s;
        mx = s > mx ? s : mx;
      }
      float sum = 0;
      for (int t2 = 0; t2 <= t; ++t2) {
        a[t2] = std::exp(a[t2] - mx);
        sum += a[t2];
      }
      const float inv = 1.0f / sum;
      for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
      for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0.0f;
      float* o = out + (static_cast<size_t>(b) * T + t) * qs + static_cast<size_t>(h) * HD;
      for (int i = 0; i < HD; ++i) o[i] = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* vr = v + (static_cast<size_t>(b) * T + t2) * ks + static_cast<size_t>(kh) * HD;
        const float w = a[t2];
        for (int i = 0; i < HD; ++i) o[i] += w * vr[i];
      }
    }
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* att,
                        const float* q, const float* k, const float* v, int B, int T, int NH,
                        int NKV, int HD) {
  attention_check(NH, NKV, HD);
  const int G = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const size_t qs = static_cast<size_t>(NH) * HD, ks = static_cast<size_t>(NKV) * HD;
  // With G > 1 each query head writes its dk/dv contribution into its own slice of a
  // [B, T, NH, HD] scratch, reduced over the group afterwards in head order; with G == 1
  // the head owns its KV rows and accumulates into dk/dv directly.
  std::vector<float> pk, pv;
  if (G > 1) {
    pk.assign(static_cast<size_t>(B) * T * qs, 0.0f);
    pv.assign(pk.size(), 0.0f);
  }
  const size_t pairs = static_cast<size_t>(B) * NH;
  parallel_for(pairs, static_cast<size_t>(B) * NH * T * T * HD, [&](size_t begin, size_t end) {
    std::vector<float> dpre(static_cast<size_t>(T));
    for (size_t p = begin; p < end; ++p) {
      const int b = static_cast<int>(p / NH), h = static_cast<int>(p % NH), kh = h / G;
      for (int t = 0; t < T; ++t) {
        const size_t qo = (static_cast<size_t>(b) * T + t) * qs + static_cast<size_t>(h) * HD;
        const float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        const float* d = dout + qo;
        // datt[t2] = dout . v[t2]; dpre = a * (datt - sum_j a_j datt_j)
        float dot = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* vr = v + (static_cast<size_t>(b) * T + t2) * ks + static_cast<size_t>(kh) * HD;
          float s = 0;
          for (int i = 0; i < HD; ++i) s += d[i] * vr[i];
          dpre[static_cast<size_t>(t2)] = s;
          dot += a[t2] * s;
        }
        const float* qr = q + qo;
        float* dqr = dq + qo;
        for (int t2 = 0; t2 <= t; ++t2) {
          const size_t ko = (static_cast<size_t>(b) * T + t2) * ks + static_cast<size_t>(kh) * HD;
          const size_t po = (static_cast<size_t>(b) * T + t2) * qs + static_cast<size_t>(h) * HD;
          const float g = a[t2] * (dpre[static_cast<size_t>(t2)] - dot) * scale;
          const float* kr = k + ko;
          float* dkr = G > 1 ? pk.data() + po : dk + ko;
          float* dvr = G > 1 ? pv.data() + po : dv + ko;
          const float w = a[t2];
          for (int i = 0; i < HD; ++i) {
            dqr[i] += g * kr[i];
            dkr[i] += g * qr[i];
            dvr[i] += w * d[i];
          }
        }
      }
    }
  });
  if (G == 1) return;
  const size_t rows = static_cast<size_t>(B) * T;
  parallel_for(rows, rows * qs, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r)
      for (int kh = 0; kh < NKV; ++kh) {
        float* dkr = dk + r * ks + static_cast<size_t>(kh) * HD;
        float* dvr = dv + r * ks + static_cast<size_t>(kh) * HD;
        for (int h = kh * G; h < (kh + 1) * G; ++h) {
          const float* a = pk.data() + r * qs + static_cast<size_t>(h) * HD;
          const float* c = pv.data() + r * qs + static_cast<size_t>(h) * HD;
          for (int i = 0; i < HD; ++i) {
            dkr[i] += a[i];
            dvr[i] += c[i];
          }
        }
      }
  });
}

}  // namespace dtrain::ops
