// `dtrain bench attention`: one shape's causal attention forward and backward, timed by the
// host clock around device synchronizes (the kernels run for milliseconds at the shapes
// this is for), rated by FlashAttention's FLOP count.
#include "bench/bench_attention.h"

#include "core/check.h"
#include "core/rng.h"
#include "device/device.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

namespace dtrain::bench {

namespace {

int shape_part(const std::string& part, const std::string& text, const std::string& flag) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(part, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DT_ENFORCE(used == part.size() && !part.empty() && v > 0, UsageError,
             "{} '{}': '{}' is not a positive integer; give B,T,NH,NKV,HD (e.g. 16,1024,12,12,64)", flag, text, part);
  return v;
}

// n values of N(0, 1) in `dt` on the device (fp32 drawn on the host, cast there).
device::DeviceBuffer random_buffer(device::Device& dev, size_t n, DType dt, Rng& rng) {
  std::vector<float> host(n);
  for (float& x : host) x = rng.normal(0.0f, 1.0f);
  device::DeviceBuffer out(dev, n * dtype_size(dt));
  if (dt == DType::F32) {
    dev.copy_h2d(out.get(), host.data(), n * sizeof(float));
    return out;
  }
  device::DeviceBuffer f32(dev, n * sizeof(float));
  dev.copy_h2d(f32.get(), host.data(), n * sizeof(float));
  dev.cast(out.get(), dt, f32.get(), DType::F32, n);
  dev.synchronize();
  return out;
}

bool all_finite(device::Device& dev, const void* p, size_t n, DType dt) {
  std::vector<float> host(n);
  device::DeviceBuffer f32(dev, n * sizeof(float));
  dev.cast(f32.get(), DType::F32, p, dt, n);
  dev.copy_d2h(host.data(), f32.get(), n * sizeof(float));
  for (float x : host)
    if (!std::isfinite(x)) return false;
  return true;
}

template <typename F>
double mean_ms(device::Device& dev, int warmup, int iters, F&& call) {
  for (int i = 0; i < warmup; ++i) call();
  dev.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  dev.synchronize();
  return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace

BenchAttnShape bench_attn_shape_parse(const std::string& text, const std::string& flag) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == ',') {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  DT_ENFORCE(parts.size() == 5, UsageError, "{} '{}': give five numbers B,T,NH,NKV,HD (e.g. 16,1024,12,12,64)", flag,
             text);
  BenchAttnShape s{shape_part(parts[0], text, flag), shape_part(parts[1], text, flag), shape_part(parts[2], text, flag),
                   shape_part(parts[3], text, flag), shape_part(parts[4], text, flag)};
  DT_ENFORCE(s.NH % s.NKV == 0, UsageError, "{} '{}': NH {} is not a multiple of NKV {} (grouped KV heads)", flag, text,
             s.NH, s.NKV);
  return s;
}

double attn_fwd_flops(const BenchAttnShape& s) {
  return 4.0 * s.B * s.NH * static_cast<double>(s.T) * s.T * s.HD / 2.0;
}

double attn_bwd_flops(const BenchAttnShape& s) { return 2.5 * attn_fwd_flops(s); }

BenchAttnResult bench_attention_run(const BenchAttnOptions& o) {
  const BenchAttnShape& s = o.shape;
  DT_ENFORCE(s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HD > 0 && s.NH % s.NKV == 0, UsageError,
             "bench attention: shape B {} T {} NH {} NKV {} HD {}: every size positive, NH a multiple of NKV", s.B, s.T,
             s.NH, s.NKV, s.HD);
  DT_ENFORCE(o.iters >= 1 && o.warmup >= 0, UsageError, "bench attention: --iters {} (>= 1), --warmup {} (>= 0)",
             o.iters, o.warmup);
  const bool cuda = o.device == device::Kind::CUDA;
  DT_ENFORCE(cuda || o.dtype == DType::F32, UsageError,
             "bench attention --device cpu runs fp32 (the CPU ops compute in fp32): give --dtype fp32");
  std::unique_ptr<device::Device> owned;
  device::Device* dev = &device::cpu();
  if (cuda) {
    device::cuda_require(0);
    owned = device::cuda_create(0);
    dev = owned.get();
  }
  const DType dt = o.dtype;
  const size_t rows = static_cast<size_t>(s.B) * s.T;
  const size_t nq = rows * s.NH * s.HD, nkv = rows * s.NKV * s.HD;
  Rng rng(1234);
  device::DeviceBuffer q = random_buffer(*dev, nq, dt, rng), k = random_buffer(*dev, nkv, dt, rng),
                       v = random_buffer(*dev, nkv, dt, rng), dout = random_buffer(*dev, nq, dt, rng);
  const size_t es = dtype_size(dt);
  device::DeviceBuffer out(*dev, nq * es), dq(*dev, nq * es), dk(*dev, nkv * es), dv(*dev, nkv * es);
  device::DeviceBuffer saved(*dev, dev->attention_saved_floats(s.B, s.T, s.NH) * sizeof(float));
  float* sv = static_cast<float*>(saved.get());
  const int qs = s.NH * s.HD, ks = s.NKV * s.HD;

  BenchAttnResult r;
  r.opts = o;
  r.device_name = dev->name();
  // The tensor-core kernels that run, asked of the device (not read from $DTRAIN_ATTN_VARIANT:
  // hopper falls back to fa2's forward off a compute capability 9.0 card and off head dims 64
  // and 128). The buffers are dense, so the rows are as aligned as the kernels want.
  r.variant = r.variant_requested = "-";
  if (cuda && dt != DType::F32) {
    const device::CudaAttnKernels k = device::cuda_attention_kernels(0, s.HD, dt);
    r.variant = k.variant;
    r.variant_requested = k.requested;
    r.variant_fallback = k.fallback;
  }
  r.fwd_ms = mean_ms(*dev, o.warmup, o.iters, [&] {
    dev->attention_forward(out.get(), sv, q.get(), k.get(), v.get(), s.B, s.T, s.NH, s.NKV, s.HD, qs, ks, 0, nullptr,
                           dt);
  });
  r.bwd_ms = mean_ms(*dev, o.warmup, o.iters, [&] {
    dev->attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(), sv, q.get(), k.get(), v.get(), s.B,
                            s.T, s.NH, s.NKV, s.HD, qs, ks, 0, nullptr, dt);
  });
  r.fwd_tflops = attn_fwd_flops(s) / (r.fwd_ms * 1e-3) / 1e12;
  r.bwd_tflops = attn_bwd_flops(s) / (r.bwd_ms * 1e-3) / 1e12;
  r.total_tflops = (attn_fwd_flops(s) + attn_bwd_flops(s)) / ((r.fwd_ms + r.bwd_ms) * 1e-3) / 1e12;
  r.finite = all_finite(*dev, out.get(), nq, dt) && all_finite(*dev, dq.get(), nq, dt) &&
             all_finite(*dev, dk.get(), nkv, dt) && all_finite(*dev, dv.get(), nkv, dt);
  return r;
}

std::string bench_attention_format(const BenchAttnResult& r, bool json) {
  const BenchAttnShape& s = r.opts.shape;
  if (json) {
    nlohmann::json j = {{"device", r.device_name},
                        {"dtype", dtype_name(r.opts.dtype)},
                        {"shape", {{"B", s.B}, {"T", s.T}, {"NH", s.NH}, {"NKV", s.NKV}, {"HD", s.HD}}},
                        {"causal", true},
                        {"variant", r.variant},
                        {"variant_requested", r.variant_requested},
                        {"variant_fallback", r.variant_fallback},
                        {"warmup", r.opts.warmup},
                        {"iters", r.opts.iters},
                        {"fwd_ms", r.fwd_ms},
                        {"bwd_ms", r.bwd_ms},
                        {"fwd_tflops", r.fwd_tflops},
                        {"bwd_tflops", r.bwd_tflops},
                        {"total_tflops", r.total_tflops},
                        {"finite", r.finite},
                        {"flops", "FlashAttention's count: forward 4 B NH T^2 HD / 2 (causal), backward 2.5x"}};
    return j.dump() + "\n";
  }
  std::string out = fmt::format("bench attention: {} on {}\n", dtype_name(r.opts.dtype), r.device_name);
  out += fmt::format("shape        B {} T {} NH {} NKV {} HD {} (GQA {}:1), causal\n", s.B, s.T, s.NH, s.NKV, s.HD,
                     s.NH / s.NKV);
  if (r.variant != "-") {
    const std::string what = r.variant == "hopper" ? "hopper forward, fa2 backward" : r.variant;
    out += r.variant_fallback.empty()
               ? fmt::format("kernels      {} (DTRAIN_ATTN_VARIANT={})\n", what, r.variant_requested)
               : fmt::format("kernels      {} (DTRAIN_ATTN_VARIANT={}; hopper unavailable: {})\n", what,
                             r.variant_requested, r.variant_fallback);
  }
  out += fmt::format("forward      {:.3f} ms  {:.1f} TFLOP/s\n", r.fwd_ms, r.fwd_tflops);
  out += fmt::format("backward     {:.3f} ms  {:.1f} TFLOP/s\n", r.bwd_ms, r.bwd_tflops);
  out += fmt::format("fwd + bwd    {:.3f} ms  {:.1f} TFLOP/s\n", r.fwd_ms + r.bwd_ms, r.total_tflops);
  out += fmt::format(
      "note         mean of {} calls after {} warm-up; FLOPs as FlashAttention counts them (forward 4 "
      "B NH T^2 HD / 2 causal, backward 2.5x); outputs {}\n",
      r.opts.iters, r.opts.warmup, r.finite ? "finite" : "NOT FINITE");
  return out;
}

}  // namespace dtrain::bench
