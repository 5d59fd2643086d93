// The CUDA device beyond the model tests: its default memory pool keeps what it holds
// across synchronisations (release threshold UINT64_MAX), so the memory a step frees is
// reused by the next step instead of going back to the driver; and the logits head's ops
// over rows padded past the vocabulary; its cached RoPE tables. Skips without a GPU.
#include "core/rng.h"
#include "core/dtype.h"
#include "device/device.h"
#include "kernels/rope.cuh"
#include "ops/rope.h"

#include "gpu/gpu_skip.h"

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

using namespace dtrain;

TEST_CASE("the CUDA device keeps its default pool's memory across synchronisations") {
  SKIP_WITHOUT_GPU();
  auto dev = device::cuda_create(0);
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess);
  uint64_t threshold = 0;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) == cudaSuccess);
  CHECK(threshold == UINT64_MAX);

  // What a step does: allocate, free, synchronise. The freed bytes stay reserved.
  const size_t bytes = size_t{8} << 20;
  uint64_t used0 = 0, reserved = 0, used = 0;
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used0) == cudaSuccess);
  void* p = dev->alloc(bytes);
  dev->free(p);
  dev->synchronize();
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess);
  REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess);
  CHECK(used == used0);
  CHECK(reserved >= used0 + bytes);
}

// memory_stats reads the pool the device allocates from: what is in use, its peak since a
// reset, and what the pool holds (the GPU check and the memory trace hold these against
// the plan).
TEST_CASE("the CUDA device's memory_stats: bytes in use, their peak since a reset, what the pool holds") {
  SKIP_WITHOUT_GPU();
  auto dev = device::cuda_create(0);
  const size_t bytes = size_t{6} << 20;
  dev->synchronize();
  dev->memory_peak_reset();
  const device::Device::MemoryStats s0 = dev->memory_stats();
  CHECK(s0.used_peak == s0.used);
  void* a = dev->alloc(bytes);
  void* b = dev->alloc(bytes);
  const device::Device::MemoryStats s2 = dev->memory_stats();
  CHECK(s2.used >= s0.used + 2 * bytes);
  CHECK(s2.used_peak >= s2.used);
  CHECK(s2.reserved >= s2.used);
  dev->free(a);
  dev->synchronize();
  const device::Device::MemoryStats s1 = dev->memory_stats();
  CHECK(s1.used < s2.used);
  CHECK(s1.used_peak == s2.used_peak);  // until a reset
  CHECK(s1.reserved >= s2.used);        // the pool keeps what was freed (release threshold)
  dev->memory_peak_reset();
  CHECK(dev->memory_stats().used_peak == s1.used);
  dev->free(b);
  dev->synchronize();
}

// The model's head on a padded vocabulary: logits rows ld apart on CUDA (the padding
// filled with NaN first), packed on the CPU. Same loss and gradients; the padding is
// neither read (it would turn them NaN) nor written.
TEST_CASE("the logits head over padded rows on CUDA equals the CPU's packed head; the padding is never touched") {
  SKIP_WITHOUT_GPU();
  const int N = 24, C = 32, V = 203, ld = 256;
  Rng r(17);
  std::vector<float> lnf(static_cast<size_t>(N) * C), w(static_cast<size_t>(V) * C);
  for (auto& x : lnf) x = r.normal(0.0f, 1.0f);
  for (auto& x : w) x = r.normal(0.0f, 0.2f);
  std::vector<int32_t> tgt(N);
  for (int n = 0; n < N; ++n) tgt[n] = n % 4 == 1 ? -100 : static_cast<int32_t>(r.below(V));
  const float scale = 0.5f / 18.0f;  // 18 unmasked rows

  // CPU: packed rows.
  device::Device& cpu = device::cpu();
  std::vector<float> logits(static_cast<size_t>(N) * V), losses(N), dln(static_cast<size_t>(N) * C);
  std::vector<float> dw_ref(w.size(), 0.0f);
  float mean_ref = 0.0f;
  cpu.linear_forward(logits.data(), lnf.data(), w.data(), nullptr, N, C, V, V, DType::F32);
  cpu.cross_entropy_forward(losses.data(), &mean_ref, logits.data(), tgt.data(), N, V, V, DType::F32);
  // The backward's scale is factor / count, count read from (device) memory.
  const float count = 2.0f;
  cpu.cross_entropy_backward(logits.data(), logits.data(), tgt.data(), N, V, V, 2.0f * scale, &count, DType::F32);
  cpu.linear_backward(dln.data(), dw_ref.data(), nullptr, logits.data(), lnf.data(), w.data(), N, C, V, V, false,
                      DType::F32);

  auto dev = device::cuda_create(0);
  for (DType t : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(t));
    const size_t es = dtype_size(t);
    // Inputs uploaded as fp32 and cast to t on the device.
    auto upload = [&](const std::vector<float>& h) {
      device::DeviceBuffer f(*dev, h.size() * sizeof(float)), o(*dev, h.size() * es);
      dev->copy_h2d(f.get(), h.data(), h.size() * sizeof(float));
      dev->cast(o.get(), t, f.get(), DType::F32, h.size());
      dev->synchronize();
      return o;
    };
    device::DeviceBuffer d_lnf = upload(lnf), d_w = upload(w);
    device::DeviceBuffer d_logits(*dev, static_cast<size_t>(N) * ld * es), d_dln(*dev, dln.size() * es);
    device::DeviceBuffer d_losses(*dev, N * sizeof(float)), d_mean(*dev, sizeof(float));
    device::DeviceBuffer d_tgt(*dev, N * sizeof(int32_t)), d_dw(*dev, w.size() * sizeof(float));
    dev->copy_h2d(d_tgt.get(), tgt.data(), N * sizeof(int32_t));
    device::DeviceBuffer d_count(*dev, sizeof(float));
    dev->copy_h2d(d_count.get(), &count, sizeof(float));
    REQUIRE(cudaMemsetAsync(d_logits.get(), 0xff, d_logits.bytes(), static_cast<cudaStream_t>(dev->stream())) ==
            cudaSuccess);  // NaN in every element, padding included
    dev->linear_forward(d_logits.get(), d_lnf.get(), d_w.get(), nullptr, N, C, V, ld, t);
    dev->cross_entropy_forward(d_losses.as<float>(), d_mean.as<float>(), d_logits.get(), d_tgt.as<int32_t>(), N, V, ld,
                               t);
    dev->cross_entropy_backward(d_logits.get(), d_logits.get(), d_tgt.as<int32_t>(), N, V, ld, 2.0f * scale,
                                d_count.as<float>(), t);
    dev->linear_backward(d_dln.get(), d_dw.as<float>(), nullptr, d_logits.get(), d_lnf.get(), d_w.get(), N, C, V, ld,
                         false, t);

    float mean = 0.0f;
    dev->copy_d2h(&mean, d_mean.get(), sizeof(float));
    const double tol = t == DType::F32 ? 1e-5 : 2e-2;
    CHECK(std::abs(mean - mean_ref) <= tol * std::abs(mean_ref));
    // Gradients back as fp32.
    auto download = [&](const device::DeviceBuffer& b, size_t n, DType bt) {
      device::DeviceBuffer f(*dev, n * sizeof(float));
      dev->cast(f.get(), DType::F32, b.get(), bt, n);
      std::vector<float> h(n);
      dev->copy_d2h(h.data(), f.get(), n * sizeof(float));
      return h;
    };
    auto max_rel = [](const std::vector<float>& got, const std::vector<float>& ref) {
      double e = 0, m = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return static_cast<double>(INFINITY);
        e = std::max(e, std::abs(static_cast<double>(got[i]) - ref[i]));
        m = std::max(m, std::abs(static_cast<double>(ref[i])));
      }
      return e / m;
    };
    CHECK(max_rel(download(d_dln, dln.size(), t), dln) <= tol);
    std::vector<float> dw(w.size());
    dev->copy_d2h(dw.data(), d_dw.get(), dw.size() * sizeof(float));
    CHECK(max_rel(dw, dw_ref) <= tol);
    const std::vector<float> rows = download(d_logits, static_cast<size_t>(N) * ld, t);
    size_t written = 0;
    for (int n = 0; n < N; ++n)
      for (int i = V; i < ld; ++i) written += !std::isnan(rows[static_cast<size_t>(n) * ld + i]);
    CHECK(written == 0);
  }
}

// RoPE's cos/sin table is built once per (T, head dim, frequencies) and kept: each call
// must still rotate with its own key's table. Configurations that differ in one key field
// each, interleaved and repeated, against the kernels' per-call-table path bit for bit.
TEST_CASE("the CUDA device's cached RoPE tables: every key gets its own table") {
  SKIP_WITHOUT_GPU();
  auto dev = device::cuda_create(0);
  const auto stream = static_cast<cudaStream_t>(dev->stream());
  struct Config {
    int T, HD;
    ops::RopeFreq rope;
  };
  ops::RopeFreq base, theta, linear, llama3, llama3_low;
  theta.theta = 500000.0f;
  linear.type = ops::RopeFreq::LINEAR;
  linear.factor = 4.0f;
  llama3.type = ops::RopeFreq::LLAMA3;
  llama3.factor = 8.0f;
  llama3.original_max_position = 16;  // short enough for the scaled band to matter at T = 24
  llama3_low = llama3;
  llama3_low.low_freq_factor = 2.0f;
  // The shorter T first: a table kept for it is too short for the longer one.
  const std::vector<Config> configs = {{12, 16, base},   {24, 16, base},   {24, 16, theta},      {24, 32, base},
                                       {24, 16, linear}, {24, 16, llama3}, {24, 16, llama3_low}, {24, 16, base},
                                       {12, 16, base},   {24, 16, theta}};
  const int B = 2, NH = 4, NKV = 2;
  Rng r(17);
  for (DType t : {DType::F32, DType::BF16})
    for (size_t c = 0; c < configs.size(); ++c) {
      const Config& k = configs[c];
      INFO(dtype_name(t) << " config " << c << " T=" << k.T << " HD=" << k.HD << " theta=" << k.rope.theta);
      const size_t nq = static_cast<size_t>(B) * k.T * NH * k.HD, nk = static_cast<size_t>(B) * k.T * NKV * k.HD;
      std::vector<float> q(nq), kk(nk);
      for (auto& x : q) x = r.normal(0.0f, 1.0f);
      for (auto& x : kk) x = r.normal(0.0f, 1.0f);
      const size_t es = dtype_size(t);
      void* bufs[4];
      for (int i = 0; i < 4; ++i) bufs[i] = dev->alloc((i % 2 ? nk : nq) * es);
      std::vector<uint8_t> hq(nq * es), hk(nk * es);
      for (size_t i = 0; i < nq; ++i) dtype_store(hq.data(), i, t, q[i]);
      for (size_t i = 0; i < nk; ++i) dtype_store(hk.data(), i, t, kk[i]);
      for (int i = 0; i < 4; ++i) dev->copy_h2d(bufs[i], i % 2 ? hk.data() : hq.data(), (i % 2 ? nk : nq) * es);
      for (bool bwd : {false, true}) {
        if (bwd) {
          dev->rope_backward(bufs[0], bufs[1], B, k.T, NH, NKV, k.HD, 0, 0, k.rope, nullptr, t);
          kernels::rope_backward(bufs[2], bufs[3], B, k.T, NH, NKV, k.HD, k.rope, t, stream);
        } else {
          dev->rope_forward(bufs[0], bufs[1], B, k.T, NH, NKV, k.HD, 0, 0, k.rope, nullptr, t);
          kernels::rope_forward(bufs[2], bufs[3], B, k.T, NH, NKV, k.HD, k.rope, t, stream);
        }
        for (int i = 0; i < 2; ++i) {
          const size_t bytes = (i ? nk : nq) * es;
          std::vector<uint8_t> cached(bytes), fresh(bytes);
          dev->copy_d2h(cached.data(), bufs[i], bytes);
          dev->copy_d2h(fresh.data(), bufs[i + 2], bytes);
          CHECK(cached == fresh);
        }
      }
      for (void* p : bufs) dev->free(p);
    }
}
