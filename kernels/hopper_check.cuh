// The sm_90 tile-GEMM check: one 64 x n tile of D = A B^T computed by one warpgroup with
// the Hopper instructions of kernels/hopper.cuh (operands staged by 1D bulk copies that
// complete on an mbarrier, wgmma from shared-memory descriptors). Not used by the
// product: it exists so that nvcc and ptxas validate those instructions' PTX (sm_90a) and
// the CPU execution engine's models run under a kernel as the attention path uses them
// (tests/kernels/hopper_check_test.cpp). Built for sm_90a where 90 is configured
// (kernels/CMakeLists.txt); on any other architecture the kernel traps (under the engine:
// fails with an illegal instruction on a profile other than 9.0).
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

namespace dtrain::kernels {

/// d (64 x n fp32, row-major) = a (64 x k, row-major) times b^T (b: n x k, row-major); a and b
/// bf16 or fp16 (dtype), device pointers 16-byte aligned. n = 64, 128 or 256; k a multiple of
/// 16 up to 256 (of 64 with swizzle128, the 128B-swizzled shared layout, else no swizzle).
void hopper_tile_gemm(const void* a, const void* b, float* d, int n, int k, DType dtype, bool swizzle128,
                      cudaStream_t stream);

/// Whether this binary carries the check's sm_90a image (under the engine: true).
bool hopper_tile_gemm_has_sm90a();

}  // namespace dtrain::kernels
