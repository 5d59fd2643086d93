// Conformance cases for the optimizer-step kernels: dtype casts (every pair), AdamW with
// and without the compute copy, the gradient sum of squares and the inf/NaN check,
// each against lib/train's CPU versions; aligned and misaligned (offset 1) buffers.
#include "cases.h"

#include "kernels/adamw.cuh"
#include "kernels/cast.cuh"
#include "kernels/reduce.cuh"
#include "ops/optim.h"
#include "ops/step_scale.h"
#include "train/grad_clip.h"
#include "train/loss_scaler.h"

#include <cstring>
#include <memory>

namespace dtrain::kernels::test {

namespace {

constexpr size_t N_ODD = 10007;  // not a multiple of any pack width: exercises the tails

double cast_case(DType from, DType to, size_t offset, uint64_t seed) {
  Rng r(seed);
  Floats x = rand_floats(r, N_ODD, 3.0f);
  x[5] = 1e6f;   // overflows fp16 -> inf on both sides
  x[6] = 1e-9f;  // fp16 subnormal/zero
  x[7] = NAN;
  const Floats xin = round_through(x, from);
  Floats ref(xin.size());
  for (size_t i = 0; i < xin.size(); ++i) {
    uint8_t raw[4];
    dtype_store(raw, 0, to, xin[i]);
    ref[i] = dtype_load(raw, 0, to);
  }
  DevBuf in(xin, from, offset), out(N_ODD, to, offset);
  out.poison();
  dtype_cast(out.ptr(), to, in.ptr(), from, N_ODD, nullptr);
  return buf_err(out, ref);
}

double adamw_case(DType copy, size_t offset, uint64_t seed) {
  Rng r(seed);
  const size_t n = N_ODD;
  Floats p = rand_floats(r, n), g = rand_floats(r, n, 0.1f), m = rand_floats(r, n, 0.01f), v(n);
  for (auto& x : v) x = r.uniform() * 1e-3f;
  ops::AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  const float lr = 3e-3f, gscale = 0.5f;
  const int64_t step = 7;
  DevBuf dp(p, DType::F32, offset), dg(g, DType::F32, offset), dm(m, DType::F32, offset), dv(v, DType::F32, offset);
  Floats p_ref = p, m_ref = m, v_ref = v;
  double e = 0;
  if (copy == DType::F32) {
    ops::adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, cfg, lr, step, true, gscale);
    adamw_step(dp.f32(), dg.f32(), dm.f32(), dv.f32(), n, cfg, lr, step, true, gscale, nullptr);
  } else {
    ops::adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, cfg, lr, step, true, gscale);
    DevBuf dc(n, copy, offset);
    dc.poison();
    adamw_step_copy(dp.f32(), dg.f32(), dm.f32(), dv.f32(), n, cfg, lr, step, true, gscale, dc.ptr(), copy, nullptr);
    // The copy must be exactly the device's own updated fp32 parameters rounded (the
    // fp32 values themselves may differ from the CPU's by an FMA rounding).
    if (max_err(dc.download(), round_through(dp.download(), copy)) != 0.0 || !dc.guard_intact()) e = INFINITY;
  }
  e = std::max(e, buf_err(dp, p_ref));
  e = std::max(e, buf_err(dm, m_ref));
  e = std::max(e, buf_err(dv, v_ref));
  return e;
}

// adamw_step_multi against one adamw_step / adamw_step_copy per tensor, bit for bit: more
// tensors than two tables hold, sizes from 0 to past two 4096-element chunks, every third
// tensor misaligned, decay on every other one, a compute copy on three in four (copy !=
// F32). dev: the lr values and the gradient scale from device memory (skip = the
// overflow flag set: nothing may change).
double adamw_multi_case(DType copy, bool dev, bool skip, uint64_t seed) {
  Rng r(seed);
  const int K = 2 * ADAMW_MULTI_MAX + 5;
  ops::AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  const float lr = 3e-3f, gscale = 0.5f;
  const int64_t step = 7;
  struct One {
    Floats p, g, m, v;
    std::unique_ptr<DevBuf> dp[2], dg, dm[2], dv[2], dc[2];
    ops::AdamWTensor x;
  };
  std::vector<One> t(K);
  for (int k = 0; k < K; ++k) {
    One& o = t[static_cast<size_t>(k)];
    const size_t n = k % 11 == 5 ? 9000 + k : (k * 131) % 700 + (k % 9 == 0 ? 0 : 1);
    const size_t off = k % 3 == 1 ? 1 : 0;
    o.p = rand_floats(r, n);
    o.g = rand_floats(r, n, 0.1f);
    o.m = rand_floats(r, n, 0.01f);
    o.v.resize(n);
    for (auto& x : o.v) x = r.uniform() * 1e-3f;
    o.dg = std::make_unique<DevBuf>(o.g, DType::F32, off);
    for (int side = 0; side < 2; ++side) {
      o.dp[side] = std::make_unique<DevBuf>(o.p, DType::F32, off);
      o.dm[side] = std::make_unique<DevBuf>(o.m, DType::F32, off);
      o.dv[side] = std::make_unique<DevBuf>(o.v, DType::F32, off);
      if (copy != DType::F32 && k % 4 != 3) {
        o.dc[side] = std::make_unique<DevBuf>(n, copy, off);
        o.dc[side]->poison();
      }
    }
    o.x.param = o.dp[1]->f32();
    o.x.grad = o.dg->f32();
    o.x.m = o.dm[1]->f32();
    o.x.v = o.dv[1]->f32();
    o.x.copy = o.dc[1] ? o.dc[1]->ptr() : nullptr;
    o.x.n = n;
    o.x.decay = k % 2 == 0;
  }
  // [grad scale, skip, decay factor, step size, sqrt(bc2)] as step_scale and the engine
  // leave them; the arguments then say otherwise, so reading them is what is tested.
  float host_scale[5] = {gscale, skip ? 1.0f : 0.0f, 0, 0, 0};
  ops::adamw_step_values(host_scale + 2, lr, cfg.weight_decay, cfg.beta1, cfg.beta2, step);
  float* d_scale = nullptr;
  if (dev) {
    DT_CUDA_CHECK(cudaMalloc(&d_scale, sizeof host_scale));
    DT_CUDA_CHECK(cudaMemcpy(d_scale, host_scale, sizeof host_scale, cudaMemcpyHostToDevice));
  }
  const float arg_lr = dev ? 1.0f : lr, arg_scale = dev ? 9.0f : gscale;
  for (One& o : t) {
    if (o.x.n == 0) continue;
    if (o.dc[0])
      adamw_step_copy(o.dp[0]->f32(), o.dg->f32(), o.dm[0]->f32(), o.dv[0]->f32(), o.x.n, cfg, arg_lr, step, o.x.decay,
                      arg_scale, o.dc[0]->ptr(), copy, nullptr, d_scale);
    else
      adamw_step(o.dp[0]->f32(), o.dg->f32(), o.dm[0]->f32(), o.dv[0]->f32(), o.x.n, cfg, arg_lr, step, o.x.decay,
                 arg_scale, nullptr, d_scale);
  }
  std::vector<ops::AdamWTensor> list;
  for (const One& o : t) list.push_back(o.x);
  adamw_step_multi(list.data(), list.size(), cfg, arg_lr, step, arg_scale, copy, nullptr, d_scale);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  if (d_scale) DT_CUDA_CHECK(cudaFree(d_scale));
  double e = 0;
  for (const One& o : t) {
    // Bit for bit the per-tensor kernel's results; a skipped step leaves the inputs.
    const Floats p = skip ? o.p : o.dp[0]->download(), m = skip ? o.m : o.dm[0]->download(),
                 v = skip ? o.v : o.dv[0]->download();
    if (!skip && o.x.n > 0 && p == o.p) e = INFINITY;  // the reference must have moved
    e = std::max({e, buf_err(*o.dp[1], p), buf_err(*o.dm[1], m), buf_err(*o.dv[1], v)});
    if (o.dc[1]) e = std::max(e, buf_err(*o.dc[1], o.dc[0]->download()));
  }
  return e;
}

double norm_case(DType t, size_t offset, uint64_t seed) {
  Rng r(seed);
  const Floats x = round_through(rand_floats(r, N_ODD), t);
  const double ref = ops::grad_norm_sq(x.data(), x.size());
  DevBuf dx(x, t, offset);
  double* d_acc = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&d_acc, sizeof(double)));
  const double start = 2.5;
  DT_CUDA_CHECK(cudaMemcpy(d_acc, &start, sizeof start, cudaMemcpyHostToDevice));
  grad_norm_sq(d_acc, dx.ptr(), x.size(), t, nullptr);
  grad_norm_sq(d_acc, dx.ptr(), x.size(), t, nullptr);  // accumulates
  double got = 0;
  DT_CUDA_CHECK(cudaMemcpy(&got, d_acc, sizeof got, cudaMemcpyDeviceToHost));
  DT_CUDA_CHECK(cudaFree(d_acc));
  const double want = start + 2 * ref;
  return std::isfinite(got) ? std::abs(got - want) / want : INFINITY;
}

// grad_norm_sq_multi over `count` fp32 buffers of mixed lengths (some empty, some one
// element past a 16-byte boundary, some large enough for many blocks): the result must be
// the bits of one grad_norm_sq per buffer on the device, and match the CPU's sum; the
// error against the CPU, or inf when the bits differ. Past 96 buffers the launcher splits
// the table.
double norm_multi_case(size_t count, uint64_t seed) {
  Rng r(seed);
  std::vector<Floats> xs(count);
  std::vector<std::unique_ptr<DevBuf>> bufs;
  std::vector<const float*> ptrs;
  std::vector<size_t> ns;
  double ref = 2.5;
  for (size_t k = 0; k < count; ++k) {
    const size_t n = k % 7 == 3 ? 0 : k % 5 == 1 ? N_ODD * 30 : 1 + r.below(3000);
    xs[k] = rand_floats(r, n);
    bufs.push_back(std::make_unique<DevBuf>(xs[k], DType::F32, k % 3 == 2 ? 1 : 0));
    ptrs.push_back(bufs.back()->f32());
    ns.push_back(n);
    ref += ops::grad_norm_sq(xs[k].data(), n);
  }
  double* d_acc = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&d_acc, 2 * sizeof(double)));
  const double start[2] = {2.5, 2.5};
  DT_CUDA_CHECK(cudaMemcpy(d_acc, start, sizeof start, cudaMemcpyHostToDevice));
  grad_norm_sq_multi(d_acc, ptrs.data(), ns.data(), count, nullptr);
  for (size_t k = 0; k < count; ++k)
    if (ns[k]) grad_norm_sq(d_acc + 1, ptrs[k], ns[k], DType::F32, nullptr);
  double got[2] = {0, 0};
  DT_CUDA_CHECK(cudaMemcpy(got, d_acc, sizeof got, cudaMemcpyDeviceToHost));
  DT_CUDA_CHECK(cudaFree(d_acc));
  if (std::memcmp(&got[0], &got[1], sizeof(double)) != 0) return INFINITY;
  return std::isfinite(got[0]) ? std::abs(got[0] - ref) / ref : INFINITY;
}

// 0 when the device flag matches train::has_inf_or_nan for clean, inf and NaN inputs.
double nonfinite_case(DType t, size_t offset, uint64_t seed) {
  Rng r(seed);
  double e = 0;
  for (int variant = 0; variant < 4; ++variant) {
    Floats x = round_through(rand_floats(r, N_ODD), t);
    if (variant == 1) x[N_ODD - 1] = INFINITY;  // in the scalar tail
    if (variant == 2) x[17] = NAN;
    if (variant == 3) x[4096] = -INFINITY;
    const bool want = train::has_inf_or_nan(x.data(), x.size());
    DevBuf dx(x, t, offset);
    int* flag = nullptr;
    DT_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    DT_CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
    has_inf_or_nan(flag, dx.ptr(), x.size(), t, nullptr);
    int got = -1;
    DT_CUDA_CHECK(cudaMemcpy(&got, flag, sizeof got, cudaMemcpyDeviceToHost));
    DT_CUDA_CHECK(cudaFree(flag));
    if (got != (want ? 1 : 0)) e = 1.0;
  }
  return e;
}

}  // namespace

std::vector<Case> cases_optim() {
  std::vector<Case> c;
  uint64_t seed = 100;
  for (DType from : ALL_DTYPES)
    for (DType to : ALL_DTYPES)
      for (size_t off : {0, 1}) {
        const std::string name = std::string("dtype_cast to ") + dtype_name(to) + (off ? " (unaligned)" : "");
        // Exact: both sides round the same value to nearest even.
        c.push_back({name, from, [=] { return cast_case(from, to, off, seed); }, 0.0});
        ++seed;
      }
  for (DType copy : ALL_DTYPES)
    for (size_t off : {0, 1}) {
      const std::string name =
          std::string(copy == DType::F32 ? "adamw_step" : "adamw_step_copy") + (off ? " (unaligned)" : "");
      c.push_back({name, copy, [=] { return adamw_case(copy, off, seed); }, 1e-5});
      ++seed;
    }
  for (DType copy : ALL_DTYPES)
    for (int mode = 0; mode < 3; ++mode) {
      const std::string name =
          std::string("adamw_step_multi") + (mode == 1 ? " (device lr)" : "") + (mode == 2 ? " (device skip)" : "");
      // Exact: the same element math as adamw_step, per tensor.
      c.push_back({name, copy, [=] { return adamw_multi_case(copy, mode > 0, mode == 2, seed); }, 0.0});
      ++seed;
    }
  for (DType t : ALL_DTYPES)
    for (size_t off : {0, 1}) {
      c.push_back({std::string("grad_norm_sq") + (off ? " (unaligned)" : ""), t,
                   [=] { return norm_case(t, off, seed); }, 1e-6});
      c.push_back({std::string("has_inf_or_nan") + (off ? " (unaligned)" : ""), t,
                   [=] { return nonfinite_case(t, off, seed); }, 0.0});
      ++seed;
    }
  for (size_t count : {size_t{1}, size_t{14}, size_t{200}}) {
    c.push_back({"grad_norm_sq_multi " + std::to_string(count) + " buffers", DType::F32,
                 [=] { return norm_multi_case(count, seed); }, 1e-6});
    ++seed;
  }
  return c;
}

}  // namespace dtrain::kernels::test
