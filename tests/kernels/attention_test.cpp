// Flash attention at a long sequence (T = 1024, many key tiles, the online softmax's
// rescaling exercised) against the CPU reference on small heads, GQA and MQA, and the
// launchers' argument checks.
#include "cases.h"

#include "core/error.h"
#include "kernels/attention.cuh"

#include <doctest/doctest.h>

using namespace dtrain;
using namespace dtrain::kernels::test;

TEST_CASE("attention: T=1024 matches the CPU reference (GQA, MQA; fp32 and bf16)") {
  DTK_SKIP_WITHOUT_GPU();
  struct Run {
    DType t;
    int NH, NKV, HD;
    double tol;
  };
  for (Run run : {Run{DType::F32, 4, 2, 32, 1e-4}, Run{DType::BF16, 4, 2, 32, 1e-2}, Run{DType::F32, 2, 1, 64, 1e-4},
                  Run{DType::F16, 2, 1, 128, 2e-3}}) {
    const double e = attention_check(run.t, 1, 1024, run.NH, run.NKV, run.HD, 700 + run.HD);
    std::printf("attention T=1024 NH=%d NKV=%d HD=%d %-9s max err %.3e\n", run.NH, run.NKV, run.HD, dtype_name(run.t),
                e);
    INFO(dtype_name(run.t), " NH=", run.NH, " NKV=", run.NKV, " HD=", run.HD);
    CHECK(e <= run.tol);
  }
}

TEST_CASE("attention: bad shapes are UsageErrors") {
  DTK_SKIP_WITHOUT_GPU();
  DevBuf buf(1 << 16, DType::F32), lse(1024, DType::F32);
  CHECK_THROWS_AS(kernels::attention_forward(buf.ptr(), lse.f32(), buf.ptr(), buf.ptr(), buf.ptr(), 1, 4, 3, 2, 16, 48,
                                             32, DType::F32, nullptr),
                  UsageError);
  CHECK_THROWS_AS(kernels::attention_forward(buf.ptr(), lse.f32(), buf.ptr(), buf.ptr(), buf.ptr(), 1, 4, 1, 1, 300,
                                             300, 300, DType::F32, nullptr),
                  UsageError);
  // Strides shorter than the heads they must cover.
  CHECK_THROWS_AS(kernels::attention_forward(buf.ptr(), lse.f32(), buf.ptr(), buf.ptr(), buf.ptr(), 1, 4, 2, 1, 16, 16,
                                             16, DType::BF16, nullptr),
                  UsageError);
}
