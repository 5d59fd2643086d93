// Test helpers for the CUDA kernels (host code, compiled by g++): device buffers with
// poison fill and an overrun guard, host<->device copies through any storage dtype,
// rounding host data through a dtype, the max-normalised error, and the conformance
// table runner that prints one row per case.
#pragma once

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/device.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::kernels::test {

// Every CUDA test starts with this: no device ends the binary with exit code 77, which
// ctest reports as SKIPPED (never as passed). Under the CPU execution engine (the EMU
// build) devices are always visible, so these tests run in every test run.
#define DTK_SKIP_WITHOUT_GPU()                                           \
  do {                                                                   \
    if (::dtrain::kernels::device_count() == 0) {                        \
      std::printf("no CUDA device visible: this GPU test is skipped\n"); \
      std::fflush(stdout);                                               \
      std::exit(77);                                                     \
    }                                                                    \
  } while (0)

using Floats = std::vector<float>;

inline Floats rand_floats(Rng& r, size_t n, float scale = 1.0f, float mean = 0.0f) {
  Floats v(n);
  for (auto& x : v) x = r.normal(mean, scale);
  return v;
}

// What the device sees after the host data is stored as `t`.
inline Floats round_through(const Floats& v, DType t) {
  Floats o(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    o[i] = t == DType::F32 ? v[i] : t == DType::BF16 ? bf16_to_f32(f32_to_bf16(v[i])) : f16_to_f32(f32_to_f16(v[i]));
  return o;
}

// Random input of n elements, already rounded through t (what both sides see).
inline Floats input(Rng& r, size_t n, DType t, float scale = 1.0f, float mean = 0.0f) {
  return round_through(rand_floats(r, n, scale, mean), t);
}

// max|got - ref| / max(max|ref|, 1e-30); any NaN/inf mismatch (a poisoned element that
// was never written) gives +inf.
inline double max_err(const Floats& got, const Floats& ref) {
  REQUIRE(got.size() == ref.size());
  double e = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (std::isnan(g) != std::isnan(r) || (std::isinf(g) && g != r)) return INFINITY;
    if (std::isfinite(r)) {
      e = std::max(e, std::abs(g - r));
      m = std::max(m, std::abs(r));
    }
  }
  return e / std::max(m, 1e-30);
}

// ----------------------------------------------------------------------------
// A device buffer of n elements of one dtype, allocated `offset` elements past a
// 256-byte boundary (offset 1 exercises the kernels' unaligned paths), followed by a
// guard zone that must survive every kernel.
class DevBuf {
 public:
  static constexpr size_t GUARD = 256;

  DevBuf(size_t n, DType t, size_t offset = 0) : n_(n), t_(t), offset_(offset) {
    bytes_ = (offset + n) * dtype_size(t) + GUARD;
    DT_CUDA_CHECK(cudaMalloc(&base_, bytes_));
    DT_CUDA_CHECK(cudaMemset(base_, GUARD_BYTE, bytes_));
  }
  DevBuf(const Floats& host, DType t, size_t offset = 0) : DevBuf(host.size(), t, offset) { upload(host); }
  ~DevBuf() { (void)cudaFree(base_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  void* ptr() const { return static_cast<char*>(base_) + offset_ * dtype_size(t_); }
  float* f32() const { return static_cast<float*>(ptr()); }
  size_t size() const { return n_; }
  DType dtype() const { return t_; }

  void upload(const Floats& host) {
    REQUIRE(host.size() == n_);
    std::vector<uint8_t> raw(n_ * dtype_size(t_));
    for (size_t i = 0; i < n_; ++i) dtype_store(raw.data(), i, t_, host[i]);
    DT_CUDA_CHECK(cudaMemcpy(ptr(), raw.data(), raw.size(), cudaMemcpyHostToDevice));
  }
  Floats download() const {
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> raw(n_ * dtype_size(t_));
    DT_CUDA_CHECK(cudaMemcpy(raw.data(), ptr(), raw.size(), cudaMemcpyDeviceToHost));
    Floats o(n_);
    for (size_t i = 0; i < n_; ++i) o[i] = dtype_load(raw.data(), i, t_);
    return o;
  }
  // All-ones bytes: NaN in fp32, bf16 and fp16, so an unwritten element cannot pass.
  void poison() { DT_CUDA_CHECK(cudaMemset(ptr(), 0xff, n_ * dtype_size(t_))); }
  // True when nothing was written past the end.
  bool guard_intact() const {
    const size_t tail = GUARD;
    std::vector<uint8_t> g(tail);
    DT_CUDA_CHECK(cudaMemcpy(g.data(), static_cast<char*>(ptr()) + n_ * dtype_size(t_), tail, cudaMemcpyDeviceToHost));
    return std::all_of(g.begin(), g.end(), [](uint8_t b) { return b == GUARD_BYTE; });
  }

 private:
  static constexpr uint8_t GUARD_BYTE = 0xa5;
  size_t n_, bytes_;
  DType t_;
  size_t offset_;
  void* base_ = nullptr;
};

// Rows [N, V] of v laid out ld >= V apart, the padding filled with `fill`; and back.
inline Floats rows_pad(const Floats& v, size_t N, size_t V, size_t ld, float fill = NAN) {
  Floats o(N * ld, fill);
  for (size_t n = 0; n < N; ++n) std::copy(v.begin() + n * V, v.begin() + (n + 1) * V, o.begin() + n * ld);
  return o;
}
inline Floats rows_unpad(const Floats& v, size_t N, size_t V, size_t ld) {
  Floats o(N * V);
  for (size_t n = 0; n < N; ++n) std::copy(v.begin() + n * ld, v.begin() + n * ld + V, o.begin() + n * V);
  return o;
}
// True when every padding element (columns V..ld-1) is still NaN: never written.
inline bool padding_nan(const Floats& v, size_t N, size_t V, size_t ld) {
  for (size_t n = 0; n < N; ++n)
    for (size_t i = V; i < ld; ++i)
      if (!std::isnan(v[n * ld + i])) return false;
  return true;
}

// Downloads `buf`, checks its guard zone, and returns its error against ref.
inline double buf_err(const DevBuf& buf, const Floats& ref) {
  if (!buf.guard_intact()) return INFINITY;
  return max_err(buf.download(), ref);
}

// ----------------------------------------------------------------------------
// The conformance table: each case runs CPU reference and kernel on fresh random
// inputs and returns the worst error over its outputs.
struct Case {
  std::string name;
  DType dtype;
  std::function<double()> run;
  double tol;
};

inline double tol_for(DType t, double f32_tol) { return t == DType::F32 ? f32_tol : t == DType::BF16 ? 1e-2 : 2e-3; }

inline void table_run(const std::vector<Case>& cases) {
  std::printf("%-40s %-9s %12s %10s\n", "case", "dtype", "max err", "tol");
  for (const Case& c : cases) {
    const double e = c.run();
    std::printf("%-40s %-9s %12.3e %10.1e %s\n", c.name.c_str(), dtype_name(c.dtype), e, c.tol,
                e <= c.tol ? "ok" : "FAIL");
    INFO(c.name, " ", dtype_name(c.dtype), " err ", e, " tol ", c.tol);
    CHECK(e <= c.tol);
  }
  std::fflush(stdout);
}

inline const DType ALL_DTYPES[] = {DType::F32, DType::BF16, DType::F16};

}  // namespace dtrain::kernels::test
