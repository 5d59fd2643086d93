// The cost of every Device op on CUDA, as PlanDevice's ops (the copies' and memsets' are
// PlanRuntime's, plan_runtime.cpp): for the arguments given, the
// launches cuda_device.cpp and the kernels/ launchers issue (same early returns, same
// vector-or-scalar choice from the pointers' alignment, same launch text), each with its
// FLOPs, bytes and unit. When a kernel or a launcher changes, its function here is the
// one place to update; tests/gpu/plan_trace_test.cpp holds this file to the real launches.
//
// Bytes are each array's global-memory reads and writes once (re-reads inside a kernel,
// e.g. a norm's second pass or attention's K/V tiles, are taken to hit L1/L2). FLOPs of
// the elementwise and reduction kernels are rough per-element counts (a transcendental
// as 4); those kernels are memory-bound by a wide margin, so only the order matters.
#include "device/plan_device.h"
#include "ops/attention.h"

#include "core/check.h"
#include "core/env.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::device {

namespace {

// Per-element FLOP counts of the elementwise kernels.
constexpr double FLOPS_GELU_FWD = 12, FLOPS_GELU_BWD = 20, FLOPS_SWIGLU_FWD = 8, FLOPS_SWIGLU_BWD = 14;
constexpr double FLOPS_DROPOUT = 10;  // the counter-based hash per element
constexpr double FLOPS_ADAMW = 16, FLOPS_CE = 6, FLOPS_ROPE_PAIR = 6, FLOPS_ROPE_TABLE = 20;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
double es(DType t) { return static_cast<double>(dtype_size(t)); }
// kernels/common.cuh: VEC16, blocks_for, grid_for.
size_t vec16(DType t) { return 16 / dtype_size(t); }
size_t blocks_for(size_t items, size_t per_block) { return (items + per_block - 1) / per_block; }
size_t grid_for(size_t items, size_t threads, size_t max_blocks) {
  return std::min(std::max<size_t>(blocks_for(items, threads), 1), max_blocks);
}

// kernels/attention.cu: head dimensions per lane, and the causal 32 x 32 tile pairs one
// (batch, query head) visits (diagonal tiles computed whole).
int attn_dpl(int HD) { return HD <= 64 ? 2 : HD <= 128 ? 4 : 8; }
double attn_tile_pairs(int T) {
  const double nt = static_cast<double>(blocks_for(static_cast<size_t>(T), 32));
  return nt * (nt + 1) / 2;
}

}  // namespace

// ----------------------------------------------------------------------------
// GEMMs (kernels/gemm.cu). cuBLASLt's heuristic is assumed to offer the BGRADB epilogue,
// as the CPU execution engine's does; without it linear_backward's dW would be a plain
// GEMM plus the column-sum kernels of column_sums(mode 2) over dout.
void PlanDevice::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const void*, const void*, float beta, void*,
                      DType ab_t, DType c_t) {
  if (M == 0 || N == 0) return;
  matmul("gemm", ta, tb, M, N, K, alpha, beta, ab_t, c_t, PlanEpilogue::DEFAULT);
}
// Row pitches change where the operands lie, not what cuBLASLt reads or computes.
void PlanDevice::gemm_ld(bool ta, bool tb, int M, int N, int K, float alpha, const void*, int, const void*, int,
                         float beta, void*, int, DType ab_t, DType c_t) {
  if (M == 0 || N == 0) return;
  matmul("gemm", ta, tb, M, N, K, alpha, beta, ab_t, c_t, PlanEpilogue::DEFAULT);
}

void PlanDevice::linear(const char* op, const void* bias, int N, int IC, int OC, DType t) {
  if (N == 0) return;
  matmul(op, false, true, N, OC, IC, 1.0f, 0.0f, t, t, bias ? PlanEpilogue::BIAS : PlanEpilogue::DEFAULT);
}
void PlanDevice::linear_forward(void*, const void*, const void*, const void* bias, int N, int IC, int OC, int,
                                DType t) {
  linear("linear_forward", bias, N, IC, OC, t);
}
// CudaDevice: the fused epilogue when OC % 8 == 0, else linear_forward + gelu_forward.
void PlanDevice::linear_gelu_forward(void* out, void* pre, const void*, const void*, const void* bias, int N, int IC,
                                     int OC, DType t) {
  const char* op = "linear_gelu_forward";
  if (OC % 8 == 0) {
    if (N == 0) return;
    matmul(op, false, true, N, OC, IC, 1.0f, 0.0f, t, t, bias ? PlanEpilogue::GELU_AUX_BIAS : PlanEpilogue::GELU_AUX);
    return;
  }
  linear(op, bias, N, IC, OC, t);
  pointwise(op, false, {pre, out}, 1, 1, static_cast<size_t>(N) * OC, t, FLOPS_GELU_FWD);
}
// kernels/gemm.cu's weight_grads: BGRADB writes the bias gradient to an OC-float scratch
// that add_f32 adds to dbias.
void PlanDevice::weight_grads(const char* op, bool dw, bool db, int N, int IC, int OC, DType t) {
  if (dw && db) {
    matmul(op, true, false, OC, IC, N, 1.0f, 1.0f, t, DType::F32, PlanEpilogue::BGRADB);
    kernel(op, "add_kernel", PlanUnit::CUDA_CORE, static_cast<double>(OC), OC * 12.0);
    return;
  }
  if (dw) matmul(op, true, false, OC, IC, N, 1.0f, 1.0f, t, DType::F32, PlanEpilogue::DEFAULT);
  if (db) column_sums(op, 2, false, true, N, OC, t);
}
void PlanDevice::linear_backward(void* dinp, float* dweight, float* dbias, const void*, const void*, const void*, int N,
                                 int IC, int OC, int, bool accumulate_dinp, DType t) {
  const char* op = "linear_backward";
  if (N == 0) return;
  if (dinp) matmul(op, false, false, N, IC, OC, 1.0f, accumulate_dinp ? 1.0f : 0.0f, t, t, PlanEpilogue::DEFAULT);
  weight_grads(op, dweight != nullptr, dbias != nullptr, N, IC, OC, t);
}
// CudaDevice: the DGELU epilogue when IC % 8 == 0, else the plain backward + gelu_backward
// in place.
void PlanDevice::linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void*, const void*, const void*,
                                       const void* pre, int N, int IC, int OC, DType t) {
  const char* op = "linear_dgelu_backward";
  if (N == 0) return;
  if (IC % 8 == 0) {
    matmul(op, false, false, N, IC, OC, 1.0f, 0.0f, t, t, PlanEpilogue::DGELU);
    weight_grads(op, dweight != nullptr, dbias != nullptr, N, IC, OC, t);
    return;
  }
  matmul(op, false, false, N, IC, OC, 1.0f, 0.0f, t, t, PlanEpilogue::DEFAULT);
  weight_grads(op, dweight != nullptr, dbias != nullptr, N, IC, OC, t);
  pointwise(op, false, {pre, dpre, dpre}, 2, 1, static_cast<size_t>(N) * IC, t, FLOPS_GELU_BWD);
}

// ----------------------------------------------------------------------------
// Norms (kernels/norm.cu). The forward launch is the lambda parameter `kernel` for both
// the vector and the scalar variant.
void PlanDevice::norm_forward(const char* op, bool layer, bool fused, const void* bias, int N, int C, DType t) {
  if (N <= 0) return;
  const double nc = static_cast<double>(N) * C;
  double bytes = nc * es(t) * (fused ? 4.0 : 2.0) + C * es(t) * (layer && bias ? 2.0 : 1.0);
  bytes += static_cast<double>(N) * 4 * (layer ? 2 : 1);  // mean, rstd
  kernel(op, "kernel", PlanUnit::CUDA_CORE, nc * ((layer ? 10.0 : 6.0) + (fused ? 1.0 : 0.0)), bytes);
}

// Column sums of kernels/norm.cu (mode 0 LayerNorm dw/db, 1 RMSNorm dw, 2 plain sum into
// db): 128-row chunk partials, then one finishing launch for every output.
void PlanDevice::column_sums(const char* op, int mode, bool dw, bool db, int N, int C, DType t) {
  const double nc = static_cast<double>(N) * C;
  const double part = static_cast<double>(blocks_for(static_cast<size_t>(N), 128)) * C;
  const int outs = (dw ? 1 : 0) + (db ? 1 : 0);
  double bytes = nc * es(t) + part * 4 * outs;                                           // dout (or x) in, partials out
  if (mode < 2) bytes += nc * es(t) + static_cast<double>(N) * 4 * (mode == 0 ? 2 : 1);  // inp, stats
  kernel(op, "column_partial_kernel<T, MODE>", PlanUnit::CUDA_CORE, nc * (mode == 0 ? 5 : mode == 1 ? 3 : 1), bytes);
  kernel(op, "column_finish_kernel", PlanUnit::CUDA_CORE, part * outs, (part * 4 + static_cast<double>(C) * 8) * outs);
}

void PlanDevice::norm_backward(const char* op, bool layer, const void* dinp, const void* dout, const void* inp,
                               const void* w, bool dw, bool db, int N, int C, DType t) {
  if (N <= 0 || C <= 0) return;
  const bool vec =
      static_cast<size_t>(C) % vec16(t) == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
  db = layer && db;
  // DTRAIN_NORM_BACKWARD=fused (kernels/norm.cu's norm_backward_fused): one kernel reads dout,
  // inp and dinp once, writes dinp and 32-row chunk partials; the wide finish sums them.
  const char* knob = env_get("DTRAIN_NORM_BACKWARD");
  if (dinp && (dw || db) && knob != nullptr && std::string_view(knob) == "fused") {
    const double nc = static_cast<double>(N) * C;
    const double part = static_cast<double>(blocks_for(static_cast<size_t>(N), 32)) * C;
    const int outs = (dw ? 1 : 0) + (db ? 1 : 0);
    const double bytes = nc * es(t) * 4 + C * es(t) + static_cast<double>(N) * 4 * (layer ? 2 : 1) + part * 4 * outs;
    kernel(op, vec ? "norm_backward_fused_kernel<T, V, K>" : "norm_backward_fused_kernel<T, 1, K>", PlanUnit::CUDA_CORE,
           nc * (layer ? 17.0 : 11.0), bytes);
    kernel(op, "column_finish_wide_kernel", PlanUnit::CUDA_CORE, part * outs,
           (part * 4 + static_cast<double>(C) * 8) * outs);
    return;
  }
  if (dinp) {
    const double nc = static_cast<double>(N) * C;
    const double bytes = nc * es(t) * 4 + C * es(t) + static_cast<double>(N) * 4 * (layer ? 2 : 1);
    kernel(op, vec ? "norm_dinp_kernel<T, V, K>" : "norm_dinp_kernel<T, 1, K>", PlanUnit::CUDA_CORE,
           nc * (layer ? 12.0 : 8.0), bytes);
  }
  if (dw || db) column_sums(op, layer ? 0 : 1, dw, db, N, C, t);
}

void PlanDevice::layernorm_forward(void*, float*, float*, const void*, const void*, const void* bias, int N, int C,
                                   float, DType t) {
  norm_forward("layernorm_forward", true, false, bias, N, C, t);
}
void PlanDevice::residual_layernorm_forward(void*, void*, float*, float*, const void*, const void*, const void*,
                                            const void* bias, int N, int C, float, DType t) {
  norm_forward("residual_layernorm_forward", true, true, bias, N, C, t);
}
void PlanDevice::layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                                    const void* w, const float*, const float*, int N, int C, DType t) {
  norm_backward("layernorm_backward", true, dinp, dout, inp, w, dw != nullptr, dbias != nullptr, N, C, t);
}
void PlanDevice::rmsnorm_forward(void*, float*, const void*, const void*, int N, int C, float, DType t) {
  norm_forward("rmsnorm_forward", false, false, nullptr, N, C, t);
}
void PlanDevice::residual_rmsnorm_forward(void*, void*, float*, const void*, const void*, const void*, int N, int C,
                                          float, DType t) {
  norm_forward("residual_rmsnorm_forward", false, true, nullptr, N, C, t);
}
void PlanDevice::rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float*,
                                  int N, int C, DType t) {
  norm_backward("rmsnorm_backward", false, dinp, dout, inp, w, dw != nullptr, false, N, C, t);
}

// ----------------------------------------------------------------------------
// Pointwise (kernels/activation.cu, dropout.cu). ptrs: the NIN inputs, then the NOUT
// outputs (read too when accumulating).
void PlanDevice::pointwise(const char* op, bool acc, const std::vector<const void*>& ptrs, int nin, int nout, size_t n,
                           DType t, double flops_per_element, bool packs_fit) {
  if (n == 0) return;
  bool vec = packs_fit;
  for (const void* p : ptrs) vec = vec && aligned16(p);
  const double bytes = static_cast<double>(n) * es(t) * (nin + nout * (acc ? 2 : 1));
  kernel(op,
         vec ? "pointwise_kernel<T, V, ACC, ROWS, NIN, NOUT, Op>" : "pointwise_kernel<T, 1, ACC, ROWS, NIN, NOUT, Op>",
         PlanUnit::CUDA_CORE, static_cast<double>(n) * flops_per_element, bytes);
}
void PlanDevice::gelu_forward(void* out, const void* inp, size_t n, DType t) {
  pointwise("gelu_forward", false, {inp, out}, 1, 1, n, t, FLOPS_GELU_FWD);
}
void PlanDevice::gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) {
  pointwise("gelu_backward", false, {inp, dout, dinp}, 2, 1, n, t, FLOPS_GELU_BWD);
}
// Over the column blocks of a fused array (ld > cols) the packs must also fit every row.
void PlanDevice::swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                                DType t) {
  const bool fit = ld == cols || (cols % vec16(t) == 0 && ld % vec16(t) == 0);
  pointwise("swiglu_forward", false, {gate, up, out}, 2, 1, rows * cols, t, FLOPS_SWIGLU_FWD, fit);
}
void PlanDevice::swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                 size_t rows, size_t cols, size_t ld, DType t) {
  const bool fit = ld == cols || (cols % vec16(t) == 0 && ld % vec16(t) == 0);
  pointwise("swiglu_backward", false, {dout, gate, up, dgate, dup}, 3, 2, rows * cols, t, FLOPS_SWIGLU_BWD, fit);
}
void PlanDevice::dropout_forward(void*, const void*, size_t n, float, uint64_t, DType t) {
  if (n == 0) return;
  kernel("dropout_forward", "dropout_forward_kernel<T>", PlanUnit::CUDA_CORE, n * FLOPS_DROPOUT, 2.0 * n * es(t));
}
void PlanDevice::dropout_backward(void*, const void*, size_t n, float, uint64_t, DType t) {
  if (n == 0) return;
  kernel("dropout_backward", "dropout_backward_kernel<T>", PlanUnit::CUDA_CORE, n * FLOPS_DROPOUT, 3.0 * n * es(t));
}

// ----------------------------------------------------------------------------
// RoPE (kernels/rope.cu): the cos/sin table, then q and k rotated in place. The CUDA
// device builds the table once per (T, HD, frequencies) and keeps it (up to 32 of them;
// this plan never captures a graph, which would build it per call): a step after the
// warm-up has no table kernel.
void PlanDevice::rope(const char* op, const void* q, const void* k, int B, int T, int NH, int NKV, int HD, int q_stride,
                      int kv_stride, const RopeFreq& rope, DType t) {
  if (B <= 0 || T <= 0) return;
  const size_t half = static_cast<size_t>(HD) / 2;
  const double table = static_cast<double>(T) * half;
  auto same = [&](const RopeKey& e) {
    const RopeFreq& a = e.rope;
    return e.T == T && e.HD == HD && a.theta == rope.theta && a.type == rope.type && a.factor == rope.factor &&
           a.low_freq_factor == rope.low_freq_factor && a.high_freq_factor == rope.high_freq_factor &&
           a.original_max_position == rope.original_max_position;
  };
  if (std::none_of(rope_keys_.begin(), rope_keys_.end(), same)) {
    if (rope_keys_.size() < 32) rope_keys_.push_back({T, HD, rope});
    kernel(op, "rope_table_kernel", PlanUnit::CUDA_CORE, table * FLOPS_ROPE_TABLE, table * 8);
  }
  auto apply = [&](const void* x, int H, int stride) {
    const double pairs = static_cast<double>(B) * T * H * half;
    const size_t row = stride > 0 ? static_cast<size_t>(stride) : static_cast<size_t>(H) * HD;
    const bool vec = half % vec16(t) == 0 && row % vec16(t) == 0 && aligned16(x);
    kernel(op, vec ? "rope_apply_kernel<T, V>" : "rope_apply_kernel<T, 1>", PlanUnit::CUDA_CORE,
           pairs * FLOPS_ROPE_PAIR, pairs * 4 * es(t) + table * 8);
  };
  apply(q, NH, q_stride);
  if (k) apply(k, NKV, kv_stride);
}
void PlanDevice::rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                              const RopeFreq& freq, const int32_t*, DType t) {
  rope("rope_forward", q, k, B, T, NH, NKV, HD, q_stride, kv_stride, freq, t);
}
void PlanDevice::rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                               const RopeFreq& freq, const int32_t*, DType t) {
  rope("rope_backward", dq, dk, B, T, NH, NKV, HD, q_stride, kv_stride, freq, t);
}

// ----------------------------------------------------------------------------
// Attention (kernels/attention.cu, attention_mma.cu). Bytes: q, k, v, out (dout, dq, dk, dv)
// and the fp32 row statistics from HBM once; on tensor cores the tiles the blocks load again
// are counted apart (PlanLaunch::reread_bytes): the budget's fast end takes them from L2, its
// slow end from HBM.
// fp32 on CUDA cores: per causal tile pair of 32 queries x 32 keys, forward 2 HD (scores) +
// 2 HDP (P V) FLOPs per score, dq 4 HD + 2 HDP, dk/dv 4 HD + 4 HDP (HDP: HD padded to 32 x
// DPL); launches `kernel`, `kq`, `kkv`. bf16/fp16 on tensor cores: 64 x 64 tile pairs with
// HD padded to 32/64/128/256; forward 2 products (4 HDP FLOPs per score); backward
// `kernel_dkdv` (S^T, dP^T, dV, dK: 8 HDP; one block per KV head and key tile, walking its G
// query heads) and `kernel_dq` (S, dP, dQ: 6 HDP). The tiles are the legacy variant's
// (DTRAIN_ATTN_VARIANT unset); fa2's 128-row forward and dQ tiles are not modelled (fa2, and
// hopper's backward and fall back, are priced as legacy's); hopper's own forward is, where it
// runs.
size_t PlanDevice::attention_saved_floats(int B, int T, int NH) const { return static_cast<size_t>(B) * NH * T; }

namespace {
double mma_hdp(int HD) { return HD <= 32 ? 32 : HD <= 64 ? 64 : HD <= 128 ? 128 : 256; }
double mma_scores(int B, int T, int NH) {  // scores computed: causal 64 x 64 tile pairs
  const double nt = static_cast<double>(blocks_for(static_cast<size_t>(T), 64));
  return static_cast<double>(B) * NH * nt * (nt + 1) / 2 * 4096;
}

// The launch geometry of kernels/attention_mma.cu: grid (B*NH, T/64) (dK/dV: B*NKV), 128
// threads, shared memory from its fwd_bytes / dkdv_bytes / dq_bytes (rows of HDP + 8 elements;
// dK/dV also stages the fp32 lse and D rows), a one-stage variant compiled where two stages
// exceed the smallest card's 99 KB. NH: the heads of the grid.
enum class MmaKernel { FWD, DKDV, DQ };
PlanLaunch mma_launch(MmaKernel k, int B, int T, int NH, int HD, DType t) {
  static constexpr const char* NAMES[] = {"attn_fwd_mma_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"};
  PlanLaunch l;
  l.kernel = NAMES[static_cast<int>(k)];
  l.hdp = static_cast<int>(mma_hdp(HD));
  const int64_t nt = static_cast<int64_t>(blocks_for(static_cast<size_t>(T), 64));
  l.blocks = static_cast<int64_t>(B) * NH * nt;
  l.threads = 128;
  const size_t elems = 64 * static_cast<size_t>(l.hdp + 8), e = dtype_size(t);
  auto bytes = [&](size_t stages) {
    if (k == MmaKernel::FWD) return e * (1 + 2 * stages) * elems;
    return e * (2 + 2 * stages) * elems + (k == MmaKernel::DKDV ? sizeof(float) * 2 * stages * 64 : 0);
  };
  l.smem_two_stages = bytes(2);
  l.smem_one_stage = bytes(1);
  l.one_stage_built = l.smem_two_stages > 99 * 1024;
  return l;
}

// The hopper variant's forward (kernels/attention_hopper.cu): grid (B*NH, T/128), 288
// threads (two consumer warpgroups of 64 query rows and a producer warp), its dynamic shared
// memory hopper_bytes (1024-byte alignment pad and barriers, the 128-row Q tile and a
// two-stage ring of 64-key K and V tiles, 16-bit elements). tests/gpu/plan_trace_test.cpp holds
// this geometry to the engine's launches.
size_t hopper_bytes(int HD) { return 2048 + 128 * static_cast<size_t>(HD) * 2 + 4 * 64 * static_cast<size_t>(HD) * 2; }
PlanLaunch hopper_launch(int B, int T, int NH, int HD) {
  PlanLaunch l;
  l.kernel = "attn_fwd_hopper_kernel";
  l.hdp = HD;
  l.blocks = static_cast<int64_t>(B) * NH * static_cast<int64_t>(blocks_for(static_cast<size_t>(T), 128));
  l.threads = 288;
  l.smem_two_stages = l.smem_one_stage = hopper_bytes(HD);  // its ring has two stages; no other build
  return l;
}
// The K/V tile pairs its blocks load: block qt (rows 128 qt..) the 64-key tiles 0 .. its last
// row's, one load serving both warpgroups. Per (batch, query head).
double hopper_tile_loads(int T) {
  const int64_t nt64 = static_cast<int64_t>(blocks_for(static_cast<size_t>(T), 64));
  const int64_t nt128 = static_cast<int64_t>(blocks_for(static_cast<size_t>(T), 128));
  double loads = 0;
  for (int64_t qt = 0; qt < nt128; ++qt) loads += static_cast<double>(std::min<int64_t>(2 * qt + 2, nt64));
  return loads;
}

// The variants the kernels accept (kernels/attention_mma.cu's variant()).
std::string attn_variant_checked(const std::string& v) {
  DT_ENFORCE(v.empty() || v == "legacy" || v == "fa2" || v == "hopper", UsageError,
             "env DTRAIN_ATTN_VARIANT={}: give legacy, fa2 or hopper (or leave it unset: legacy)", v);
  return v.empty() ? "legacy" : v;
}
}  // namespace

PlanDevice::PlanDevice(Kind kind) : PlanRuntime(kind) {
  const char* v = env_get("DTRAIN_ATTN_VARIANT");
  attn_variant_ = attn_variant_checked(v ? v : "");
}

void PlanDevice::set_attention_variant(const std::string& variant) { attn_variant_ = attn_variant_checked(variant); }

void PlanDevice::attention_forward(void* out, float*, const void* q_ptr, const void* k_ptr, const void* v_ptr, int B,
                                   int T, int NH, int NKV, int HD, int q_stride, int kv_stride, int /*window*/,
                                   const int32_t* /*doc_start*/, DType t) {
  // A window or packed documents skip key tiles; the plan costs the full causal triangle
  // (an upper bound: the batch's documents are not known when it is planned).
  if (B == 0 || T == 0) return;
  const double q = static_cast<double>(B) * T * NH * HD * es(t), kv = static_cast<double>(B) * T * NKV * HD * es(t);
  const double rows = static_cast<double>(B) * NH * T * 4;
  // The hopper forward where kernels/attention_hopper.cu runs it: attention_hopper_runs (a
  // compute capability 9.0 card, head dim 64 or 128, bf16/fp16, its shared memory within the
  // card's opt-in size; the build taken to carry its sm_90a image, as every build with 90
  // among its architectures does) and attention_forward_hopper's alignment (rows of q, k, v
  // 16-byte aligned, out 4-byte). It writes out and the lse only, as the mma.sync forward:
  // no workspace. Its warpgroups skip the key tiles none of their 64 rows sees, so it computes
  // the 64 x 64 causal tile pairs the mma.sync forward does.
  const auto rows16 = [&](const void* p, int stride) { return aligned16(p) && HD % 8 == 0 && stride % 8 == 0; };
  if (t != DType::F32 && attn_variant_ == "hopper" && sm_ == 90 && (HD == 64 || HD == 128) &&
      hopper_bytes(HD) <= smem_optin_ && rows16(q_ptr, q_stride) && rows16(k_ptr, kv_stride) &&
      rows16(v_ptr, kv_stride) && (reinterpret_cast<uintptr_t>(out) & 3u) == 0) {
    PlanLaunch l = hopper_launch(B, T, NH, HD);
    const double tile = 64.0 * HD * es(t);
    l.reread_bytes = std::max(0.0, static_cast<double>(B) * NH * hopper_tile_loads(T) * 2 * tile - 2 * kv);
    kernel("attention_forward", "kernel", PlanUnit::TENSOR_ATTN_FWD, mma_scores(B, T, NH) * 4.0 * HD,
           2 * q + 2 * kv + rows, &l);
    return;
  }
  if (t != DType::F32) {
    // Each block loads its Q tile once and the K, V tiles of every key tile up to its own.
    PlanLaunch l = mma_launch(MmaKernel::FWD, B, T, NH, HD, t);
    const double tile = 64.0 * HD * es(t), pairs = mma_scores(B, T, NH) / 4096;
    l.reread_bytes = std::max(0.0, pairs * 2 * tile - 2 * kv);
    kernel("attention_forward", "kernel", PlanUnit::TENSOR_ATTN_FWD, mma_scores(B, T, NH) * 4.0 * mma_hdp(HD),
           2 * q + 2 * kv + rows, &l);
    return;
  }
  const double hdp = 32.0 * attn_dpl(HD), scores = static_cast<double>(B) * NH * attn_tile_pairs(T) * 1024;
  kernel("attention_forward", "kernel", PlanUnit::CUDA_CORE, scores * (2.0 * HD + 2.0 * hdp + 4),
         2 * q + 2 * kv + rows);
}

void PlanDevice::attention_backward(void*, void*, void*, const void*, const void*, const float*, const void*,
                                    const void*, const void*, int B, int T, int NH, int NKV, int HD, int, int,
                                    int /*window*/, const int32_t* /*doc_start: as the forward*/, DType t) {
  const char* op = "attention_backward";
  if (B == 0 || T == 0) return;
  const double q = static_cast<double>(B) * T * NH * HD * es(t), kv = static_cast<double>(B) * T * NKV * HD * es(t);
  const double rows = static_cast<double>(B) * NH * T * 4;
  kernel(op, "attn_dvec_kernel<Ty>", PlanUnit::CUDA_CORE, 2.0 * B * T * NH * HD, 2 * q + rows);
  if (t != DType::F32) {
    // dK/dV's split of each KV head's query heads, as the kernel picks it on an H100 / H200
    // (132 SMs, the plan's profiles): 1 = the whole group in one block, else fp32 partials.
    const int G = NH / NKV;
    const int split =
        ops::attention_dkdv_split(B, NKV, G, T, 132, ops::attention_dkdv_blocks_per_sm(static_cast<int>(mma_hdp(HD))));
    const double part = split > 1 ? static_cast<double>(B) * NKV * split * T * HD * 4 : 0;  // fp32 dK or dV
    const double kv_out = split > 1 ? 2 * part : 2 * kv;
    // Tile loads beyond each array once (no atomics, no fp32 dQ partials: every output has one
    // writer). dK/dV: a block loads its K, V tile once and, for each query head of its part of
    // the group, the Q, dO tiles and lse, D rows of every query tile at or after it; dQ: its Q,
    // dO tile and lse, D rows once and the K, V tiles of every key tile up to it.
    const double tile = 64.0 * HD * es(t), pairs = mma_scores(B, T, NH) / 4096;
    PlanLaunch dkdv = mma_launch(MmaKernel::DKDV, B, T, NKV * split, HD, t);
    dkdv.reread_bytes = std::max(0.0, pairs * (2 * tile + 2 * 64 * 4) - (2 * q + 2 * rows)) +
                        std::max(0.0, static_cast<double>(dkdv.blocks) * 2 * tile - 2 * kv);
    PlanLaunch dq = mma_launch(MmaKernel::DQ, B, T, NH, HD, t);
    dq.reread_bytes = std::max(0.0, pairs * 2 * tile - 2 * kv);
    kernel(op, "kernel_dkdv", PlanUnit::TENSOR_ATTN_BWD, mma_scores(B, T, NH) * 8.0 * mma_hdp(HD),
           2 * q + 2 * kv + 2 * rows + kv_out, &dkdv);
    kernel(op, "kernel_dq", PlanUnit::TENSOR_ATTN_BWD, mma_scores(B, T, NH) * 6.0 * mma_hdp(HD),
           3 * q + 2 * kv + 2 * rows, &dq);
    if (split > 1) kernel(op, "attn_dkv_reduce_kernel<Ty>", PlanUnit::CUDA_CORE, 2 * part / 4, 2 * part + 2 * kv);
    return;
  }
  const double hdp = 32.0 * attn_dpl(HD), scores = static_cast<double>(B) * NH * attn_tile_pairs(T) * 1024;
  kernel(op, "kq", PlanUnit::CUDA_CORE, scores * (4.0 * HD + 2.0 * hdp + 4), 3 * q + 2 * kv + 2 * rows);
  kernel(op, "kkv", PlanUnit::CUDA_CORE, scores * (4.0 * HD + 4.0 * hdp + 4), 2 * q + 4 * kv + 2 * rows);
}

// ----------------------------------------------------------------------------
// Embedding and loss (kernels/embedding.cu, cross_entropy.cu).
void PlanDevice::embedding_forward(void* out, const int32_t*, const void* wte, const void* wpe, int B, int T, int C,
                                   int, const int32_t*, DType t) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  const bool vec =
      static_cast<size_t>(C) % vec16(t) == 0 && aligned16(out) && aligned16(wte) && (wpe == nullptr || aligned16(wpe));
  const double nc = static_cast<double>(N) * C;
  kernel("embedding_forward", vec ? "embedding_forward_kernel<Ty, VEC>" : "embedding_forward_kernel<Ty, 1>",
         PlanUnit::CUDA_CORE, wpe ? nc : 0.0,
         N * 4.0 + 2 * nc * es(t) + (wpe ? static_cast<double>(T) * C * es(t) : 0.0));
}
// dwte: the positions sorted by token (an 8-bit LSD radix sort over the key width of V:
// keys and positions 8 bytes per position, 256 counts per 256-position chunk), then one
// block per sorted index, the run starts summing; rows of dwte are read and written once
// per distinct token, taken as once per position (tokens rarely repeat at this level).
void PlanDevice::embedding_backward(float*, float* dwpe, const void*, const int32_t*, int B, int T, int C, int V,
                                    const int32_t*, DType t) {
  const char* op = "embedding_backward";
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  const double n = N, nc = n * C, counts = 256.0 * static_cast<double>(blocks_for(static_cast<size_t>(N), 256)) * 4;
  int passes = 0;
  for (uint32_t k = static_cast<uint32_t>(V); k != 0; k >>= 8) ++passes;
  kernel(op, "sort_init_kernel", PlanUnit::CUDA_CORE, n, n * 12);
  for (int p = 0; p < passes; ++p) {
    kernel(op, "radix_count_kernel", PlanUnit::CUDA_CORE, n * 256, n * 4 + counts);
    kernel(op, "exclusive_scan_kernel", PlanUnit::CUDA_CORE, counts / 4 * 2, counts * 2);
    kernel(op, "radix_scatter_kernel", PlanUnit::CUDA_CORE, n * 128, n * 16 + counts);
  }
  const double blocks_y = static_cast<double>(blocks_for(static_cast<size_t>(C), 128));
  kernel(op, "embedding_dwte_kernel<Ty>", PlanUnit::CUDA_CORE, nc, n * 8 * blocks_y + nc * es(t) + nc * 8);
  if (dwpe)
    kernel(op, "embedding_dwpe_kernel<Ty>", PlanUnit::CUDA_CORE, nc, nc * es(t) + static_cast<double>(T) * C * 8);
}

// kernels/cross_entropy.cu's onepass_shape: with dlogits, the one-pass kernel wherever the
// row's 16-byte packs (V / elements per pack) fit 8 per thread of 1024 in registers plus
// whole 1024-pack slots of the opt-in shared memory (1 KB left to the kernel's static
// shared memory). It reads each row once and writes it once.
namespace {
bool ce_onepass(int V, DType t, size_t smem_optin) {
  const size_t npk = static_cast<size_t>(V) / vec16(t), in_regs = 8 * 1024;
  if (npk <= in_regs) return true;
  const size_t extra = (npk - in_regs + 1023) / 1024;
  return extra * 1024 * 16 + 1024 <= smem_optin;
}
}  // namespace

// One block per row. The forward alone reads each row once; the two-pass kernel's backward
// reads it twice (statistics, then gradient) and writes it.
void PlanDevice::cross_entropy(const char* op, bool losses, bool mean, bool dlogits, int N, int V, DType t) {
  if (N <= 0) {
    if (mean) memset_op(op, sizeof(float));
    return;
  }
  const double nv = static_cast<double>(N) * V;
  const double rows = N * 4.0 * ((losses || mean) ? 2 : 1);  // targets, and the losses written
  if (dlogits && ce_onepass(V, t, smem_optin_)) {
    kernel(op, "cross_entropy_onepass_kernel<T>", PlanUnit::CUDA_CORE, nv * FLOPS_CE * 2, nv * es(t) * 2 + rows);
  } else {
    kernel(op, "cross_entropy_kernel<T>", PlanUnit::CUDA_CORE, nv * FLOPS_CE * (dlogits ? 2 : 1),
           nv * es(t) * (dlogits ? 3 : 1) + rows);
  }
  if (mean) kernel(op, "loss_mean_kernel", PlanUnit::CUDA_CORE, 2.0 * N, N * 8.0);
}
void PlanDevice::cross_entropy_forward(float* losses, float* mean, const void*, const int32_t*, int N, int V, int,
                                       DType t) {
  cross_entropy("cross_entropy_forward", losses != nullptr, mean != nullptr, false, N, V, t);
}
void PlanDevice::cross_entropy_backward(void*, const void*, const int32_t*, int N, int V, int, float, const float*,
                                        DType t) {
  cross_entropy("cross_entropy_backward", false, false, true, N, V, t);
}
void PlanDevice::cross_entropy_forward_backward(float* losses, float* mean, void*, const void*, const int32_t*, int N,
                                                int V, int, float, const float*, DType t) {
  cross_entropy("cross_entropy_forward_backward", losses != nullptr, mean != nullptr, true, N, V, t);
}

// ----------------------------------------------------------------------------
// Optimizer and buffer arithmetic (kernels/adamw.cu, reduce.cu, cast.cu).
void PlanDevice::adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig&, float,
                       int64_t, bool, const float*, void* copy, DType copy_t) {
  const char* op = "adamw";
  if (!n) return;
  const bool copy16 = copy != nullptr && copy_t != DType::F32;
  bool vec = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v);
  if (copy16) vec = vec && reinterpret_cast<uintptr_t>(copy) % (4 * dtype_size(copy_t)) == 0;
  const double bytes = static_cast<double>(n) * (28.0 + (copy16 ? es(copy_t) : 0.0));  // p, g, m, v in; p, m, v out
  kernel(op, vec ? "adamw_kernel<C, V>" : "adamw_kernel<C, 1>", PlanUnit::CUDA_CORE, n * FLOPS_ADAMW, bytes);
  if (copy != nullptr && !copy16 && copy != param)
    memcpy_op(op, "cudaMemcpyAsync", PlanCopy::D2D, n * sizeof(float), 1);
}

// kernels::adamw_step_multi: the tensors without a compute copy, then those with one, in
// tables of ADAMW_MULTI_MAX (kernels/adamw.cuh), one launch per table; an fp32 copy is a
// device copy after the update, as adamw's.
void PlanDevice::adamw_multi(const AdamWTensor* tensors, size_t count, const AdamWConfig&, float, int64_t, const float*,
                             DType copy_t) {
  const char* op = "adamw";
  constexpr size_t MULTI_MAX = 36;  // kernels/adamw.cuh's ADAMW_MULTI_MAX
  const bool copy16 = copy_t != DType::F32;
  for (int with_copy = 0; with_copy < (copy16 ? 2 : 1); ++with_copy) {
    size_t in_table = 0;
    double elems = 0, bytes = 0;
    auto flush = [&] {
      if (in_table == 0) return;
      kernel(op, "adamw_multi_kernel<C>", PlanUnit::CUDA_CORE, elems * FLOPS_ADAMW, bytes);
      in_table = 0;
      elems = bytes = 0;
    };
    for (size_t k = 0; k < count; ++k) {
      const AdamWTensor& x = tensors[k];
      if (x.n == 0 || (copy16 && (x.copy != nullptr) != (with_copy == 1))) continue;
      if (in_table == MULTI_MAX) flush();
      ++in_table;
      elems += static_cast<double>(x.n);
      bytes += static_cast<double>(x.n) * (28.0 + (with_copy ? es(copy_t) : 0.0));  // p, g, m, v in; p, m, v out
    }
    flush();
  }
  if (!copy16)
    for (size_t k = 0; k < count; ++k)
      if (tensors[k].copy != nullptr && tensors[k].n && tensors[k].copy != tensors[k].param)
        memcpy_op(op, "cudaMemcpyAsync", PlanCopy::D2D, tensors[k].n * sizeof(float), 1);
}

void PlanDevice::norm_sq_accumulate(double*, const float* g, size_t n) {
  const char* op = "norm_sq_accumulate";
  if (!n) return;
  const bool vec = aligned16(g);
  const size_t blocks = grid_for(vec ? n / 4 + 1 : n, 256 * 4, 1024);
  kernel(op, vec ? "sumsq_partial_kernel<T, V>" : "sumsq_partial_kernel<T, 1>", PlanUnit::CUDA_CORE, 2.0 * n,
         n * 4.0 + blocks * 8.0);
  kernel(op, "sumsq_final_kernel", PlanUnit::CUDA_CORE, static_cast<double>(blocks), blocks * 8.0 + 16);
}

// kernels::grad_norm_sq_multi: the non-empty buffers in tables of 96 (kernels/reduce.cu's
// SUMSQ_MULTI_MAX), each buffer with grad_norm_sq's blocks; a partial and a final launch per
// table.
void PlanDevice::norm_sq_accumulate_multi(double*, const float* const* g, const size_t* n, size_t count) {
  const char* op = "norm_sq_accumulate";
  constexpr size_t MULTI_MAX = 96;
  size_t in_table = 0;
  double elems = 0, blocks = 0;
  auto flush = [&] {
    if (in_table == 0) return;
    kernel(op, "sumsq_multi_partial_kernel", PlanUnit::CUDA_CORE, 2.0 * elems, elems * 4.0 + blocks * 8.0);
    kernel(op, "sumsq_multi_final_kernel", PlanUnit::CUDA_CORE, blocks, blocks * 8.0 + 16);
    in_table = 0;
    elems = blocks = 0;
  };
  for (size_t k = 0; k < count; ++k) {
    if (n[k] == 0) continue;
    if (in_table == MULTI_MAX) flush();
    ++in_table;
    elems += static_cast<double>(n[k]);
    blocks += static_cast<double>(grid_for(aligned16(g[k]) ? n[k] / 4 + 1 : n[k], 256 * 4, 1024));
  }
  flush();
}

// One thread each: the step's agreement values (ops/step_scale.h).
void PlanDevice::norm_sq_pack(float*, const double*) {
  kernel("norm_sq_pack", "norm_sq_pack_kernel", PlanUnit::CUDA_CORE, 4.0, 8.0 + 12.0);
}
void PlanDevice::step_scale(float*, double*, const float* red, float, float) {
  kernel("step_scale", "step_scale_kernel", PlanUnit::CUDA_CORE, 8.0, (red ? 12.0 : 8.0) + 8.0 + 8.0);
}
void PlanDevice::loss_sum(double*, float*, const float*, const float*, int n) {
  kernel("loss_sum", "loss_sum_kernel", PlanUnit::CUDA_CORE, 2.0 * n, 8.0 * n + 12.0);
}

void PlanDevice::add(float*, const float*, size_t n) {
  if (n) kernel("add", "add_kernel", PlanUnit::CUDA_CORE, static_cast<double>(n), n * 12.0);
}

void PlanDevice::scale(float*, size_t n, float) {
  if (n) kernel("scale", "scale_kernel", PlanUnit::CUDA_CORE, static_cast<double>(n), n * 8.0);
}

// kernels/compress.cu: the init, four histogram passes (each with its one-thread pick), the
// tile counts, the one-thread scan and the ordered write.
void PlanDevice::topk_select(float*, size_t n, size_t k, float*, int32_t*) {
  if (k == 0) return;
  const double tiles = std::ceil(static_cast<double>(n) / 4096.0);
  kernel("topk_select", "select_init_kernel", PlanUnit::CUDA_CORE, 0.0, 4.0 * 1024 + 12.0);
  for (int pass = 0; pass < 4; ++pass) {
    kernel("topk_select", "select_hist_kernel", PlanUnit::CUDA_CORE, 2.0 * n, 4.0 * n + 4.0 * 256);
    kernel("topk_select", "select_pick_kernel", PlanUnit::CUDA_CORE, 256.0, 4.0 * 256 + 24.0);
  }
  kernel("topk_select", "select_count_kernel", PlanUnit::CUDA_CORE, 2.0 * n, 4.0 * n + 8.0 * tiles);
  kernel("topk_select", "select_scan_kernel", PlanUnit::CUDA_CORE, 4.0 * tiles, 16.0 * tiles);
  kernel("topk_select", "select_write_kernel", PlanUnit::CUDA_CORE, 2.0 * n, 4.0 * n + 12.0 * static_cast<double>(k));
}
void PlanDevice::sparse_add(float*, const float*, const int32_t*, size_t count) {
  if (count) kernel("sparse_add", "sparse_add_kernel", PlanUnit::CUDA_CORE, static_cast<double>(count), 16.0 * count);
}

// One block (a PowerSGD factor is rank x dimension): charged at the device's rate, which
// a single block does not reach; the factors are small beside the gradient.
void PlanDevice::orthogonalize(float*, size_t rows, size_t cols) {
  if (rows == 0 || cols == 0) return;
  const double rc = static_cast<double>(rows) * static_cast<double>(cols);
  kernel("orthogonalize", "orthogonalize_kernel", PlanUnit::CUDA_CORE, 2.0 * rc * static_cast<double>(cols),
         4.0 * rc * static_cast<double>(cols + 2));
}

void PlanDevice::cast(void* dst, DType dt, const void* src, DType st, size_t n) {
  if (n == 0) return;
  if (dt == st) {
    if (dst != src) memcpy_op("cast", "cudaMemcpyAsync", PlanCopy::D2D, n * dtype_size(st), 1);
    return;
  }
  const size_t V = (dtype_size(st) == 4 || dtype_size(dt) == 4) ? 4 : 8;
  const bool vec = reinterpret_cast<uintptr_t>(dst) % (V * dtype_size(dt)) == 0 &&
                   reinterpret_cast<uintptr_t>(src) % (V * dtype_size(st)) == 0;
  kernel("cast", vec ? "cast_kernel<In, Out, V>" : "cast_kernel<In, Out, 1>", PlanUnit::CUDA_CORE,
         static_cast<double>(n), n * (es(st) + es(dt)));
}

void PlanDevice::round_to(float*, size_t n, DType t) {
  if (n == 0 || t == DType::F32) return;
  kernel("round_to", "round_kernel<T>", PlanUnit::CUDA_CORE, static_cast<double>(n), n * 8.0);
}

}  // namespace dtrain::device
