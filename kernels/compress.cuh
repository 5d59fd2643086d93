// Gradient compression on the device (communication.compression topk / powersgd): the
// CUDA versions of lib/ops/compress.h, with the same results (top-k picks the same set in
// the same order; the Gram-Schmidt sums in double, in another order than the CPU's).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::kernels {

/// ops::topk_select on device memory: the k largest |residual[i]| (NaN as +inf; ties: the
/// lower index first) to values/indices, indices ascending, zeroed in residual. k <= n < 2^31.
/// Radix select of the k-th key in four 8-bit passes, then an ordered compaction; stays on
/// the stream (no host read-back).
void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices, cudaStream_t stream);

/// dense[indices[i]] += values[i], i < count. The indices must be distinct (one rank's
/// top-k), so every element is written by one thread and the result is deterministic.
void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count, cudaStream_t stream);

/// ops::orthogonalize_columns: Gram-Schmidt on the columns of a (rows x cols, row-major),
/// dot products and norms in double; a zero column stays zero. One block: cols is a
/// PowerSGD rank (a few), rows a matrix dimension.
void orthogonalize_columns(float* a, size_t rows, size_t cols, cudaStream_t stream);

}  // namespace dtrain::kernels
