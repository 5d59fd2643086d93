// Conformance cases for LayerNorm and RMSNorm (plain and fused with the residual add),
// forward and backward, against lib/ops/norm.h. Backward gets the CPU's statistics on
// both sides so it is checked on its own; the fused residual is rounded through the
// dtype before the CPU norm, as the kernel normalises the stored residual. The backward
// runs the default kernels, and (DTRAIN_NORM_BACKWARD=fused) the fused alternative, whose
// rows check under the CPU execution engine that it ran.
#include "cases.h"

#include "kernels/norm.cuh"
#include "ops/activation.h"
#include "ops/norm.h"

#ifdef DTRAIN_CUDA_EMU
#include <cuda_emu_trace.h>
#endif

namespace dtrain::kernels::test {

namespace {

// Runs f (a backward) with DTRAIN_NORM_BACKWARD=fused when `fused`, else with the variable
// unset; false when the engine saw the fused kernel run and `expect` says it should not, or
// the other way round (a GPU build takes the numbers alone).
template <typename F>
bool backward_as(bool fused, bool expect, F&& f) {
  const char* old = std::getenv("DTRAIN_NORM_BACKWARD");
  const std::string saved = old ? old : "";
  if (fused) ::setenv("DTRAIN_NORM_BACKWARD", "fused", 1);
  else ::unsetenv("DTRAIN_NORM_BACKWARD");
#ifdef DTRAIN_CUDA_EMU
  cuda_emu::trace_begin();
#endif
  f();
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  if (old) ::setenv("DTRAIN_NORM_BACKWARD", saved.c_str(), 1);
  else ::unsetenv("DTRAIN_NORM_BACKWARD");
#ifdef DTRAIN_CUDA_EMU
  bool seen = false;
  for (const auto& k : cuda_emu::trace_take().kernels)
    seen = seen || k.name.rfind("norm_backward_fused_kernel", 0) == 0;
  return seen == expect;
#else
  (void)expect;
  return true;
#endif
}

// parts: which backward outputs are asked for (DINP | DW | DB); the others are null.
enum Parts { DINP = 1, DW = 2, DB = 4, ALL = 7 };

// fused_bwd: the fused backward (which runs only with dinp and a parameter gradient).
double layernorm_case(DType t, int N, int C, bool fused, size_t off, uint64_t seed, int parts = ALL,
                      bool fused_bwd = false) {
  Rng r(seed);
  const size_t n = static_cast<size_t>(N) * C;
  const float eps = 1e-5f;
  const Floats a = input(r, n, t, 1.0f, 0.3f), b = input(r, n, t), w = input(r, C, t, 0.2f, 1.0f),
               bias = input(r, C, t, 0.1f);
  const Floats dout = input(r, n, t), dinp0 = input(r, n, t);
  const Floats dw0 = rand_floats(r, C), db0 = rand_floats(r, C);
  Floats x = a;
  if (fused) {
    ops::residual_forward(x.data(), a.data(), b.data(), n);
    x = round_through(x, t);
  }
  Floats out_ref(n), mean(N), rstd(N), dinp_ref = dinp0, dw_ref = dw0, db_ref = db0;
  ops::layernorm_forward(out_ref.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C, eps);
  ops::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), x.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
  DevBuf dA(a, t, off), dB(b, t, off), dW(w, t, off), dBias(bias, t, off), out(n, t, off), res(n, t, off);
  DevBuf dmean(N, DType::F32), drstd(N, DType::F32);
  out.poison();
  res.poison();
  dmean.poison();
  drstd.poison();
  if (fused) {
    residual_layernorm_forward(res.ptr(), out.ptr(), dmean.f32(), drstd.f32(), dA.ptr(), dB.ptr(), dW.ptr(),
                               dBias.ptr(), N, C, eps, t, nullptr);
  } else {
    layernorm_forward(out.ptr(), dmean.f32(), drstd.f32(), dA.ptr(), dW.ptr(), dBias.ptr(), N, C, eps, t, nullptr);
  }
  double e = std::max({buf_err(out, out_ref), buf_err(dmean, mean), buf_err(drstd, rstd)});
  if (fused) e = std::max(e, buf_err(res, x));
  DevBuf dx(x, t, off), dd(dout, t, off), dinp(dinp0, t, off), dw(dw0, DType::F32), db(db0, DType::F32);
  DevBuf cmean(mean, DType::F32), crstd(rstd, DType::F32);
  const bool ran = backward_as(fused_bwd, fused_bwd && (parts & DINP) && (parts & (DW | DB)), [&] {
    layernorm_backward(parts & DINP ? dinp.ptr() : nullptr, parts & DW ? dw.f32() : nullptr,
                       parts & DB ? db.f32() : nullptr, dd.ptr(), dx.ptr(), dW.ptr(), cmean.f32(), crstd.f32(), N, C, t,
                       nullptr);
  });
  if (!ran) return INFINITY;
  // An output not asked for must come back untouched.
  return std::max({e, buf_err(dinp, parts & DINP ? dinp_ref : round_through(dinp0, t)),
                   buf_err(dw, parts & DW ? dw_ref : dw0), buf_err(db, parts & DB ? db_ref : db0)});
}

double rmsnorm_case(DType t, int N, int C, bool fused, size_t off, uint64_t seed, int parts = ALL,
                    bool fused_bwd = false) {
  Rng r(seed);
  const size_t n = static_cast<size_t>(N) * C;
  const float eps = 1e-6f;
  const Floats a = input(r, n, t), b = input(r, n, t), w = input(r, C, t, 0.2f, 1.0f);
  const Floats dout = input(r, n, t), dinp0 = input(r, n, t), dw0 = rand_floats(r, C);
  Floats x = a;
  if (fused) {
    ops::residual_forward(x.data(), a.data(), b.data(), n);
    x = round_through(x, t);
  }
  Floats out_ref(n), rstd(N), dinp_ref = dinp0, dw_ref = dw0;
  ops::rmsnorm_forward(out_ref.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  ops::rmsnorm_backward(dinp_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  DevBuf dA(a, t, off), dB(b, t, off), dW(w, t, off), out(n, t, off), res(n, t, off), drstd(N, DType::F32);
  out.poison();
  res.poison();
  drstd.poison();
  if (fused) {
    residual_rmsnorm_forward(res.ptr(), out.ptr(), drstd.f32(), dA.ptr(), dB.ptr(), dW.ptr(), N, C, eps, t, nullptr);
  } else {
    rmsnorm_forward(out.ptr(), drstd.f32(), dA.ptr(), dW.ptr(), N, C, eps, t, nullptr);
  }
  double e = std::max(buf_err(out, out_ref), buf_err(drstd, rstd));
  if (fused) e = std::max(e, buf_err(res, x));
  DevBuf dx(x, t, off), dd(dout, t, off), dinp(dinp0, t, off), dw(dw0, DType::F32), crstd(rstd, DType::F32);
  const bool ran = backward_as(fused_bwd, fused_bwd && (parts & DINP) && (parts & DW), [&] {
    rmsnorm_backward(parts & DINP ? dinp.ptr() : nullptr, parts & DW ? dw.f32() : nullptr, dd.ptr(), dx.ptr(), dW.ptr(),
                     crstd.f32(), N, C, t, nullptr);
  });
  if (!ran) return INFINITY;
  return std::max(
      {e, buf_err(dinp, parts & DINP ? dinp_ref : round_through(dinp0, t)), buf_err(dw, parts & DW ? dw_ref : dw0)});
}

}  // namespace

std::vector<Case> cases_norm() {
  std::vector<Case> c;
  uint64_t seed = 300;
  struct Shape {
    int N, C;
    size_t off;
  };
  // 200 channels: vector path; 131: scalar path; 300 rows: several 128-row chunks.
  for (DType t : ALL_DTYPES)
    for (Shape s : {Shape{37, 200, 0}, Shape{300, 131, 0}, Shape{19, 256, 1}})
      for (bool fused : {false, true}) {
        const std::string shape =
            " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + (s.off ? " (unaligned)" : "");
        c.push_back({std::string(fused ? "residual_layernorm" : "layernorm") + " fwd+bwd" + shape, t,
                     [=] { return layernorm_case(t, s.N, s.C, fused, s.off, seed); }, tol_for(t, 1e-5)});
        c.push_back({std::string(fused ? "residual_rmsnorm" : "rmsnorm") + " fwd+bwd" + shape, t,
                     [=] { return rmsnorm_case(t, s.N, s.C, fused, s.off, seed + 1); }, tol_for(t, 1e-5)});
        seed += 2;
      }
  // The one-kernel backward's shapes (kernels/norm.cu): 2100 rows = 263 groups of 8 on at
  // most 256 blocks (blocks take two groups); 8000 channels: LayerNorm's partials need 64 KB
  // of opt-in shared memory; 60000: the partials exceed every card's shared memory and
  // live in global memory. Then one output at a time (the others null, left untouched).
  for (DType t : ALL_DTYPES) {
    for (Shape s : {Shape{2100, 40, 0}, Shape{5, 8000, 0}, Shape{3, 60000, 0}}) {
      const std::string shape = " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
      c.push_back({"layernorm fwd+bwd" + shape, t, [=] { return layernorm_case(t, s.N, s.C, false, 0, seed); },
                   tol_for(t, 1e-5)});
      c.push_back({"rmsnorm fwd+bwd" + shape, t, [=] { return rmsnorm_case(t, s.N, s.C, false, 0, seed + 1); },
                   tol_for(t, 1e-5)});
      seed += 2;
    }
    for (int parts : {int{DINP}, int{DW}, int{DB}, DW | DB}) {
      const std::string what = std::string(parts & DINP ? " dinp" : "") + (parts & DW ? " dweight" : "") +
                               (parts & DB ? " dbias" : "") + " only N=300 C=200";
      c.push_back({"layernorm fwd+bwd," + what, t, [=] { return layernorm_case(t, 300, 200, false, 0, seed, parts); },
                   tol_for(t, 1e-5)});
      if (!(parts & DB))
        c.push_back({"rmsnorm fwd+bwd," + what, t, [=] { return rmsnorm_case(t, 300, 200, false, 0, seed + 1, parts); },
                     tol_for(t, 1e-5)});
      seed += 2;
    }
  }
  // The fused backward (DTRAIN_NORM_BACKWARD=fused): 32-row chunks (19 rows: one partial
  // chunk; 300: ten, the last of 12), groups of threads on the same columns (200 channels:
  // 25 bf16 packs, 10 groups; 2048: one pack a thread; 8000: four packs a thread), the scalar
  // path (131 channels, and unaligned rows), one parameter gradient at a time; without dinp
  // it falls back to the column sums (the engine checks it did not run).
  for (DType t : ALL_DTYPES) {
    for (Shape s : {Shape{19, 200, 0}, Shape{300, 131, 0}, Shape{19, 256, 1}, Shape{300, 200, 0}, Shape{70, 2048, 0},
                    Shape{40, 8000, 0}})
      for (bool fused : {false, true}) {
        const std::string shape = " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                                  (s.off ? " (unaligned)" : "") + (fused ? " residual" : "");
        c.push_back({"layernorm fused bwd" + shape, t,
                     [=] { return layernorm_case(t, s.N, s.C, fused, s.off, seed, ALL, true); }, tol_for(t, 1e-5)});
        c.push_back({"rmsnorm fused bwd" + shape, t,
                     [=] { return rmsnorm_case(t, s.N, s.C, fused, s.off, seed + 1, ALL, true); }, tol_for(t, 1e-5)});
        seed += 2;
      }
    for (int parts : {DINP | DW, DINP | DB}) {
      const std::string what = std::string(parts & DW ? " dweight" : " dbias") + " only N=300 C=200";
      c.push_back({"layernorm fused bwd, dinp +" + what, t,
                   [=] { return layernorm_case(t, 300, 200, false, 0, seed, parts, true); }, tol_for(t, 1e-5)});
      seed += 1;
    }
    c.push_back({"rmsnorm fused bwd, no dinp: column sums N=300 C=200", t,
                 [=] { return rmsnorm_case(t, 300, 200, false, 0, seed, DW, true); }, tol_for(t, 1e-5)});
    ++seed;
  }
  return c;
}

}  // namespace dtrain::kernels::test
