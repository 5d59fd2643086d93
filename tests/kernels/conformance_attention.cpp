// Conformance cases for the flash-attention kernels against lib/ops/attention.h: forward
// output and log-sum-exp (reference in double from the same rounded inputs), backward
// dq/dk/dv accumulated into random starting values, with GQA/MQA and head dimensions
// that exercise every register layout (HD <= 64, <= 128, <= 256, not multiples of 32).
#include "cases.h"

#include "kernels/attention.cuh"
#include "ops/attention.h"

namespace dtrain::kernels::test {

double attention_check(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed) {
  Rng r(seed);
  const size_t nq = static_cast<size_t>(B) * T * NH * HD, nk = static_cast<size_t>(B) * T * NKV * HD;
  const Floats q = round_through(rand_floats(r, nq), t), k = round_through(rand_floats(r, nk), t);
  const Floats v = round_through(rand_floats(r, nk), t), dout = round_through(rand_floats(r, nq), t);
  const Floats dq0 = round_through(rand_floats(r, nq), t), dk0 = round_through(rand_floats(r, nk), t);
  const Floats dv0 = round_through(rand_floats(r, nk), t);
  Floats out_ref(nq), att(static_cast<size_t>(B) * NH * T * T), dq_ref = dq0, dk_ref = dk0, dv_ref = dv0;
  ops::attention_forward(out_ref.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  ops::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), att.data(), q.data(), k.data(),
                          v.data(), B, T, NH, NKV, HD);
  // lse[b,h,t] = log sum_{j<=t} exp(q_t . k_j / sqrt(HD)), in double.
  Floats lse_ref(static_cast<size_t>(B) * NH * T);
  const int G = NH / NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const float* qi = q.data() + ((static_cast<size_t>(b) * T + i) * NH + h) * HD;
        std::vector<double> sc(static_cast<size_t>(i) + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* kj = k.data() + ((static_cast<size_t>(b) * T + j) * NKV + h / G) * HD;
          double s = 0;
          for (int d = 0; d < HD; ++d) s += static_cast<double>(qi[d]) * kj[d];
          sc[static_cast<size_t>(j)] = s * scale;
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (double s : sc) sum += std::exp(s - mx);
        lse_ref[(static_cast<size_t>(b) * NH + h) * T + i] = static_cast<float>(mx + std::log(sum));
      }
  DevBuf dQ(q, t), dK(k, t), dV(v, t), dD(dout, t), out(nq, t), lse(lse_ref.size(), DType::F32);
  DevBuf gq(dq0, t), gk(dk0, t), gv(dv0, t);
  out.poison();
  lse.poison();
  attention_forward(out.ptr(), lse.f32(), dQ.ptr(), dK.ptr(), dV.ptr(), B, T, NH, NKV, HD, t, nullptr);
  // lse is compared in absolute terms scaled by its magnitude like every other output.
  const double e_fwd = std::max(buf_err(out, out_ref), buf_err(lse, lse_ref));
  attention_backward(gq.ptr(), gk.ptr(), gv.ptr(), dD.ptr(), out.ptr(), lse.f32(), dQ.ptr(), dK.ptr(), dV.ptr(), B, T, NH,
                     NKV, HD, t, nullptr);
  return std::max({e_fwd, buf_err(gq, dq_ref), buf_err(gk, dk_ref), buf_err(gv, dv_ref)});
}

std::vector<Case> cases_attention() {
  std::vector<Case> c;
  uint64_t seed = 600;
  struct Shape { int B, T, NH, NKV, HD; };
  for (DType t : ALL_DTYPES)
    for (Shape s : {Shape{2, 37, 4, 2, 16}, Shape{1, 70, 3, 1, 72}, Shape{1, 33, 2, 2, 160}, Shape{2, 32, 2, 2, 64}}) {
      char name[96];
      std::snprintf(name, sizeof name, "attention fwd+bwd B=%d T=%d NH=%d NKV=%d HD=%d", s.B, s.T, s.NH, s.NKV, s.HD);
      c.push_back({name, t, [=] { return attention_check(t, s.B, s.T, s.NH, s.NKV, s.HD, seed); }, tol_for(t, 1e-4)});
      ++seed;
    }
  return c;
}

}  // namespace dtrain::kernels::test
