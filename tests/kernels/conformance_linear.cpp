// Conformance cases for the cuBLASLt linear layers against lib/ops/linear.h: forward with
// and without bias, the GELU_AUX_BIAS epilogue (output and stored pre-activation), and
// backward (dinp, fp32 dweight and dbias accumulated into random starting values; dinp
// also written over poison by the beta = 0 GEMM), and the backward through a GELU input
// (DGELU epilogue) against ops::linear_backward then ops::gelu_backward; the logits
// GEMMs' padded rows (output and dout rows ld apart, NaN padding) against packed ones.
#include "cases.h"

#include "kernels/gemm.cuh"
#include "ops/activation.h"
#include "ops/linear.h"

namespace dtrain::kernels::test {

namespace {

enum class Fwd { PLAIN, BIAS, GELU, GELU_BIAS };

double linear_case(DType t, int N, int IC, int OC, Fwd fwd, uint64_t seed) {
  Rng r(seed);
  const bool with_bias = fwd == Fwd::BIAS || fwd == Fwd::GELU_BIAS;
  const bool gelu = fwd == Fwd::GELU || fwd == Fwd::GELU_BIAS;
  const Floats x = input(r, static_cast<size_t>(N) * IC, t), w = input(r, static_cast<size_t>(OC) * IC, t, 0.1f);
  const Floats bias = input(r, OC, t), dout = input(r, static_cast<size_t>(N) * OC, t);
  const Floats dinp0 = input(r, static_cast<size_t>(N) * IC, t), dw0 = rand_floats(r, static_cast<size_t>(OC) * IC),
               db0 = rand_floats(r, OC);
  Floats out_ref(static_cast<size_t>(N) * OC), act_ref, dinp_ref = dinp0, dw_ref = dw0, db_ref = db0;
  ops::linear_forward(out_ref.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, IC, OC, OC);
  if (gelu) {
    act_ref.resize(out_ref.size());
    // The kernel applies GELU to the fp32 accumulator, the CPU to the stored value: equal in fp32.
    ops::gelu_forward(act_ref.data(), out_ref.data(), out_ref.size());
  }
  ops::linear_backward(dinp_ref.data(), dw_ref.data(), with_bias ? db_ref.data() : nullptr, dout.data(), x.data(),
                       w.data(), N, IC, OC, OC, true);
  Floats dinp_write_ref(static_cast<size_t>(N) * IC);
  ops::linear_backward(dinp_write_ref.data(), nullptr, nullptr, dout.data(), x.data(), w.data(), N, IC, OC, OC, false);
  DevBuf dx(x, t), dwt(w, t), dbias(bias, t), out(out_ref.size(), t), pre(out_ref.size(), t);
  out.poison();
  pre.poison();
  double e = 0;
  if (gelu) {
    linear_gelu_forward(out.ptr(), pre.ptr(), dx.ptr(), dwt.ptr(), with_bias ? dbias.ptr() : nullptr, N, IC, OC, t,
                        nullptr);
    e = std::max(buf_err(out, act_ref), buf_err(pre, out_ref));
  } else {
    linear_forward(out.ptr(), dx.ptr(), dwt.ptr(), with_bias ? dbias.ptr() : nullptr, N, IC, OC, OC, t, nullptr);
    e = buf_err(out, out_ref);
  }
  DevBuf dd(dout, t), dinp(dinp0, t), dW(dw0, DType::F32), dB(db0, DType::F32), dinp_write(dinp_write_ref.size(), t);
  linear_backward(dinp.ptr(), dW.f32(), with_bias ? dB.f32() : nullptr, dd.ptr(), dx.ptr(), dwt.ptr(), N, IC, OC, OC,
                  true, t, nullptr);
  dinp_write.poison();
  linear_backward(dinp_write.ptr(), nullptr, nullptr, dd.ptr(), dx.ptr(), dwt.ptr(), N, IC, OC, OC, false, t, nullptr);
  return std::max(
      {e, buf_err(dinp, dinp_ref), buf_err(dW, dw_ref), buf_err(dB, db_ref), buf_err(dinp_write, dinp_write_ref)});
}

// The layer after linear_gelu_forward: its input act = gelu(pre) (both as stored in t).
double linear_dgelu_case(DType t, int N, int IC, int OC, bool with_bias, uint64_t seed) {
  Rng r(seed);
  const size_t NI = static_cast<size_t>(N) * IC;
  const Floats pre = input(r, NI, t, 2.0f), w = input(r, static_cast<size_t>(OC) * IC, t, 0.1f);
  const Floats dout = input(r, static_cast<size_t>(N) * OC, t);
  const Floats dw0 = rand_floats(r, static_cast<size_t>(OC) * IC), db0 = rand_floats(r, OC);
  Floats act(NI);
  ops::gelu_forward(act.data(), pre.data(), NI);
  act = round_through(act, t);
  Floats dpre_ref(NI), dw_ref = dw0, db_ref = db0;
  ops::linear_backward(dpre_ref.data(), dw_ref.data(), with_bias ? db_ref.data() : nullptr, dout.data(), act.data(),
                       w.data(), N, IC, OC, OC, false);
  ops::gelu_backward(dpre_ref.data(), pre.data(), dpre_ref.data(), NI);
  DevBuf dd(dout, t), dact(act, t), dwt(w, t), dpre_in(pre, t), dpre(NI, t), dW(dw0, DType::F32), dB(db0, DType::F32);
  dpre.poison();
  linear_dgelu_backward(dpre.ptr(), dW.f32(), with_bias ? dB.f32() : nullptr, dd.ptr(), dact.ptr(), dwt.ptr(),
                        dpre_in.ptr(), N, IC, OC, t, nullptr);
  return std::max({buf_err(dpre, dpre_ref), buf_err(dW, dw_ref), buf_err(dB, db_ref)});
}

// The lm head with a padded vocabulary: logits = x W^T written into rows ld apart whose
// padding is NaN, then dinp = dlogits W (written) and dW += dlogits^T x from those rows.
// Equal to the packed CPU reference, and the padding is neither written nor read.
double linear_padded_case(DType t, int N, int IC, int OC, int ld, bool with_bias, uint64_t seed) {
  Rng r(seed);
  const size_t NO = static_cast<size_t>(N) * OC;
  const Floats x = input(r, static_cast<size_t>(N) * IC, t), w = input(r, static_cast<size_t>(OC) * IC, t, 0.1f);
  const Floats bias = input(r, OC, t), dout = input(r, NO, t);
  const Floats dw0 = rand_floats(r, static_cast<size_t>(OC) * IC), db0 = rand_floats(r, OC);
  Floats out_ref(NO), dinp_ref(static_cast<size_t>(N) * IC), dw_ref = dw0, db_ref = db0;
  ops::linear_forward(out_ref.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, IC, OC, OC);
  ops::linear_backward(dinp_ref.data(), dw_ref.data(), with_bias ? db_ref.data() : nullptr, dout.data(), x.data(),
                       w.data(), N, IC, OC, OC, false);
  DevBuf dx(x, t), dwt(w, t), dbias(bias, t), out(static_cast<size_t>(N) * ld, t);
  DevBuf dd(rows_pad(dout, N, OC, ld), t), dinp(dinp_ref.size(), t), dW(dw0, DType::F32), dB(db0, DType::F32);
  out.poison();
  dinp.poison();
  linear_forward(out.ptr(), dx.ptr(), dwt.ptr(), with_bias ? dbias.ptr() : nullptr, N, IC, OC, ld, t, nullptr);
  linear_backward(dinp.ptr(), dW.f32(), with_bias ? dB.f32() : nullptr, dd.ptr(), dx.ptr(), dwt.ptr(), N, IC, OC, ld,
                  false, t, nullptr);
  if (!out.guard_intact()) return INFINITY;
  const Floats got = out.download();
  if (!padding_nan(got, N, OC, ld)) return INFINITY;
  return std::max({max_err(rows_unpad(got, N, OC, ld), out_ref), buf_err(dinp, dinp_ref), buf_err(dW, dw_ref),
                   buf_err(dB, db_ref)});
}

}  // namespace

std::vector<Case> cases_linear() {
  std::vector<Case> c;
  uint64_t seed = 500;
  struct Shape {
    int N, IC, OC;
  };
  for (DType t : ALL_DTYPES)
    for (Shape s : {Shape{64, 96, 128}, Shape{37, 72, 40}})
      for (Fwd f : {Fwd::PLAIN, Fwd::BIAS, Fwd::GELU, Fwd::GELU_BIAS}) {
        const char* name = f == Fwd::PLAIN  ? "linear"
                           : f == Fwd::BIAS ? "linear +bias"
                           : f == Fwd::GELU ? "linear_gelu"
                                            : "linear_gelu +bias";
        c.push_back({std::string(name) + " fwd+bwd " + std::to_string(s.N) + "x" + std::to_string(s.IC) + "->" +
                         std::to_string(s.OC),
                     t, [=] { return linear_case(t, s.N, s.IC, s.OC, f, seed); }, tol_for(t, 1e-4)});
        ++seed;
      }
  for (DType t : ALL_DTYPES)
    for (Shape s : {Shape{64, 96, 128}, Shape{37, 72, 40}})
      for (bool bias : {false, true}) {
        c.push_back({std::string("linear_dgelu bwd") + (bias ? " +bias " : " ") + std::to_string(s.N) + "x" +
                         std::to_string(s.IC) + "->" + std::to_string(s.OC),
                     t, [=] { return linear_dgelu_case(t, s.N, s.IC, s.OC, bias, seed); }, tol_for(t, 1e-4)});
        ++seed;
      }
  for (DType t : ALL_DTYPES)
    for (bool bias : {false, true}) {  // V = 203 in rows of 256, the head's shape (no bias) and a biased one
      c.push_back({std::string("linear padded rows") + (bias ? " +bias" : "") + " 40x64->203 ld 256", t,
                   [=] { return linear_padded_case(t, 40, 64, 203, 256, bias, seed); }, tol_for(t, 1e-4)});
      ++seed;
    }
  return c;
}

}  // namespace dtrain::kernels::test
