// Rotary position embedding (HF LlamaForCausalLM "rotate_half" convention: dimension i
// is paired with i + HD/2, position of row t is t), with the inverse frequencies of HF's
// rope types default, linear and llama3 (RopeFreq). Applied IN PLACE to q [B,T,NH,HD]
// and k [B,T,NKV,HD]; backward applies the inverse rotation IN PLACE to dq and dk (the one
// backward that transforms instead of +=: the gradient of a rotation is the rotated-back
// gradient, nothing to accumulate into).
#pragma once

#include "core/op_params.h"

#include <cstdint>

#include <cmath>

// rope_inv_freq runs on the host (lib/ops, the table of kernels/rope.cu under the EMU
// engine) and on the device (nvcc).
#if defined(__CUDACC__)
#define DT_ROPE_HD __host__ __device__
#else
#define DT_ROPE_HD
#endif

namespace dtrain::ops {

using dtrain::RopeFreq;

/// inv_freq of pair index i (0 <= i < HD/2), in double (HF forms it in fp32; the
/// difference is within fp32 rounding of the angle).
DT_ROPE_HD inline double rope_inv_freq(const RopeFreq& r, int i, int HD) {
  double f = 1.0 / pow(static_cast<double>(r.theta), 2.0 * i / HD);
  if (r.type == RopeFreq::LINEAR) return f / r.factor;
  if (r.type != RopeFreq::LLAMA3) return f;
  const double pi = 3.14159265358979323846;
  const double old_ctx = r.original_max_position;
  const double low_wavelen = old_ctx / r.low_freq_factor, high_wavelen = old_ctx / r.high_freq_factor;
  const double wavelen = 2.0 * pi / f;
  if (wavelen > low_wavelen) return f / r.factor;  // low frequency: scaled
  if (wavelen < high_wavelen) return f;            // high frequency: kept
  const double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - smooth) * f / r.factor + smooth * f;
}

/// x[i] <- x[i] cos - x[i+HD/2] sin;  x[i+HD/2] <- x[i+HD/2] cos + x[i] sin. HD must be even.
/// k may be null (then NKV is ignored). Row t of a sequence rotates by position t, or by
/// t - doc_start[b*T + t] with packed documents (doc_start [B*T], ops/attention.h's layout):
/// positions restart at each document. q's token rows are q_stride elements apart, k's
/// kv_stride (0: dense, NH*HD and NKV*HD; the fused q/k/v projection's column blocks pass
/// its row width).
void rope_forward(float* q, float* k, int B, int T, int NH, int NKV, int HD, const RopeFreq& rope,
                  const int32_t* doc_start = nullptr, int q_stride = 0, int kv_stride = 0);
/// The transpose (inverse) rotation applied to dq, dk in place.
void rope_backward(float* dq, float* dk, int B, int T, int NH, int NKV, int HD, const RopeFreq& rope,
                   const int32_t* doc_start = nullptr, int q_stride = 0, int kv_stride = 0);

}  // namespace dtrain::ops
