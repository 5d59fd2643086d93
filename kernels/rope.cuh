// Rotary position embedding on the device, HF "rotate_half" convention exactly as
// lib/ops/rope.h (pair i with i + HD/2, inv_freq[i] = ops::rope_inv_freq, position = t), in
// place on q [B,T,NH,HD] and k [B,T,NKV,HD] of `dtype`. A separate kernel: attention
// loads already-rotated q/k (fusing it into the attention tile loads is not done).
#pragma once

#include "core/dtype.h"
#include "ops/rope.h"

#include <cuda_runtime.h>

namespace dtrain::kernels {

/// Rotates q and k (k may be null) in place. HD must be even (else UsageError).
void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
                  cudaStream_t stream);
/// The inverse rotation applied to dq and dk in place (the backward of rope_forward).
void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
                   cudaStream_t stream);

}  // namespace dtrain::kernels
