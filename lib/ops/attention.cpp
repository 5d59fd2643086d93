// Causal grouped-query attention on the CPU: per-(batch, head) BLAS GEMMs for the four
// products, plain loops for the causal softmax and its backward. Parallel over (b, h)
// pairs; grouped heads' dK/dV are reduced in a fixed order (deterministic).
#include "ops/attention.h"

#include "core/check.h"
#include "ops/linear.h"
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

// Per (batch, head): S = scale * Q K^T and O = P V as BLAS GEMMs over strided head
// views (lda = NH*HD or NKV*HD), with the causal softmax between them. The full T x T
// product is computed and its upper triangle discarded: at CPU sequence lengths BLAS on
// the square beats hand loops on the triangle.
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int NH, int NKV, int HD) {
  attention_check(NH, NKV, HD);
  const int G = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int qs = NH * HD, ks = NKV * HD;
  const size_t pairs = static_cast<size_t>(B) * NH;
  parallel_for(pairs, pairs * T * T * HD, [&](size_t begin, size_t end) {
    for (size_t p = begin; p < end; ++p) {
      const int b = static_cast<int>(p / NH), h = static_cast<int>(p % NH), kh = h / G;
      const float* qh = q + static_cast<size_t>(b) * T * qs + static_cast<size_t>(h) * HD;
      const float* kk = k + static_cast<size_t>(b) * T * ks + static_cast<size_t>(kh) * HD;
      const float* vv = v + static_cast<size_t>(b) * T * ks + static_cast<size_t>(kh) * HD;
      float* a = att + p * T * T;
      gemm_ld(false, true, T, T, HD, scale, qh, qs, kk, ks, 0.0f, a, T);
      for (int t = 0; t < T; ++t) {
        float* row = a + static_cast<size_t>(t) * T;
        float mx = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) mx = row[t2] > mx ? row[t2] : mx;
        float sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          row[t2] = std::exp(row[t2] - mx);
          sum += row[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
      }
      float* oh = out + static_cast<size_t>(b) * T * qs + static_cast<size_t>(h) * HD;
      gemm_ld(false, false, T, HD, T, 1.0f, a, T, vv, ks, 0.0f, oh, qs);
    }
  });
}

// Per (batch, head): dP = dO V^T, dS = P * (dP - rowsum(P * dP)) * scale, then
// dQ += dS K, dK += dS^T Q, dV += P^T dO, all as BLAS GEMMs. With G > 1 query heads
// share a KV head, so each head writes its dK/dV into its own slice of a [B, T, NH, HD]
// scratch, reduced over the group afterwards in head order (race-free, deterministic).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* att,
                        const float* q, const float* k, const float* v, int B, int T, int NH,
                        int NKV, int HD) {
  attention_check(NH, NKV, HD);
  const int G = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int qs = NH * HD, ks = NKV * HD;
  std::vector<float> pk, pv;
  if (G > 1) {
    pk.assign(static_cast<size_t>(B) * T * qs, 0.0f);
    pv.assign(pk.size(), 0.0f);
  }
  const size_t pairs = static_cast<size_t>(B) * NH;
  parallel_for(pairs, pairs * T * T * HD * 2, [&](size_t begin, size_t end) {
    std::vector<float> ds(static_cast<size_t>(T) * T);
    for (size_t p = begin; p < end; ++p) {
      const int b = static_cast<int>(p / NH), h = static_cast<int>(p % NH), kh = h / G;
      const size_t qoff = static_cast<size_t>(b) * T * qs + static_cast<size_t>(h) * HD;
      const size_t koff = static_cast<size_t>(b) * T * ks + static_cast<size_t>(kh) * HD;
      const float* a = att + p * T * T;
      gemm_ld(false, true, T, T, HD, 1.0f, dout + qoff, qs, v + koff, ks, 0.0f, ds.data(), T);
      for (int t = 0; t < T; ++t) {
        const float* pr = a + static_cast<size_t>(t) * T;
        float* dr = ds.data() + static_cast<size_t>(t) * T;
        float dot = 0;
        for (int t2 = 0; t2 <= t; ++t2) dot += pr[t2] * dr[t2];
        for (int t2 = 0; t2 <= t; ++t2) dr[t2] = pr[t2] * (dr[t2] - dot) * scale;
        for (int t2 = t + 1; t2 < T; ++t2) dr[t2] = 0.0f;
      }
      gemm_ld(false, false, T, HD, T, 1.0f, ds.data(), T, k + koff, ks, 1.0f, dq + qoff, qs);
      float* dkh = G > 1 ? pk.data() + qoff : dk + koff;
      float* dvh = G > 1 ? pv.data() + qoff : dv + koff;
      const int ld = G > 1 ? qs : ks;
      gemm_ld(true, false, T, HD, T, 1.0f, ds.data(), T, q + qoff, qs, 1.0f, dkh, ld);
      gemm_ld(true, false, T, HD, T, 1.0f, a, T, dout + qoff, qs, 1.0f, dvh, ld);
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
