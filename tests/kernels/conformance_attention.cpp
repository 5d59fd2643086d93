// Conformance cases for the flash-attention kernels against lib/ops/attention.h: forward
// output and log-sum-exp (reference in double from the same rounded inputs), backward
// dq/dk/dv written over poisoned buffers, with GQA/MQA, head dimensions that exercise
// every register layout (HD <= 64, <= 128, <= 256, not multiples of 32 or of 8) and
// GPT-2's fused qkv rows read and written in place (strided q, k, v), Mistral's sliding
// window at T > window (whole key tiles hidden from a query tile's later rows), and packed
// documents (doc_start: each query sees its own document's keys only).
#include "cases.h"

#include "kernels/attention.cuh"
#include "kernels/attention_internal.cuh"
#include "ops/attention.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace dtrain::kernels::test {

namespace {
// rows x width columns of a [rows, pitch] host array starting at column c0.
Floats columns(const Floats& a, size_t rows, size_t pitch, size_t c0, size_t width) {
  Floats o(rows * width);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < width; ++c) o[r * width + c] = a[r * pitch + c0 + c];
  return o;
}
}  // namespace

std::vector<int32_t> attention_doc_starts(int B, int T, const std::vector<int>& docs) {
  std::vector<int32_t> ds(static_cast<size_t>(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t0 = 0, i = b; t0 < T; ++i) {
      const int len = docs[static_cast<size_t>(i) % docs.size()], t1 = std::min(T, t0 + len);
      for (int t = t0; t < t1; ++t) ds[static_cast<size_t>(b) * T + t] = t0;
      t0 = t1;
    }
  ops::attention_doc_starts_check(ds.data(), B, T);
  return ds;
}

double attention_check(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fused, int window,
                       const std::vector<int>& docs, bool kernel_docs, int variant, std::vector<float>* outputs) {
  // The variant for this call's kernels only (restored on every way out).
  struct VariantScope {
    explicit VariantScope(int v) { detail::attention_variant_for_testing(v); }
    ~VariantScope() { detail::attention_variant_for_testing(0); }
    VariantScope(const VariantScope&) = delete;
    VariantScope& operator=(const VariantScope&) = delete;
  } scope(variant);
  Rng r(seed);
  const size_t N = static_cast<size_t>(B) * T, QW = static_cast<size_t>(NH) * HD, KW = static_cast<size_t>(NKV) * HD;
  const size_t nq = N * QW, nk = N * KW;
  const Floats q = round_through(rand_floats(r, nq), t), k = round_through(rand_floats(r, nk), t);
  const Floats v = round_through(rand_floats(r, nk), t), dout = round_through(rand_floats(r, nq), t);
  const std::vector<int32_t> ds = docs.empty() ? std::vector<int32_t>{} : attention_doc_starts(B, T, docs);
  const int32_t* ds_host = docs.empty() ? nullptr : ds.data();
  Floats out_ref(nq), att(static_cast<size_t>(B) * NH * T * T), dq_ref(nq, 0.0f), dk_ref(nk, 0.0f), dv_ref(nk, 0.0f);
  ops::attention_forward(out_ref.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, 0, 0, window,
                         ds_host);
  ops::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), att.data(), q.data(), k.data(),
                          v.data(), B, T, NH, NKV, HD, 0, 0, window, ds_host);
  // The first key query i of row b sees: t - W + 1 under a window, its document's start.
  auto key_lo = [&](int b, int i) {
    const int lo = window > 0 ? std::max(0, i - window + 1) : 0;
    return ds_host != nullptr ? std::max(lo, static_cast<int>(ds[static_cast<size_t>(b) * T + i])) : lo;
  };
  for (int b = 0; b < B; ++b)  // the reference's probabilities left of it are exactly 0
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i)
        if (const int lo = key_lo(b, i);
            lo > 0 && att[((static_cast<size_t>(b) * NH + h) * T + i) * T + static_cast<size_t>(lo - 1)] != 0.0f)
          return INFINITY;
  // lse[b,h,t] = log sum_{lo<=j<=t} exp(q_t . k_j / sqrt(HD)), in double (lo = key_lo(b, t)).
  Floats lse_ref(static_cast<size_t>(B) * NH * T);
  const int G = NH / NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const float* qi = q.data() + ((static_cast<size_t>(b) * T + i) * NH + h) * HD;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int j = key_lo(b, i); j <= i; ++j) {
          const float* kj = k.data() + ((static_cast<size_t>(b) * T + j) * NKV + h / G) * HD;
          double s = 0;
          for (int d = 0; d < HD; ++d) s += static_cast<double>(qi[d]) * kj[d];
          sc.push_back(s * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double s : sc) sum += std::exp(s - mx);
        lse_ref[(static_cast<size_t>(b) * NH + h) * T + i] = static_cast<float>(mx + std::log(sum));
      }
  DevBuf dD(dout, t), out(nq, t), lse(lse_ref.size(), DType::F32);
  out.poison();
  lse.poison();
  // doc_start on the device (int32, as wide as F32), behind DevBuf's guard zone.
  DevBuf dds(ds.size(), DType::F32);
  if (!ds.empty()) DT_CUDA_CHECK(cudaMemcpy(dds.ptr(), ds.data(), ds.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  const int32_t* ds_dev = kernel_docs && !ds.empty() ? static_cast<const int32_t*>(dds.ptr()) : nullptr;
  // The gradients are poisoned first: the backward writes them (a kernel that accumulated
  // or skipped an element would read or leave NaN).
  double e_fwd = 0, e_bwd = 0;
  if (fused) {  // GPT-2's layout: q, k, v column blocks of one [N, QW + 2 KW] buffer, gradients likewise
    const size_t W = QW + 2 * KW, es = dtype_size(t);
    Floats qkv(N * W);
    for (size_t n = 0; n < N; ++n) {
      std::copy_n(q.begin() + n * QW, QW, qkv.begin() + n * W);
      std::copy_n(k.begin() + n * KW, KW, qkv.begin() + n * W + QW);
      std::copy_n(v.begin() + n * KW, KW, qkv.begin() + n * W + QW + KW);
    }
    DevBuf dqkv(qkv, t), gqkv(N * W, t);
    gqkv.poison();
    char* in = static_cast<char*>(dqkv.ptr());
    char* g = static_cast<char*>(gqkv.ptr());
    const int ws = static_cast<int>(W);
    attention_forward(out.ptr(), lse.f32(), in, in + QW * es, in + (QW + KW) * es, B, T, NH, NKV, HD, ws, ws, t,
                      nullptr, window, ds_dev);
    e_fwd = std::max(buf_err(out, out_ref), buf_err(lse, lse_ref));
    attention_backward(g, g + QW * es, g + (QW + KW) * es, dD.ptr(), out.ptr(), lse.f32(), in, in + QW * es,
                       in + (QW + KW) * es, B, T, NH, NKV, HD, ws, ws, t, nullptr, window, ds_dev);
    if (!gqkv.guard_intact()) return INFINITY;
    const Floats got = gqkv.download();
    if (outputs) {
      *outputs = out.download();
      for (const Floats& f : {lse.download(), got}) outputs->insert(outputs->end(), f.begin(), f.end());
    }
    e_bwd = std::max({max_err(columns(got, N, W, 0, QW), dq_ref), max_err(columns(got, N, W, QW, KW), dk_ref),
                      max_err(columns(got, N, W, QW + KW, KW), dv_ref)});
  } else {
    DevBuf dQ(q, t), dK(k, t), dV(v, t), gq(nq, t), gk(nk, t), gv(nk, t);
    gq.poison();
    gk.poison();
    gv.poison();
    const int qs = static_cast<int>(QW), ks = static_cast<int>(KW);
    attention_forward(out.ptr(), lse.f32(), dQ.ptr(), dK.ptr(), dV.ptr(), B, T, NH, NKV, HD, qs, ks, t, nullptr, window,
                      ds_dev);
    // lse is compared in absolute terms scaled by its magnitude like every other output.
    e_fwd = std::max(buf_err(out, out_ref), buf_err(lse, lse_ref));
    attention_backward(gq.ptr(), gk.ptr(), gv.ptr(), dD.ptr(), out.ptr(), lse.f32(), dQ.ptr(), dK.ptr(), dV.ptr(), B, T,
                       NH, NKV, HD, qs, ks, t, nullptr, window, ds_dev);
    e_bwd = std::max({buf_err(gq, dq_ref), buf_err(gk, dk_ref), buf_err(gv, dv_ref)});
    if (outputs) {
      *outputs = out.download();
      for (const Floats& f : {lse.download(), gq.download(), gk.download(), gv.download()})
        outputs->insert(outputs->end(), f.begin(), f.end());
    }
  }
  if (!dds.guard_intact()) return INFINITY;
  return std::max(e_fwd, e_bwd);
}

double attention_check_variants(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fused, int W,
                                const std::vector<int>& docs) {
  std::vector<float> legacy, fa2;
  const double e = attention_check(t, B, T, NH, NKV, HD, seed, fused, W, docs, true,
                                   static_cast<int>(detail::AttnVariant::LEGACY), &legacy);
  attention_check(t, B, T, NH, NKV, HD, seed, fused, W, docs, true, static_cast<int>(detail::AttnVariant::FA2), &fa2);
  const bool same = legacy.size() == fa2.size() &&
                    (legacy.empty() || std::memcmp(legacy.data(), fa2.data(), legacy.size() * sizeof(float)) == 0);
  return same ? e : INFINITY;
}

std::vector<Case> cases_attention() {
  std::vector<Case> c;
  uint64_t seed = 600, doc_seed = 640;  // the packed documents' rows count apart: others keep their seeds
  struct Shape {
    int B, T, NH, NKV, HD;
    bool fused;
    int W = 0;
    std::vector<int> docs = {};  // packed documents' lengths (attention_check)
  };
  // bf16/fp16 run the tensor-core kernels (64 x 64 tiles: T = 70 and 130 cross tile edges and
  // the causal diagonal; HD 20 takes the unaligned element-wise loads, 72 and 160 pad the head
  // dimension to 128 and 256), fp32 the CUDA-core kernels (32 x 32 tiles). Head dims 129-256
  // on a 99 KB card (the l40s profile) take the CUDA-core backward's 16-row tiles, for bf16 and
  // fp16 too (the tensor-core backward does not fit there): T = 45 crosses 16-row edges, and
  // the HD 200 row its GQA (4 query heads per KV head) with a window.
  for (DType t : ALL_DTYPES)
    for (Shape s :
         {Shape{2, 37, 4, 2, 16, false}, Shape{1, 70, 3, 1, 72, false}, Shape{1, 33, 2, 2, 160, false},
          Shape{2, 32, 2, 2, 64, false}, Shape{1, 130, 2, 2, 32, true}, Shape{1, 45, 4, 2, 20, true},
          // sliding windows: W = 40 at T = 130 hides whole 32- and 64-key tiles from later rows;
          // W = 17, 3 and 2 cut inside tiles (W = 1 leaves dq = dk = 0 exactly: no relative error)
          Shape{1, 130, 2, 1, 32, false, 40}, Shape{2, 70, 4, 2, 16, false, 17}, Shape{1, 45, 4, 2, 20, true, 2},
          Shape{1, 45, 4, 2, 16, false, 3}, Shape{1, 100, 2, 2, 72, false, 64}, Shape{2, 45, 4, 1, 200, false, 20},
          // packed documents (row b's lengths start at docs[b]): boundaries off the 32- and
          // 64-key tile edges and different per row, documents longer than a tile (70, 90, 100),
          // of one token, several in one tile, so forward and dQ skip whole key tiles left of a
          // query tile's first document and dK/dV stop before query tiles past a key tile's
          // documents; GQA and MQA, head dims 32, 64, 128, 33 (element-wise loads) and 160 (the
          // CUDA-core backward's 16-row tiles on the l40s profile), the fused qkv layout, and a
          // window inside the documents (lo = the later of the two)
          Shape{2, 200, 2, 1, 32, false, 0, {1, 70, 9, 46, 5}}, Shape{1, 130, 1, 1, 128, false, 0, {100, 7, 23}},
          Shape{2, 70, 4, 2, 33, false, 0, {5, 31, 1, 40}}, Shape{1, 130, 2, 2, 32, true, 0, {33, 64, 1}},
          Shape{1, 130, 2, 1, 64, false, 40, {90, 3, 37}}, Shape{1, 70, 1, 1, 160, false, 0, {17, 20, 1}}}) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "attention fwd+bwd B=%d T=%d NH=%d NKV=%d HD=%d%s", s.B, s.T, s.NH, s.NKV, s.HD,
                    s.fused ? " qkv" : "");
      std::string name = buf;
      if (s.W > 0) name += " window=" + std::to_string(s.W);
      for (size_t i = 0; i < s.docs.size(); ++i) name += (i == 0 ? " docs=" : ",") + std::to_string(s.docs[i]);
      // bf16/fp16 at head dims 33-128: the legacy variant against the reference, and the fa2
      // variant's kernels (128-row forward and dQ tiles where the card's shared memory holds
      // them, the dK/dV mask on cut tiles only) bit for bit against legacy's.
      const bool variants = t != DType::F32 && s.HD > 32 && s.HD <= 128;
      if (variants) name += " legacy=fa2";
      c.push_back({name, t,
                   [=, row_seed = s.docs.empty() ? seed++ : doc_seed++] {
                     return variants ? attention_check_variants(t, s.B, s.T, s.NH, s.NKV, s.HD, row_seed, s.fused, s.W,
                                                                s.docs)
                                     : attention_check(t, s.B, s.T, s.NH, s.NKV, s.HD, row_seed, s.fused, s.W, s.docs);
                   },
                   tol_for(t, 1e-4)});
    }
  return c;
}

}  // namespace dtrain::kernels::test
