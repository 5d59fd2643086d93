// cuBLASLt GEMM sweep against ops::gemm (fp32 CPU on the same rounded inputs): every
// transpose pair, alpha/beta, fp32 / bf16 / fp16 inputs with same-dtype or fp32 output,
// aligned and odd shapes, C poisoned when beta == 0; plus the argument checks.
#include "harness.h"

#include "core/error.h"
#include "kernels/gemm.cuh"
#include "ops/linear.h"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::kernels::test;

namespace {

double gemm_case(bool ta, bool tb, int M, int N, int K, float alpha, float beta, DType ab, DType c, uint64_t seed) {
  Rng r(seed);
  const Floats A = round_through(rand_floats(r, static_cast<size_t>(M) * K), ab);
  const Floats B = round_through(rand_floats(r, static_cast<size_t>(K) * N), ab);
  const Floats C0 = round_through(rand_floats(r, static_cast<size_t>(M) * N), c);
  Floats ref = C0;
  ops::gemm(ta, tb, M, N, K, alpha, A.data(), B.data(), beta, ref.data());
  DevBuf dA(A, ab), dB(B, ab), dC(C0, c);
  if (beta == 0.0f) dC.poison();  // beta == 0 must not read C (NaN * 0 is NaN)
  kernels::gemm(ta, tb, M, N, K, alpha, dA.ptr(), dB.ptr(), beta, dC.ptr(), ab, c, nullptr);
  return buf_err(dC, ref);
}

}  // namespace

TEST_CASE("gemm: transposes, dtypes, alpha/beta and odd shapes match ops::gemm") {
  DTK_SKIP_WITHOUT_GPU();
  struct Types {
    DType ab, c;
    double tol;
  };
  struct Shape {
    int M, N, K;
  };
  uint64_t seed = 900;
  std::printf("%-44s %12s\n", "gemm case", "max err");
  for (Types ty :
       {Types{DType::F32, DType::F32, 1e-4}, Types{DType::BF16, DType::BF16, 1e-2},
        Types{DType::BF16, DType::F32, 1e-4}, Types{DType::F16, DType::F16, 2e-3}, Types{DType::F16, DType::F32, 1e-4}})
    for (Shape s : {Shape{64, 128, 96}, Shape{33, 17, 45}, Shape{1, 64, 256}})
      for (int tr = 0; tr < 4; ++tr)
        for (float beta : {0.0f, 1.0f}) {
          const bool ta = tr & 1, tb = tr & 2;
          const double e = gemm_case(ta, tb, s.M, s.N, s.K, 0.5f, beta, ty.ab, ty.c, seed++);
          char name[128];
          std::snprintf(name, sizeof name, "%s->%s %dx%dx%d ta=%d tb=%d beta=%g", dtype_name(ty.ab), dtype_name(ty.c),
                        s.M, s.N, s.K, ta, tb, beta);
          std::printf("%-44s %12.3e%s\n", name, e, e <= ty.tol ? "" : "  FAIL");
          INFO(name);
          CHECK(e <= ty.tol);
        }
}

TEST_CASE("gemm: the cached plan is reused across calls with other pointers") {
  DTK_SKIP_WITHOUT_GPU();
  for (int i = 0; i < 3; ++i)
    CHECK(gemm_case(false, true, 48, 40, 32, 1.0f, 1.0f, DType::BF16, DType::F32, 77 + i) <= 1e-4);
}

TEST_CASE("gemm: bad arguments are UsageErrors") {
  DTK_SKIP_WITHOUT_GPU();
  DevBuf a(64, DType::F32), b(64, DType::F32), c(64, DType::BF16);
  CHECK_THROWS_AS(
      kernels::gemm(false, false, 8, 8, 8, 1.0f, a.ptr(), b.ptr(), 0.0f, c.ptr(), DType::F32, DType::BF16, nullptr),
      UsageError);
  CHECK_THROWS_AS(
      kernels::linear_gelu_forward(c.ptr(), c.ptr(), a.ptr(), b.ptr(), nullptr, 2, 4, 6, DType::BF16, nullptr),
      UsageError);
  // The GELU input of DGELU has d(inp)'s leading dimension IC: a multiple of 8.
  CHECK_THROWS_AS(kernels::linear_dgelu_backward(c.ptr(), nullptr, nullptr, c.ptr(), c.ptr(), c.ptr(), c.ptr(), 2, 6, 4,
                                                 DType::BF16, nullptr),
                  UsageError);
}
