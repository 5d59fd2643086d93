// The conformance table: every CUDA kernel against its CPU reference (lib/ops, and
// lib/train for the optimizer pieces) on fresh random inputs, forward and backward,
// fp32/bf16/fp16 storage, output buffers poisoned with NaN and guarded against overruns.
// Tolerances (max|gpu - cpu| / max|cpu| per output): fp32 1e-5 for pointwise and row
// ops, 1e-4 where the summation order differs over long dot products (GEMM with TF32
// off, attention); bf16 1e-2 and fp16 2e-3 (one output rounding plus fp32 noise).
#include "cases.h"

#include <doctest/doctest.h>

using namespace dtrain::kernels::test;

TEST_CASE("conformance table: CUDA kernels vs CPU reference") {
  DTK_SKIP_WITHOUT_GPU();
  std::vector<Case> all;
  for (auto group : {cases_optim, cases_pointwise, cases_norm, cases_loss, cases_linear, cases_attention}) {
    std::vector<Case> g = group();
    all.insert(all.end(), g.begin(), g.end());
  }
  table_run(all);
}
