// The conformance table's case lists, one function per op group (conformance_*.cpp);
// conformance_test.cpp concatenates them into the one table.
#pragma once

#include "harness.h"

#include <cstdint>
#include <vector>

namespace dtrain::kernels::test {

std::vector<Case> cases_optim();      // dtype_cast, adamw, grad_norm_sq, has_inf_or_nan
std::vector<Case> cases_pointwise();  // gelu, swiglu, residual, rope, embedding
std::vector<Case> cases_norm();       // layernorm, rmsnorm (+ fused residual)
std::vector<Case> cases_loss();       // cross-entropy
std::vector<Case> cases_linear();     // cuBLASLt linear layers
std::vector<Case> cases_attention();  // flash attention

// One attention forward+backward check (worst error over out, lse, dq, dk, dv); also
// used by attention_test at long sequence lengths. docs non-empty: packed documents, row b
// holding documents of lengths docs[b], docs[b + 1], ... (cyclically; the last one cut at T),
// passed as doc_start to the reference and (unless kernel_docs is false: a kernel ignoring
// doc_start, which must fail the check) the kernels.
// variant: the tensor-core kernels' (kernels::detail::AttnVariant's value; 0: the process's
// own). outputs, when given, receives what the kernels wrote (out, lse, dq, dk, dv as floats,
// exact for every dtype) for a bit-for-bit comparison between variants.
double attention_check(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fused = false, int W = 0,
                       const std::vector<int>& docs = {}, bool kernel_docs = true, int variant = 0,
                       std::vector<float>* outputs = nullptr);

// attention_check under the legacy variant, then under fa2 on the same inputs: INFINITY when
// fa2's outputs differ from legacy's in any bit, else legacy's error (the two variants compute
// every row with the same products in the same order).
double attention_check_variants(DType t, int B, int T, int NH, int NKV, int HD, uint64_t seed, bool fused = false,
                                int W = 0, const std::vector<int>& docs = {});

// The doc_start array [B*T] of rows of T packed with documents of lengths docs[b], docs[b + 1],
// ... (cyclically) in row b, the last one cut at T.
std::vector<int32_t> attention_doc_starts(int B, int T, const std::vector<int>& docs);

}  // namespace dtrain::kernels::test
