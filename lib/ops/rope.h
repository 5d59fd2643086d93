// Rotary position embedding (HF LlamaForCausalLM "rotate_half" convention: dimension i
// is paired with i + HD/2, inv_freq[i] = theta^(-2i/HD), position of row t is t).
// Applied IN PLACE to q [B,T,NH,HD] and k [B,T,NKV,HD]; backward applies the inverse
// rotation IN PLACE to dq and dk (the one backward that transforms instead of +=: the
// gradient of a rotation is the rotated-back gradient, nothing to accumulate into).
#pragma once

namespace dtrain::ops {

/// x[i] <- x[i] cos - x[i+HD/2] sin;  x[i+HD/2] <- x[i+HD/2] cos + x[i] sin. HD must be even.
/// k may be null (then NKV is ignored).
void rope_forward(float* q, float* k, int B, int T, int NH, int NKV, int HD, float theta);
/// The transpose (inverse) rotation applied to dq, dk in place.
void rope_backward(float* dq, float* dk, int B, int T, int NH, int NKV, int HD, float theta);

}  // namespace dtrain::ops
