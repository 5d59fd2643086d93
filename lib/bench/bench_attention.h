// `dtrain bench attention`: the causal attention of one shape on one device, forward and
// backward timed apart (the device's own Device::attention_forward / attention_backward: on a
// GPU the tensor-core kernels of kernels/attention_mma.cu for bf16/fp16, or under the hopper
// variant attention_hopper.cu's forward where it runs; the result names what ran), with the rate
// counted as FlashAttention's benchmarks count it, so the figure sits beside torch's SDPA
// (scripts/attention_peer.py) at the same shape. Prints figures; a GPU figure needs a CUDA
// build and a GPU, --device cpu times the CPU ops (fp32; small shapes).
#pragma once

#include "core/dtype.h"
#include "device/kind.h"

#include <string>

namespace dtrain::bench {

struct BenchAttnShape {
  int B = 0, T = 0, NH = 0, NKV = 0, HD = 0;
};

/// "B,T,NH,NKV,HD" (e.g. "16,1024,12,12,64"); UsageError naming the flag otherwise.
BenchAttnShape bench_attn_shape_parse(const std::string& text, const std::string& flag = "--shape");

/// FlashAttention's FLOP count (its benchmark scripts): forward 4 B NH T^2 HD, halved for a
/// causal mask; backward 2.5 times the forward (dQ, dK, dV and the recomputed scores, as
/// FlashAttention-2's paper counts them).
double attn_fwd_flops(const BenchAttnShape& s);
double attn_bwd_flops(const BenchAttnShape& s);

struct BenchAttnOptions {
  BenchAttnShape shape;
  DType dtype = DType::BF16;
  device::Kind device = device::Kind::CUDA;
  int warmup = 3, iters = 10;
};

struct BenchAttnResult {
  BenchAttnOptions opts;
  std::string device_name;
  double fwd_ms = 0, bwd_ms = 0;  ///< per call, the mean over iters
  double fwd_tflops = 0, bwd_tflops = 0, total_tflops = 0;
  bool finite = false;  ///< the outputs and gradients of the last call are all finite
  /// The tensor-core kernels that ran (device::cuda_attention_kernels, asked of the device at
  /// this head dim and dtype): "legacy", "fa2", or "hopper" (the sm_90a forward, fa2's
  /// backward); "-" off the tensor cores (fp32, the CPU). `variant_requested` is what
  /// $DTRAIN_ATTN_VARIANT asked for ("legacy" when unset; "-" off the tensor cores);
  /// `variant_fallback` says why the hopper forward did not run where it was asked for (fa2's
  /// ran: another compute capability than 9.0, a head dim other than 64 or 128, ...), else "".
  std::string variant, variant_requested, variant_fallback;
};

/// Times `iters` forward calls after `warmup` ones, then `iters` backward calls (each after
/// a device synchronize), on random q, k, v, dout. UsageError for a bad shape (NH not a
/// multiple of NKV, odd sizes) or a CPU run in bf16/fp16; DeviceError without CUDA.
BenchAttnResult bench_attention_run(const BenchAttnOptions& o);

/// A table, or one JSON object with `json` (its "variant", "variant_requested" and
/// "variant_fallback" as the result's fields).
std::string bench_attention_format(const BenchAttnResult& r, bool json);

}  // namespace dtrain::bench
