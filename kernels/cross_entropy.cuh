// Softmax cross-entropy on the device, as lib/ops/cross_entropy.h, with the forward and
// the backward fused: one block per row finds the max/log-sum-exp and writes dlogits =
// (softmax - onehot) * scale. With dlogits the row is read from memory once where it fits
// on chip (registers, then shared memory: bf16/fp16 rows up to about 180 K elements on an
// H100/H200, fp32 up to half that; cross_entropy_onepass_max_vocab), twice beyond. dlogits
// may be the logits buffer itself (in place: the usual case, saves [N, V] of memory) or
// a separate one. Masked rows (target == ignore_index) get loss 0 and zero gradients.
// Rows are ld >= V elements apart (a padded vocabulary, e.g. 50257 -> 50304, so every row
// starts 16-byte aligned); the columns past V are neither read nor written.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace dtrain::kernels {

/// One pass over logits [N, V] (rows ld apart) of `dtype`; every output is optional (null = skip):
///  - losses[n] (fp32 [N]) = logsumexp(logits[n]) - logits[n, targets[n]], 0 when masked;
///  - *mean (one device fp32) = mean of losses over unmasked rows, 0 when all are masked
///    (deterministic fixed-order reduction);
///  - dlogits (`dtype` [N, V], may equal logits) = (softmax - onehot) * scale, 0 when masked.
///    For the gradient of the mean loss times g pass scale = g / (number of unmasked rows).
/// A target outside [0, V) that is not ignore_index cannot throw from the device: its loss
/// and gradient row are written as NaN (the loss scaler / NaN check then catches it).
void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                    const int32_t* targets, int N, int V, int ld, float scale, int32_t ignore_index,
                                    DType dtype, cudaStream_t stream, const float* count = nullptr);

/// The largest vocabulary whose rows of `dtype` the backward reads from memory once on the
/// current device (the rest of a row's registers' share in its opt-in shared memory).
int cross_entropy_onepass_max_vocab(DType dtype);

/// The forward alone (cross_entropy_forward_backward with dlogits = null).
void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N, int V, int ld,
                           int32_t ignore_index, DType dtype, cudaStream_t stream);

/// The backward alone: WRITES (does not accumulate) dlogits, as the CPU op. With count
/// (one fp32 device value) the kernel scales by ops::ce_backward_scale(scale, *count),
/// read on the device (a CUDA graph does not bake it in).
void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                            float scale, int32_t ignore_index, DType dtype, cudaStream_t stream,
                            const float* count = nullptr);

}  // namespace dtrain::kernels
