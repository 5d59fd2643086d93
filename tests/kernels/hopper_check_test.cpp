// The sm_90 tile-GEMM check (kernels/hopper_check.cu: bulk copies completing on an mbarrier,
// wgmma from no-swizzle and 128B-swizzled shared layouts) against a host product of the
// same rounded inputs. Under the CPU execution engine on the default (H100) profile it runs
// the engine's models; on a card below compute capability 9.0 (ctest's _a100 entry) the
// launch must fail with an illegal instruction. On a real GPU it needs the check's sm_90a
// image (built where CMAKE_CUDA_ARCHITECTURES has 90: kernels/CMakeLists.txt) on a 9.0
// device; otherwise it is skipped.
#include "harness.h"

#include "kernels/hopper_check.cuh"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

using namespace dtrain;
using namespace dtrain::kernels::test;

namespace {

int device_major() {
  cudaDeviceProp prop{};
  DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.major;
}

double tile_case(int n, int k, DType t, bool swz, uint64_t seed) {
  Rng r(seed);
  const Floats a = input(r, 64 * static_cast<size_t>(k), t), b = input(r, static_cast<size_t>(n) * k, t);
  Floats ref(64 * static_cast<size_t>(n));
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int kk = 0; kk < k; ++kk)
        s += static_cast<double>(a[static_cast<size_t>(i * k + kk)]) * b[static_cast<size_t>(j * k + kk)];
      ref[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  DevBuf da(a, t), db(b, t), dd(ref.size(), DType::F32);
  dd.poison();
  kernels::hopper_tile_gemm(da.ptr(), db.ptr(), dd.f32(), n, k, t, swz, nullptr);
  CHECK(dd.guard_intact());
  return max_err(dd.download(), ref);
}

}  // namespace

TEST_CASE("hopper tile GEMM: bulk copy + mbarrier + wgmma, no swizzle and 128B swizzle, against the host") {
  DTK_SKIP_WITHOUT_GPU();
  const int major = device_major();
#ifndef DTRAIN_CUDA_EMU
  if (major != 9 || !kernels::hopper_tile_gemm_has_sm90a()) {
    std::printf("needs a compute capability 9.0 GPU and a build with 90 among the architectures: skipped\n");
    std::fflush(stdout);
    std::exit(77);
  }
#endif
  if (major != 9) {  // the engine posing as another card: an sm_90 (or sm_90a: wgmma) instruction fails
    Rng r(1);
    DevBuf da(input(r, 64 * 64, DType::BF16), DType::BF16), db(input(r, 64 * 64, DType::BF16), DType::BF16);
    DevBuf dd(64 * 64, DType::F32);
    kernels::hopper_tile_gemm(da.ptr(), db.ptr(), dd.f32(), 64, 64, DType::BF16, true, nullptr);
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalInstruction);
    return;
  }
  uint64_t seed = 4500;
  struct Case {
    int n, k;
    DType t;
    bool swz;
  };
  for (const Case c :
       {Case{64, 64, DType::BF16, true}, Case{128, 128, DType::BF16, true}, Case{256, 64, DType::F16, true},
        Case{64, 32, DType::F16, false}, Case{128, 48, DType::BF16, false}, Case{256, 128, DType::BF16, false}}) {
    const double err = tile_case(c.n, c.k, c.t, c.swz, ++seed);
    std::printf("hopper tile gemm n=%d k=%d %s %s: max rel err %.3g\n", c.n, c.k, dtype_name(c.t),
                c.swz ? "128B swizzle" : "no swizzle", err);
    CHECK(err < 1e-5);
  }
}
