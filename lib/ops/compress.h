// Gradient compression on the CPU (communication.compression): top-k selection with
// error feedback and the sparse accumulation of the gathered (value, index) pairs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::ops {

/// Picks the k elements of residual[0..n) largest in magnitude (NaN counts as larger than
/// any number, so an overflow is sent and seen; ties: the lower index first, so every
/// device picks the same set), writes their values and indices, indices ascending, to
/// values[0..k) and indices[0..k), and zeroes them in residual, which keeps what was not
/// sent. k <= n < 2^31.
void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices);

/// dense[indices[i]] += values[i] for i in [0, count), in that order (deterministic).
void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count);

/// Gram-Schmidt on the columns of a (rows x cols, row-major), in place, as PyTorch's
/// PowerSGD _orthogonalize_gram_schmidt: column i is divided by its norm, then its
/// projection is taken out of every later column. Dot products and norms are summed in
/// double; a zero column stays zero (PyTorch would divide by 0).
void orthogonalize_columns(float* a, size_t rows, size_t cols);

}  // namespace dtrain::ops
