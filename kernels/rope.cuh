// Rotary position embedding on the device, HF "rotate_half" convention exactly as
// lib/ops/rope.h (pair i with i + HD/2, inv_freq[i] = ops::rope_inv_freq, position = t, or
// t - doc_start[b*T + t] with packed documents), in
// place on q [B,T,NH,HD] and k [B,T,NKV,HD] of `dtype`. A separate kernel: attention
// loads already-rotated q/k (fusing it into the attention tile loads is not done).
#pragma once

#include "core/dtype.h"
#include "ops/rope.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::kernels {

/// Rotates q and k (k may be null) in place. HD must be even (else UsageError). doc_start:
/// device int32 [B*T] or nullptr (ops/attention.h's layout; positions restart per document).
/// q's token rows are q_stride elements apart, k's kv_stride (0: dense NH*HD, NKV*HD; the
/// fused q/k/v projection's column blocks pass its row width).
void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
                  cudaStream_t stream, const int32_t* doc_start = nullptr, int q_stride = 0, int kv_stride = 0);
/// The inverse rotation applied to dq and dk in place (the backward of rope_forward).
void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, const ops::RopeFreq& rope, DType dtype,
                   cudaStream_t stream, const int32_t* doc_start = nullptr, int q_stride = 0, int kv_stride = 0);

/// Bytes of the cos/sin table for T positions and head dimension HD (fp32 pairs, T * HD/2
/// of them, the same for every activation dtype).
size_t rope_table_bytes(int T, int HD);
/// Fills table (rope_table_bytes(T, HD) of device memory) with cos, sin of t * inv_freq[i]
/// for `rope`, as rope_forward forms it per call; UsageError for an odd HD.
void rope_table(void* table, int T, int HD, const ops::RopeFreq& rope, cudaStream_t stream);
/// rope_forward / rope_backward with a table rope_table filled for this T and HD (the
/// caller keeps it: a cached table saves its kernel on every call).
void rope_forward_table(void* q, void* k, int B, int T, int NH, int NKV, int HD, const void* table, DType dtype,
                        cudaStream_t stream, const int32_t* doc_start = nullptr, int q_stride = 0, int kv_stride = 0);
void rope_backward_table(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, const void* table, DType dtype,
                         cudaStream_t stream, const int32_t* doc_start = nullptr, int q_stride = 0, int kv_stride = 0);

}  // namespace dtrain::kernels
