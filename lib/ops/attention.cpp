// Causal grouped-query attention on the CPU: per-(batch, head) BLAS GEMMs for the four
// products, vectorised row loops (simd.h) for the causal softmax and its backward.
// Parallel over (b, h) pairs; grouped heads' dK/dV are reduced in a fixed order
// (deterministic).
#include "ops/attention.h"

#include "core/check.h"
#include "core/error.h"
#include "ops/linear.h"
#include "ops/parallel.h"
#include "ops/simd.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dtrain::ops {

namespace {

using simd::LANES;

// Query rows per causal block (see attention_forward).
constexpr int ATT_QB = 64;

// Causal softmax of one score row in place: entries [lo, len) normalised (lo > 0 under a
// sliding window), the rest zeroed.
DT_OPS_SIMD void softmax_row(float* __restrict row, int lo, int len, int T) {
  for (int j = 0; j < lo; ++j) row[j] = 0.0f;
  row += lo;
  len -= lo;
  T -= lo;
  float mx = row[0];
  for (int i = 1; i < len; ++i) mx = row[i] > mx ? row[i] : mx;
  float acc[LANES] = {};
  size_t i = 0;
  const size_t n = static_cast<size_t>(len);
  for (; i + LANES <= n; i += LANES)
    for (size_t k = 0; k < LANES; ++k) {
      const float e = simd::exp(row[i + k] - mx);
      row[i + k] = e;
      acc[k] += e;
    }
  for (size_t k = 0; i + k < n; ++k) {
    const float e = simd::exp(row[i + k] - mx);
    row[i + k] = e;
    acc[k] += e;
  }
  const float inv = static_cast<float>(1.0 / simd::lanes_sum(acc));
  for (int j = 0; j < len; ++j) row[j] *= inv;
  for (int j = len; j < T; ++j) row[j] = 0.0f;
}

// dS row from P and dP: dS = P * (dP - sum(P * dP)) * scale over [lo, len), zero elsewhere.
DT_OPS_SIMD void softmax_bwd_row(float* __restrict dr, const float* __restrict pr, int lo, int len, int T,
                                 float scale) {
  for (int j = 0; j < lo; ++j) dr[j] = 0.0f;
  dr += lo;
  pr += lo;
  len -= lo;
  T -= lo;
  float acc[LANES] = {};
  size_t i = 0;
  const size_t n = static_cast<size_t>(len);
  for (; i + LANES <= n; i += LANES)
    for (size_t k = 0; k < LANES; ++k) acc[k] += pr[i + k] * dr[i + k];
  for (size_t k = 0; i + k < n; ++k) acc[k] += pr[i + k] * dr[i + k];
  const float dot = static_cast<float>(simd::lanes_sum(acc));
  for (int j = 0; j < len; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
  for (int j = len; j < T; ++j) dr[j] = 0.0f;
}

// First key query t of a row sees: 0, t - window + 1 under a sliding window, and no key
// before its document's start (ds: the row's doc_start entries, or nullptr).
int key_lo(int t, int window, const int32_t* ds) {
  const int lo = window > 0 ? std::max(0, t - window + 1) : 0;
  return ds != nullptr ? std::max(lo, static_cast<int>(ds[t])) : lo;
}

void attention_check(int NH, int NKV, int HD, int window) {
  DT_ENFORCE(window >= 0, UsageError, "attention sliding window {} must be >= 0 (0: none)", window);
  DT_ENFORCE(NKV > 0 && NH % NKV == 0, UsageError, "attention needs n_head ({}) to be a multiple of n_kv_head ({})", NH,
             NKV);
  DT_ENFORCE_GT(HD, 0, UsageError, "attention head dimension");
}
}  // namespace

void attention_doc_starts_check(const int32_t* doc_start, int B, int T) {
  for (int b = 0; b < B; ++b) {
    const int32_t* ds = doc_start + static_cast<size_t>(b) * T;
    for (int t = 0; t < T; ++t)
      DT_ENFORCE(ds[t] == (t == 0 ? 0 : ds[t - 1]) || ds[t] == t, UsageError,
                 "document start {} at row {} position {} is neither the previous position's start ({}) nor {} (a "
                 "new document)",
                 ds[t], b, t, t == 0 ? 0 : ds[t - 1], t);
  }
}

// Per (batch, head): S = scale * Q K^T and O = P V as BLAS GEMMs over strided head
// views (lda = the row strides), with the causal softmax between them. Query rows go in
// blocks of ATT_QB: block [q0, q1) attends to keys [lo(q0), q1) only (lo: key_lo, the
// block's smallest), so the GEMMs skip most of the masked upper triangle (at T = 128 they
// do 3/4 of the square's work, at 1024 under 9/16) and, with a window or packed
// documents, the keys left of it, while each stays a BLAS call; the never-computed scores
// are zero in att, as the softmax leaves them.
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HD, int q_stride, int kv_stride, int window, const int32_t* doc_start) {
  attention_check(NH, NKV, HD, window);
  const int G = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int os = NH * HD;  // out is dense
  const int qs = q_stride ? q_stride : os, ks = kv_stride ? kv_stride : NKV * HD;
  DT_ENFORCE(qs >= os && ks >= NKV * HD, UsageError, "attention: row strides ({}, {}) below the widths ({}, {})", qs,
             ks, os, NKV * HD);
  const size_t pairs = static_cast<size_t>(B) * NH;
  parallel_for(pairs, pairs * T * T * HD, [&](size_t begin, size_t end) {
    for (size_t p = begin; p < end; ++p) {
      const int b = static_cast<int>(p / NH), h = static_cast<int>(p % NH), kh = h / G;
      const float* qh = q + static_cast<size_t>(b) * T * qs + static_cast<size_t>(h) * HD;
      const float* kk = k + static_cast<size_t>(b) * T * ks + static_cast<size_t>(kh) * HD;
      const float* vv = v + static_cast<size_t>(b) * T * ks + static_cast<size_t>(kh) * HD;
      const int32_t* ds = doc_start != nullptr ? doc_start + static_cast<size_t>(b) * T : nullptr;
      float* a = att + p * T * T;
      float* oh = out + static_cast<size_t>(b) * T * os + static_cast<size_t>(h) * HD;
      for (int q0 = 0; q0 < T; q0 += ATT_QB) {
        const int q1 = std::min(T, q0 + ATT_QB), m = q1 - q0, k0 = key_lo(q0, window, ds);
        float* ab = a + static_cast<size_t>(q0) * T;
        gemm_ld(false, true, m, q1 - k0, HD, scale, qh + static_cast<size_t>(q0) * qs, qs,
                kk + static_cast<size_t>(k0) * ks, ks, 0.0f, ab + k0, T);
        for (int t = q0; t < q1; ++t) softmax_row(a + static_cast<size_t>(t) * T, key_lo(t, window, ds), t + 1, T);
        gemm_ld(false, false, m, HD, q1 - k0, 1.0f, ab + k0, T, vv + static_cast<size_t>(k0) * ks, ks, 0.0f,
                oh + static_cast<size_t>(q0) * os, os);
      }
    }
  });
}

// Per (batch, head): dP = dO V^T, dS = P * (dP - rowsum(P * dP)) * scale, then
// dQ += dS K, dK += dS^T Q, dV += P^T dO, all as BLAS GEMMs over the forward's causal
// query blocks and key ranges (dS and P are zero outside them). With
// G > 1 query heads share a KV head, so each head writes its dK/dV into its own slice of
// a [B, T, NH, HD] scratch, reduced over the group afterwards in head order (race-free,
// deterministic).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* att, const float* q,
                        const float* k, const float* v, int B, int T, int NH, int NKV, int HD, int q_stride,
                        int kv_stride, int window, const int32_t* doc_start) {
  attention_check(NH, NKV, HD, window);
  const int G = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int os = NH * HD;  // dout and the grouped-head scratch are dense
  const int qs = q_stride ? q_stride : os, ks = kv_stride ? kv_stride : NKV * HD;
  DT_ENFORCE(qs >= os && ks >= NKV * HD, UsageError, "attention: row strides ({}, {}) below the widths ({}, {})", qs,
             ks, os, NKV * HD);
  std::vector<float> pk, pv;
  if (G > 1) {
    pk.assign(static_cast<size_t>(B) * T * os, 0.0f);
    pv.assign(pk.size(), 0.0f);
  }
  const size_t pairs = static_cast<size_t>(B) * NH;
  parallel_for(pairs, pairs * T * T * HD * 2, [&](size_t begin, size_t end) {
    std::vector<float> dsm(static_cast<size_t>(T) * T);
    for (size_t p = begin; p < end; ++p) {
      const int b = static_cast<int>(p / NH), h = static_cast<int>(p % NH), kh = h / G;
      const size_t row0 = static_cast<size_t>(b) * T;
      const size_t ooff = row0 * os + static_cast<size_t>(h) * HD;   // dout, scratch
      const size_t qoff = row0 * qs + static_cast<size_t>(h) * HD;   // q, dq
      const size_t koff = row0 * ks + static_cast<size_t>(kh) * HD;  // k, v, dk, dv
      const int32_t* ds = doc_start != nullptr ? doc_start + static_cast<size_t>(b) * T : nullptr;
      const float* a = att + p * T * T;
      float* dkh = G > 1 ? pk.data() + ooff : dk + koff;
      float* dvh = G > 1 ? pv.data() + ooff : dv + koff;
      const int ld = G > 1 ? os : ks;
      // Query block [q0, q1) against keys [k0, q1), as in the forward.
      for (int q0 = 0; q0 < T; q0 += ATT_QB) {
        const int q1 = std::min(T, q0 + ATT_QB), m = q1 - q0, k0 = key_lo(q0, window, ds), n = q1 - k0;
        float* dsb = dsm.data() + static_cast<size_t>(q0) * T;
        const float* ab = a + static_cast<size_t>(q0) * T;
        const float* dob = dout + ooff + static_cast<size_t>(q0) * os;
        const size_t qb = qoff + static_cast<size_t>(q0) * qs, kb = koff + static_cast<size_t>(k0) * ks;
        gemm_ld(false, true, m, n, HD, 1.0f, dob, os, v + kb, ks, 0.0f, dsb + k0, T);
        for (int t = q0; t < q1; ++t)
          softmax_bwd_row(dsm.data() + static_cast<size_t>(t) * T, a + static_cast<size_t>(t) * T,
                          key_lo(t, window, ds), t + 1, T, scale);
        gemm_ld(false, false, m, HD, n, 1.0f, dsb + k0, T, k + kb, ks, 1.0f, dq + qb, qs);
        float* dkb = dkh + static_cast<size_t>(k0) * ld;
        float* dvb = dvh + static_cast<size_t>(k0) * ld;
        gemm_ld(true, false, n, HD, m, 1.0f, dsb + k0, T, q + qb, qs, 1.0f, dkb, ld);
        gemm_ld(true, false, n, HD, m, 1.0f, ab + k0, T, dob, os, 1.0f, dvb, ld);
      }
    }
  });
  if (G == 1) return;
  const size_t rows = static_cast<size_t>(B) * T;
  parallel_for(rows, rows * os, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r)
      for (int kh = 0; kh < NKV; ++kh) {
        float* dkr = dk + r * ks + static_cast<size_t>(kh) * HD;
        float* dvr = dv + r * ks + static_cast<size_t>(kh) * HD;
        for (int h = kh * G; h < (kh + 1) * G; ++h) {
          const float* a = pk.data() + r * os + static_cast<size_t>(h) * HD;
          const float* c = pv.data() + r * os + static_cast<size_t>(h) * HD;
          for (int i = 0; i < HD; ++i) {
            dkr[i] += a[i];
            dvr[i] += c[i];
          }
        }
      }
  });
}

}  // namespace dtrain::ops
