// Shape-dependent cuBLAS bf16 GEMM efficiency for the --plan budget: the fraction of the
// dense bf16 peak a GEMM of a given shape reaches, as a band (slowest and fastest published
// measurement near that shape), from OpenXLA's sm_90 matmul measurements (source and method
// in scripts/plan_gemm_table.py, which generates plan_gemm_table.inc).
#pragma once

#include <cstdint>

namespace dtrain::plan {

struct GemmEfficiency {
  double low = 0, high = 0;  ///< fractions of the tensor peak; low <= high
};

/// The efficiency band of a (batched) GEMM with reduction length k and batch x m x n outputs.
/// Bilinear in log2(k) and log2(outputs) between the table's grid points (k 256..4096,
/// outputs 2^20..2^26), each clamped to the grid: non-decreasing in k and in outputs. Outside
/// the grid the nearest edge holds (larger problems are understated, smaller ones overstated).
GemmEfficiency gemm_efficiency(int64_t m, int64_t n, int64_t k, int64_t batch = 1);

}  // namespace dtrain::plan
