// Conformance cases for the flash-attention kernels against lib/ops/attention.h: forward
// output and log-sum-exp (reference in double from the same rounded inputs), backward
// dq/dk/dv written over poisoned buffers, with GQA/MQA, head dimensions that exercise
// every register layout (HD <= 64, <= 128, <= 256, not multiples of 32 or of 8) and
// GPT-2's fused qkv rows read and written in place (strided q, k, v), and Mistral's
// sliding window at T > window (whole key tiles hidden from a query tile's later rows).
#include "cases.h"

#include "kernels/attention.cuh"
#include "ops/attention.h"

#include <cstdio>
#include <cstring>

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

double attention_check(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fused, int window) {
  Rng r(seed);
  const size_t N = static_cast<size_t>(B) * T, QW = static_cast<size_t>(NH) * HD, KW = static_cast<size_t>(NKV) * HD;
  const size_t nq = N * QW, nk = N * KW;
  const Floats q = round_through(rand_floats(r, nq), t), k = round_through(rand_floats(r, nk), t);
  const Floats v = round_through(rand_floats(r, nk), t), dout = round_through(rand_floats(r, nq), t);
  Floats out_ref(nq), att(static_cast<size_t>(B) * NH * T * T), dq_ref(nq, 0.0f), dk_ref(nk, 0.0f), dv_ref(nk, 0.0f);
  ops::attention_forward(out_ref.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, 0, 0, window);
  ops::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), att.data(), q.data(), k.data(),
                          v.data(), B, T, NH, NKV, HD, 0, 0, window);
  // lse[b,h,t] = log sum_{lo<=j<=t} exp(q_t . k_j / sqrt(HD)), in double (lo = t - W + 1 under a window).
  if (window > 0)  // the reference's probabilities outside the window are exactly 0
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int i = window; i < T; ++i)
          if (att[((static_cast<size_t>(b) * NH + h) * T + i) * T + static_cast<size_t>(i - window)] != 0.0f)
            return INFINITY;
  Floats lse_ref(static_cast<size_t>(B) * NH * T);
  const int G = NH / NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const float* qi = q.data() + ((static_cast<size_t>(b) * T + i) * NH + h) * HD;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int j = window > 0 ? std::max(0, i - window + 1) : 0; j <= i; ++j) {
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
                      nullptr, window);
    e_fwd = std::max(buf_err(out, out_ref), buf_err(lse, lse_ref));
    attention_backward(g, g + QW * es, g + (QW + KW) * es, dD.ptr(), out.ptr(), lse.f32(), in, in + QW * es,
                       in + (QW + KW) * es, B, T, NH, NKV, HD, ws, ws, t, nullptr, window);
    if (!gqkv.guard_intact()) return INFINITY;
    const Floats got = gqkv.download();
    e_bwd = std::max({max_err(columns(got, N, W, 0, QW), dq_ref), max_err(columns(got, N, W, QW, KW), dk_ref),
                      max_err(columns(got, N, W, QW + KW, KW), dv_ref)});
  } else {
    DevBuf dQ(q, t), dK(k, t), dV(v, t), gq(nq, t), gk(nk, t), gv(nk, t);
    gq.poison();
    gk.poison();
    gv.poison();
    const int qs = static_cast<int>(QW), ks = static_cast<int>(KW);
    attention_forward(out.ptr(), lse.f32(), dQ.ptr(), dK.ptr(), dV.ptr(), B, T, NH, NKV, HD, qs, ks, t, nullptr,
                      window);
    // lse is compared in absolute terms scaled by its magnitude like every other output.
    e_fwd = std::max(buf_err(out, out_ref), buf_err(lse, lse_ref));
    attention_backward(gq.ptr(), gk.ptr(), gv.ptr(), dD.ptr(), out.ptr(), lse.f32(), dQ.ptr(), dK.ptr(), dV.ptr(), B, T,
                       NH, NKV, HD, qs, ks, t, nullptr, window);
    e_bwd = std::max({buf_err(gq, dq_ref), buf_err(gk, dk_ref), buf_err(gv, dv_ref)});
  }
  return std::max(e_fwd, e_bwd);
}

std::vector<Case> cases_attention() {
  std::vector<Case> c;
  uint64_t seed = 600;
  struct Shape {
    int B, T, NH, NKV, HD;
    bool fused;
    int W = 0;
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
          Shape{1, 45, 4, 2, 16, false, 3}, Shape{1, 100, 2, 2, 72, false, 64}, Shape{2, 45, 4, 1, 200, false, 20}}) {
      char name[112];
      std::snprintf(name, sizeof name, "attention fwd+bwd B=%d T=%d NH=%d NKV=%d HD=%d%s", s.B, s.T, s.NH, s.NKV, s.HD,
                    s.fused ? " qkv" : "");
      if (s.W > 0) std::snprintf(name + std::strlen(name), sizeof name - std::strlen(name), " window=%d", s.W);
      c.push_back({name, t, [=] { return attention_check(t, s.B, s.T, s.NH, s.NKV, s.HD, seed, s.fused, s.W); },
                   tol_for(t, 1e-4)});
      ++seed;
    }
  return c;
}

}  // namespace dtrain::kernels::test
