// The conformance table's case lists, one function per op group (conformance_*.cpp);
// conformance_test.cpp concatenates them into the one table.
#pragma once

#include "harness.h"

#include <vector>

namespace dtrain::kernels::test {

std::vector<Case> cases_optim();      // dtype_cast, adamw, grad_norm_sq, has_inf_or_nan
std::vector<Case> cases_pointwise();  // gelu, swiglu, residual, rope, embedding
std::vector<Case> cases_norm();       // layernorm, rmsnorm (+ fused residual)
std::vector<Case> cases_loss();       // cross-entropy
std::vector<Case> cases_linear();     // cuBLASLt linear layers
std::vector<Case> cases_attention();  // flash attention

// One attention forward+backward check (worst error over out, lse, dq, dk, dv); also
// used by attention_test at long sequence lengths.
double attention_check(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fused = false, int W = 0);

}  // namespace dtrain::kernels::test
