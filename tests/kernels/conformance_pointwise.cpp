// Conformance cases for the pointwise kernels (GELU, SwiGLU, residual), RoPE and the
// embedding, forward and backward, against lib/ops. Accumulating outputs start from
// random values on both sides; overwritten outputs (forwards, the GELU and SwiGLU
// backward) are poisoned first.
#include "cases.h"

#include "kernels/activation.cuh"
#include "kernels/cast.cuh"
#include "kernels/compress.cuh"
#include "kernels/embedding.cuh"
#include "kernels/rope.cuh"
#include "ops/activation.h"
#include "ops/cast.h"
#include "ops/compress.h"
#include "ops/embedding.h"
#include "ops/rope.h"

#include <cstring>

namespace dtrain::kernels::test {

namespace {

constexpr size_t N_PW = 4099;

double gelu_case(DType t, size_t off, uint64_t seed) {
  Rng r(seed);
  const Floats x = input(r, N_PW, t, 2.0f), dout = input(r, N_PW, t);
  Floats out_ref(N_PW), dinp_ref(N_PW);
  ops::gelu_forward(out_ref.data(), x.data(), N_PW);
  ops::gelu_backward(dinp_ref.data(), x.data(), dout.data(), N_PW);
  DevBuf dx(x, t, off), dd(dout, t, off), out(N_PW, t, off), dinp(N_PW, t, off);
  out.poison();
  dinp.poison();
  gelu_forward(out.ptr(), dx.ptr(), N_PW, t, nullptr);
  gelu_backward(dinp.ptr(), dx.ptr(), dd.ptr(), N_PW, t, nullptr);
  const double e = std::max(buf_err(out, out_ref), buf_err(dinp, dinp_ref));
  gelu_backward(dd.ptr(), dx.ptr(), dd.ptr(), N_PW, t, nullptr);  // in place over dout
  return std::max(e, buf_err(dd, dinp_ref));
}

double swiglu_case(DType t, size_t off, uint64_t seed) {
  Rng r(seed);
  const Floats g = input(r, N_PW, t, 2.0f), u = input(r, N_PW, t), dout = input(r, N_PW, t);
  Floats out_ref(N_PW), dg_ref(N_PW), du_ref(N_PW);
  ops::swiglu_forward(out_ref.data(), g.data(), u.data(), N_PW);
  ops::swiglu_backward(dg_ref.data(), du_ref.data(), dout.data(), g.data(), u.data(), N_PW);
  DevBuf dgate(g, t, off), dup_in(u, t, off), dd(dout, t, off), out(N_PW, t, off), dg(N_PW, t, off), du(N_PW, t, off);
  out.poison();
  dg.poison();
  du.poison();
  swiglu_forward(out.ptr(), dgate.ptr(), dup_in.ptr(), 1, N_PW, N_PW, t, nullptr);
  swiglu_backward(dg.ptr(), du.ptr(), dd.ptr(), dgate.ptr(), dup_in.ptr(), 1, N_PW, N_PW, t, nullptr);
  return std::max({buf_err(out, out_ref), buf_err(dg, dg_ref), buf_err(du, du_ref)});
}

// SwiGLU over the column blocks of one fused [rows, ld] gate/up array (gate at column 0, up
// at column cols, `pad` columns after them): the outputs against the dense reference row
// by row, and the pad columns of the gradient array left as they were.
double swiglu_rows_case(DType t, size_t cols, size_t pad, uint64_t seed) {
  Rng r(seed);
  const size_t rows = 37, ld = 2 * cols + pad;
  const Floats gu = input(r, rows * ld, t, 2.0f), dout = input(r, rows * cols, t), d0 = input(r, rows * ld, t);
  Floats out_ref(rows * cols), dgu_ref = d0;
  for (size_t i = 0; i < rows; ++i) {
    const float* g = gu.data() + i * ld;
    ops::swiglu_forward(out_ref.data() + i * cols, g, g + cols, cols);
    ops::swiglu_backward(dgu_ref.data() + i * ld, dgu_ref.data() + i * ld + cols, dout.data() + i * cols, g, g + cols,
                         cols);
  }
  const size_t es = dtype_size(t);
  DevBuf dgu_in(gu, t), dd(dout, t), out(rows * cols, t), dgu(d0, t);
  out.poison();
  auto col = [&](const DevBuf& b, size_t c) { return static_cast<char*>(b.ptr()) + c * es; };
  swiglu_forward(out.ptr(), dgu_in.ptr(), col(dgu_in, cols), rows, cols, ld, t, nullptr);
  swiglu_backward(dgu.ptr(), col(dgu, cols), dd.ptr(), dgu_in.ptr(), col(dgu_in, cols), rows, cols, ld, t, nullptr);
  return std::max(buf_err(out, out_ref), buf_err(dgu, dgu_ref));
}

double residual_case(DType t, size_t off, uint64_t seed) {
  Rng r(seed);
  const Floats a = input(r, N_PW, t), b = input(r, N_PW, t), dout = input(r, N_PW, t);
  const Floats da0 = input(r, N_PW, t), db0 = input(r, N_PW, t);
  Floats out_ref(N_PW), da_ref = da0, db_ref = db0;
  ops::residual_forward(out_ref.data(), a.data(), b.data(), N_PW);
  ops::residual_backward(da_ref.data(), db_ref.data(), dout.data(), N_PW);
  DevBuf dA(a, t, off), dB(b, t, off), dd(dout, t, off), out(N_PW, t, off), da(da0, t, off), db(db0, t, off);
  out.poison();
  residual_forward(out.ptr(), dA.ptr(), dB.ptr(), N_PW, t, nullptr);
  residual_backward(da.ptr(), db.ptr(), dd.ptr(), N_PW, t, nullptr);
  // In place: out aliases a.
  residual_forward(dA.ptr(), dA.ptr(), dB.ptr(), N_PW, t, nullptr);
  return std::max({buf_err(out, out_ref), buf_err(dA, out_ref), buf_err(da, da_ref), buf_err(db, db_ref)});
}

double rope_case(DType t, int HD, bool backward, uint64_t seed, const ops::RopeFreq& rope) {
  Rng r(seed);
  const int B = 2, T = 37, NH = 4, NKV = 2;
  const size_t nq = static_cast<size_t>(B) * T * NH * HD, nk = static_cast<size_t>(B) * T * NKV * HD;
  Floats q = input(r, nq, t), k = input(r, nk, t);
  DevBuf dq(q, t), dk(k, t);
  if (backward) {
    ops::rope_backward(q.data(), k.data(), B, T, NH, NKV, HD, rope);
    rope_backward(dq.ptr(), dk.ptr(), B, T, NH, NKV, HD, rope, t, nullptr);
  } else {
    ops::rope_forward(q.data(), k.data(), B, T, NH, NKV, HD, rope);
    rope_forward(dq.ptr(), dk.ptr(), B, T, NH, NKV, HD, rope, t, nullptr);
  }
  return std::max(buf_err(dq, q), buf_err(dk, k));
}

// q and k as the column blocks of one fused [B*T, (NH + 2 NKV) HD + pad] q/k/v array (row
// pitch passed as both strides): the whole array against the reference, so v's columns
// and the pad stay as they were.
double rope_strided_case(DType t, int HD, int pad, bool backward, uint64_t seed) {
  Rng r(seed);
  const int B = 2, T = 37, NH = 4, NKV = 2, ld = (NH + 2 * NKV) * HD + pad;
  const ops::RopeFreq rope{10000.0f};
  Floats x = input(r, static_cast<size_t>(B) * T * ld, t);
  DevBuf dx(x, t);
  float* k = x.data() + static_cast<size_t>(NH) * HD;
  void* dk = static_cast<char*>(dx.ptr()) + static_cast<size_t>(NH) * HD * dtype_size(t);
  if (backward) {
    ops::rope_backward(x.data(), k, B, T, NH, NKV, HD, rope, nullptr, ld, ld);
    rope_backward(dx.ptr(), dk, B, T, NH, NKV, HD, rope, t, nullptr, nullptr, ld, ld);
  } else {
    ops::rope_forward(x.data(), k, B, T, NH, NKV, HD, rope, nullptr, ld, ld);
    rope_forward(dx.ptr(), dk, B, T, NH, NKV, HD, rope, t, nullptr, nullptr, ld, ld);
  }
  return buf_err(dx, x);
}

double embedding_case(DType t, int C, bool with_wpe, uint64_t seed) {
  Rng r(seed);
  const int B = 3, T = 29, V = 50;
  const size_t N = static_cast<size_t>(B) * T;
  std::vector<int32_t> tok(N);
  for (auto& x : tok) x = static_cast<int32_t>(r.below(V));
  const Floats wte = input(r, static_cast<size_t>(V) * C, t), wpe = input(r, static_cast<size_t>(T) * C, t);
  const Floats dout = input(r, N * C, t);
  const Floats dwte0 = rand_floats(r, static_cast<size_t>(V) * C), dwpe0 = rand_floats(r, static_cast<size_t>(T) * C);
  Floats out_ref(N * C), dwte_ref = dwte0, dwpe_ref = dwpe0;
  ops::embedding_forward(out_ref.data(), tok.data(), wte.data(), with_wpe ? wpe.data() : nullptr, B, T, C, V);
  ops::embedding_backward(dwte_ref.data(), with_wpe ? dwpe_ref.data() : nullptr, dout.data(), tok.data(), B, T, C);
  if (t != DType::F32) out_ref = round_through(out_ref, t);
  int32_t* dtok = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&dtok, N * sizeof(int32_t)));
  DT_CUDA_CHECK(cudaMemcpy(dtok, tok.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  DevBuf dwte_in(wte, t), dwpe_in(wpe, t), dd(dout, t), out(N * C, t), dwte(dwte0, DType::F32), dwpe(dwpe0, DType::F32);
  out.poison();
  embedding_forward(out.ptr(), dtok, dwte_in.ptr(), with_wpe ? dwpe_in.ptr() : nullptr, B, T, C, V, t, nullptr);
  embedding_backward(dwte.f32(), with_wpe ? dwpe.f32() : nullptr, dd.ptr(), dtok, B, T, C, V, t, nullptr);
  double e = std::max({buf_err(out, out_ref), buf_err(dwte, dwte_ref), buf_err(dwpe, dwpe_ref)});
  // An out-of-range token writes a NaN row instead of reading out of bounds.
  tok[4] = V + 3;
  DT_CUDA_CHECK(cudaMemcpy(dtok, tok.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  embedding_forward(out.ptr(), dtok, dwte_in.ptr(), nullptr, B, T, C, V, t, nullptr);
  const Floats got = out.download();
  for (int c = 0; c < C; ++c)
    if (!std::isnan(got[4 * static_cast<size_t>(C) + c])) e = INFINITY;
  // ... and backward skips it: dwte (exactly V rows, guarded) gets the other tokens only.
  std::vector<int32_t> valid = tok;
  valid.erase(valid.begin() + 4);
  Floats dout_valid = dout;
  dout_valid.erase(dout_valid.begin() + 4 * static_cast<size_t>(C), dout_valid.begin() + 5 * static_cast<size_t>(C));
  Floats dwte_bad_ref(static_cast<size_t>(V) * C, 0.0f);
  ops::embedding_backward(dwte_bad_ref.data(), nullptr, dout_valid.data(), valid.data(), 1, static_cast<int>(N) - 1, C);
  DevBuf dwte_bad(dwte_bad_ref.size(), DType::F32);
  DT_CUDA_CHECK(cudaMemset(dwte_bad.ptr(), 0, dwte_bad_ref.size() * sizeof(float)));
  embedding_backward(dwte_bad.f32(), nullptr, dd.ptr(), dtok, B, T, C, V, t, nullptr);
  e = std::max(e, buf_err(dwte_bad, dwte_bad_ref));
  DT_CUDA_CHECK(cudaFree(dtok));
  return e;
}

// dwte alone at a scale the parallel backward must get right: several sort chunks (N >
// 256), heavily repeated tokens (`distinct` ids, one of them V - 1), a vocabulary needing
// 3 radix passes and wider than a grid's y dimension, and tokens outside [0, V). Each row
// adds in position order from its starting value, as the CPU op: equal, not just close.
double embedding_dwte_case(DType t, int V, int distinct, int B, int T, int C, uint64_t seed) {
  Rng r(seed);
  const size_t N = static_cast<size_t>(B) * T;
  std::vector<int32_t> ids(static_cast<size_t>(distinct));
  for (auto& x : ids) x = static_cast<int32_t>(r.below(V));
  ids[0] = V - 1;
  std::vector<int32_t> tok(N);
  for (auto& x : tok) x = ids[r.below(distinct)];
  tok[5] = -5;  // invalid ids contribute nothing
  tok[N - 2] = V;
  const Floats dout = input(r, N * C, t), dwte0 = rand_floats(r, static_cast<size_t>(V) * C);
  Floats dwte_ref = dwte0;
  std::vector<int32_t> valid;
  Floats dout_valid;
  for (size_t n = 0; n < N; ++n) {
    if (tok[n] < 0 || tok[n] >= V) continue;
    valid.push_back(tok[n]);
    dout_valid.insert(dout_valid.end(), dout.begin() + n * C, dout.begin() + (n + 1) * C);
  }
  ops::embedding_backward(dwte_ref.data(), nullptr, dout_valid.data(), valid.data(), 1, static_cast<int>(valid.size()),
                          C);
  int32_t* dtok = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&dtok, N * sizeof(int32_t)));
  DT_CUDA_CHECK(cudaMemcpy(dtok, tok.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  DevBuf dd(dout, t), dwte(dwte0, DType::F32);
  embedding_backward(dwte.f32(), nullptr, dd.ptr(), dtok, B, T, C, V, t, nullptr);
  const double e = buf_err(dwte, dwte_ref);
  DT_CUDA_CHECK(cudaFree(dtok));
  return e;
}

// The 16-bit gradient wire's division by the world size (fp32 only): the same product.
double scale_case(size_t off, uint64_t seed) {
  Rng r(seed);
  const Floats x = rand_floats(r, N_PW, 3.0f);
  Floats ref = x;
  ops::scale_inplace(ref.data(), N_PW, 1.0f / 3.0f);
  DevBuf d(x, DType::F32, off);
  scale_f32(d.f32(), N_PW, 1.0f / 3.0f, nullptr);
  return buf_err(d, ref);
}

// Top-k with error feedback: the same picks, in the same order, with the same residual
// as ops::topk_select, bit for bit. Magnitudes drawn from 8 values (many ties, across
// the 4096-element tiles), a NaN (counts as +inf) and an inf; 0 when identical, else inf.
double topk_case(size_t n, size_t k, uint64_t seed) {
  Rng r(seed);
  Floats x(n);
  for (auto& v : x)
    v = static_cast<float>(static_cast<int>(r.uniform() * 8.0f)) * (r.uniform() < 0.5f ? -0.25f : 0.25f);
  x[n / 3] = NAN;
  x[n / 2] = -INFINITY;
  Floats res_ref = x, val_ref(k);
  std::vector<int32_t> idx_ref(k);
  ops::topk_select(res_ref.data(), n, k, val_ref.data(), idx_ref.data());
  DevBuf res(x, DType::F32), val(k, DType::F32);
  val.poison();
  int32_t* idx = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&idx, k * sizeof(int32_t)));
  topk_select(res.f32(), n, k, val.f32(), idx, nullptr);
  std::vector<int32_t> idx_got(k);
  DT_CUDA_CHECK(cudaMemcpy(idx_got.data(), idx, k * sizeof(int32_t), cudaMemcpyDeviceToHost));
  DT_CUDA_CHECK(cudaFree(idx));
  const Floats val_got = val.download(), res_got = res.download();
  const bool same = idx_got == idx_ref && std::memcmp(val_got.data(), val_ref.data(), k * sizeof(float)) == 0 &&
                    std::memcmp(res_got.data(), res_ref.data(), n * sizeof(float)) == 0;
  return same && res.guard_intact() && val.guard_intact() ? 0.0 : INFINITY;
}

// dense[indices[i]] += values[i] over distinct indices: one fp32 add per element, exact.
double sparse_add_case(uint64_t seed) {
  Rng r(seed);
  const Floats dense = rand_floats(r, N_PW, 2.0f);
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < static_cast<int32_t>(N_PW); ++i)
    if (r.uniform() < 0.3f) idx.push_back(i);
  const Floats vals = rand_floats(r, idx.size(), 2.0f);
  Floats ref = dense;
  ops::sparse_add(ref.data(), vals.data(), idx.data(), idx.size());
  DevBuf d(dense, DType::F32), v(vals, DType::F32);
  int32_t* di = nullptr;
  DT_CUDA_CHECK(cudaMalloc(&di, idx.size() * sizeof(int32_t)));
  DT_CUDA_CHECK(cudaMemcpy(di, idx.data(), idx.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  sparse_add(d.f32(), v.f32(), di, idx.size(), nullptr);
  const double e = buf_err(d, ref);
  DT_CUDA_CHECK(cudaFree(di));
  return e;
}

// PowerSGD's Gram-Schmidt: the columns against ops::orthogonalize_columns (both sum in
// double, in different orders), a zero column included.
double orthogonalize_case(size_t rows, size_t cols, uint64_t seed) {
  Rng r(seed);
  Floats a = rand_floats(r, rows * cols, 1.0f);
  for (size_t i = 0; i < rows; ++i) a[i * cols + cols / 2] = 0.0f;
  Floats ref = a;
  ops::orthogonalize_columns(ref.data(), rows, cols);
  DevBuf d(a, DType::F32);
  orthogonalize_columns(d.f32(), rows, cols, nullptr);
  return buf_err(d, ref);
}

}  // namespace

std::vector<Case> cases_pointwise() {
  std::vector<Case> c;
  uint64_t seed = 200;
  for (size_t off : {0, 1})
    c.push_back({std::string("scale f32") + (off ? " (unaligned)" : ""), DType::F32,
                 [=] { return scale_case(off, 190 + off); }, 0.0});
  for (const auto& [n, k] : {std::pair<size_t, size_t>{4099 * 3, 1},
                             {4099 * 3, 37},
                             {4099 * 3, 4099},
                             {4099 * 3, 4099 * 3},
                             {100, 100},
                             {5, 2}})
    c.push_back({"topk select n=" + std::to_string(n) + " k=" + std::to_string(k), DType::F32,
                 [n, k] { return topk_case(n, k, 300 + k); }, 0.0});
  c.push_back({"sparse add", DType::F32, [] { return sparse_add_case(310); }, 0.0});
  for (const auto& [rows, cols] : {std::pair<size_t, size_t>{300, 4}, {7, 3}, {1, 1}})
    c.push_back({"orthogonalize " + std::to_string(rows) + "x" + std::to_string(cols), DType::F32,
                 [rows, cols] { return orthogonalize_case(rows, cols, 320 + rows); }, 1e-5});
  for (DType t : ALL_DTYPES) {
    for (size_t off : {0, 1}) {
      const std::string u = off ? " (unaligned)" : "";
      c.push_back({"gelu fwd+bwd" + u, t, [=] { return gelu_case(t, off, seed + 1); }, tol_for(t, 1e-5)});
      c.push_back({"swiglu fwd+bwd" + u, t, [=] { return swiglu_case(t, off, seed + 2); }, tol_for(t, 1e-5)});
      // Fused gate/up rows: 72 columns take the 16-byte packs, 70 (+ 3 pad) the scalar path.
      const size_t cols = off ? 70 : 72, pad = off ? 3 : 0;
      c.push_back({"swiglu fwd+bwd fused rows cols=" + std::to_string(cols) + " pad=" + std::to_string(pad), t,
                   [=] { return swiglu_rows_case(t, cols, pad, seed + 2); }, tol_for(t, 1e-5)});
      c.push_back({"residual fwd+bwd" + u, t, [=] { return residual_case(t, off, seed + 3); }, tol_for(t, 1e-6)});
      seed += 4;
    }
    // RoPE types: default; linear (factor 4); llama3 with a short original context so the
    // pairs of HD = 16 fall in all three bands (kept, blended, scaled).
    ops::RopeFreq linear{500000.0f, ops::RopeFreq::LINEAR, 4.0f};
    ops::RopeFreq llama3{500000.0f, ops::RopeFreq::LLAMA3, 8.0f, 1.0f, 4.0f, 64};
    for (int hd : {16, 12})
      for (bool bwd : {false, true})
        for (const auto& named :
             {std::pair{"", ops::RopeFreq{10000.0f}}, std::pair{" linear", linear}, std::pair{" llama3", llama3}}) {
          const ops::RopeFreq rope = named.second;
          c.push_back({std::string("rope ") + (bwd ? "bwd" : "fwd") + " HD=" + std::to_string(hd) + named.first, t,
                       [=] { return rope_case(t, hd, bwd, seed, rope); }, tol_for(t, 1e-5)});
          ++seed;
        }
    for (int hd : {16, 12})
      for (int pad : {0, 3})
        for (bool bwd : {false, true}) {
          c.push_back({std::string("rope ") + (bwd ? "bwd" : "fwd") + " HD=" + std::to_string(hd) +
                           " strided (fused q/k/v rows, pad " + std::to_string(pad) + ")",
                       t, [=] { return rope_strided_case(t, hd, pad, bwd, seed); }, tol_for(t, 1e-5)});
          ++seed;
        }
    for (int C : {72, 70})
      for (bool wpe : {true, false}) {
        c.push_back({"embedding fwd+bwd C=" + std::to_string(C) + (wpe ? " +wpe" : ""), t,
                     [=] { return embedding_case(t, C, wpe, seed); }, tol_for(t, 1e-6)});
        ++seed;
      }
    struct Emb {
      int V, distinct, B, T, C;
    };
    for (Emb m : {Emb{300, 7, 4, 150, 40}, Emb{70000, 40, 3, 200, 8}, Emb{9, 1, 2, 333, 36}}) {
      c.push_back({"embedding dwte V=" + std::to_string(m.V) + " ids=" + std::to_string(m.distinct) +
                       " N=" + std::to_string(m.B * m.T),
                   t, [=] { return embedding_dwte_case(t, m.V, m.distinct, m.B, m.T, m.C, seed); }, 0.0});
      ++seed;
    }
  }
  return c;
}

}  // namespace dtrain::kernels::test
