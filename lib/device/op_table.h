// The device layer's op table: every model op, with one signature for the CPU (lib/ops
// over OpenBLAS, fp32) and CUDA (kernels/ and cuBLASLt on the device's compute stream,
// fp32/bf16/fp16 activations). Adding an op: its entry here, its CPU body
// (cpu_device.cpp over lib/ops), its CUDA body (cuda_device.cpp over a kernels/ launcher),
// its cost on the plan device (cuda_costs.cpp) and its row in the engine conformance
// tables (tests/kernels/conformance_*.cpp). Parameter types beyond pointers, sizes and
// dtypes are op_types.h's.
#pragma once

#include "core/dtype.h"
#include "device/op_types.h"

#include <cstddef>
#include <cstdint>

namespace dtrain::device {

/// Every op runs in order on the device's current stream (on the CPU: now, on the
/// calling thread). Activation arguments are `t` (CPU: F32 only, UsageError otherwise);
/// parameter gradients and norm statistics are always fp32. Ops named *_backward
/// ACCUMULATE (+=) into their gradient outputs unless the op says it writes, as in
/// lib/ops. A null gradient output skips that part.
class LayerOps {
 public:
  virtual ~LayerOps() = default;

  // ---- GEMM and linear layers (W stored [OC, IC] as torch.nn.Linear)
  /// Row-major C[M,N] = alpha op(A) op(B) + beta C; A, B of ab_t, C of c_t (= ab_t, or F32).
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, const void* B,
                    float beta, void* C, DType ab_t, DType c_t) = 0;
  /// gemm() with row pitches: A's rows lda elements apart, B's ldb, C's ldc (each at least
  /// its row width; a fused projection's column block passes the fused row width).
  virtual void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
                       const void* B, int ldb, float beta, void* C, int ldc, DType ab_t, DType c_t) = 0;
  /// out = inp W^T + bias (bias may be null); out's rows are ld_out >= OC apart (the
  /// model's logits rows are padded, see Model), the columns past OC untouched.
  virtual void linear_forward(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC,
                              int ld_out, DType t) = 0;
  /// pre = inp W^T + bias; out = gelu(pre) (one fused epilogue on CUDA).
  virtual void linear_gelu_forward(void* out, void* pre, const void* inp, const void* w, const void* bias, int N,
                                   int IC, int OC, DType t) = 0;
  /// dinp (+)= dout W (+= when accumulate_dinp; else written, a GEMM with beta = 0 that
  /// never reads dinp); dweight += dout^T inp; dbias += colsum(dout) (fp32 gradients).
  /// dout's rows are ld_dout >= OC apart; only OC columns are read.
  virtual void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                               const void* w, int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType t) = 0;
  /// The backward of a linear layer whose input is inp = gelu(pre) (pre [N, IC], the
  /// pre-activation linear_gelu_forward kept): WRITES dpre = gelu'(pre) * (dout W);
  /// dweight += dout^T inp; dbias += colsum(dout). On CUDA the GELU derivative is the
  /// d(inp) GEMM's epilogue, so d(inp) is never stored.
  virtual void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp,
                                     const void* w, const void* pre, int N, int IC, int OC, DType t) = 0;

  // ---- Norms (statistics fp32 [N]); residual_* also write residual = a + b first
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* bias,
                                 int N, int C, float eps, DType t) = 0;
  virtual void residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a,
                                          const void* b, const void* w, const void* bias, int N, int C, float eps,
                                          DType t) = 0;
  virtual void layernorm_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                                  const float* mean, const float* rstd, int N, int C, DType t) = 0;
  virtual void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                               DType t) = 0;
  virtual void residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b,
                                        const void* w, int N, int C, float eps, DType t) = 0;
  virtual void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w,
                                const float* rstd, int N, int C, DType t) = 0;

  // ---- Pointwise
  virtual void gelu_forward(void* out, const void* inp, size_t n, DType t) = 0;
  /// WRITES dinp = gelu'(inp) * dout (dinp may alias dout).
  virtual void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType t) = 0;
  /// out [rows, cols] dense = silu(gate) * up; gate's and up's rows are ld >= cols elements
  /// apart (the fused gate/up projection's [rows, 2 cols] output: ld = 2 cols).
  virtual void swiglu_forward(void* out, const void* gate, const void* up, size_t rows, size_t cols, size_t ld,
                              DType t) = 0;
  /// WRITES dgate and dup (ops::swiglu_backward), rows ld apart like gate and up; dout dense.
  virtual void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, size_t rows,
                               size_t cols, size_t ld, DType t) = 0;
  /// Inverted dropout: out = keep ? inp / (1 - p) : 0 with keep[i] = dropout_keep(seed, i, p)
  /// (core/rng.h: the same mask on every device).
  virtual void dropout_forward(void* out, const void* inp, size_t n, float p, uint64_t seed, DType t) = 0;
  /// dinp += keep ? dout / (1 - p) : 0, the mask of dropout_forward(seed).
  virtual void dropout_backward(void* dinp, const void* dout, size_t n, float p, uint64_t seed, DType t) = 0;

  // ---- Position and attention
  // doc_start (int32 device array [B*T], or nullptr): packed documents without cross-talk
  // (ops/attention.h's layout): positions restart at each document (RoPE, learned
  // positions) and a query sees only keys of its own document.
  /// Rotates q and k in place with the frequencies of `rope` (ops::rope_inv_freq). q's token
  /// rows are q_stride elements apart, k's kv_stride (as attention_forward's).
  virtual void rope_forward(void* q, void* k, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                            const RopeFreq& rope, const int32_t* doc_start, DType t) = 0;
  /// The inverse rotation, in place.
  virtual void rope_backward(void* dq, void* dk, int B, int T, int NH, int NKV, int HD, int q_stride, int kv_stride,
                             const RopeFreq& rope, const int32_t* doc_start, DType t) = 0;
  /// fp32 elements attention_forward saves for backward: the CPU's probabilities
  /// [B,NH,T,T], CUDA's log-sum-exp [B,NH,T].
  virtual size_t attention_saved_floats(int B, int T, int NH) const = 0;
  /// Causal attention, out [B,T,NH,HD] dense. q's token rows are q_stride elements apart, k's
  /// and v's kv_stride (NH*HD and NKV*HD when dense; GPT-2 passes the column blocks of its
  /// fused [N, (NH+2NKV) HD] qkv rows, both strides (NH+2NKV) HD). window > 0 is a sliding
  /// window (Mistral): query i sees keys i - window < j <= i only; 0 is plain causal.
  virtual void attention_forward(void* out, float* saved, const void* q, const void* k, const void* v, int B, int T,
                                 int NH, int NKV, int HD, int q_stride, int kv_stride, int window,
                                 const int32_t* doc_start, DType t) = 0;
  /// WRITES dq (q_stride apart), dk, dv (kv_stride apart); dout dense like out.
  virtual void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* saved,
                                  const void* q, const void* k, const void* v, int B, int T, int NH, int NKV, int HD,
                                  int q_stride, int kv_stride, int window, const int32_t* doc_start, DType t) = 0;

  // ---- Embedding and loss (tokens, targets: int32 device arrays)
  /// out = wte[tokens] (+ wpe[position], doc_start as above). Tokens are validated by the caller.
  virtual void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                                 int C, int V, const int32_t* doc_start, DType t) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                                  int C, int V, const int32_t* doc_start, DType t) = 0;
  /// losses fp32 [N] (0 where masked); *mean (one fp32 device value) = their mean over
  /// the unmasked rows (0 when all are masked). logits' rows are ld >= V apart; the
  /// columns past V are never read.
  virtual void cross_entropy_forward(float* losses, float* mean, const void* logits, const int32_t* targets, int N,
                                     int V, int ld, DType t) = 0;
  /// WRITES dlogits (may alias logits; rows ld apart, V columns) = (softmax - onehot) *
  /// ops::ce_backward_scale(factor, *count), 0 where masked. count is one fp32 device
  /// value (the unmasked targets the loss averages over), read by the op on the device:
  /// a recorded step does not bake it in.
  virtual void cross_entropy_backward(void* dlogits, const void* logits, const int32_t* targets, int N, int V, int ld,
                                      float factor, const float* count, DType t) = 0;
  /// cross_entropy_forward then cross_entropy_backward with the same arguments, the
  /// same results; CUDA does both in one kernel (the logits read once where a row fits on
  /// chip, else twice, instead of three times). dlogits may alias logits.
  virtual void cross_entropy_forward_backward(float* losses, float* mean, void* dlogits, const void* logits,
                                              const int32_t* targets, int N, int V, int ld, float factor,
                                              const float* count, DType t) = 0;
};

/// The optimizer step's arithmetic and the gradient buffers' (fp32 whatever the
/// activation dtype), in order on the current stream like the layer ops.
class StepOps {
 public:
  virtual ~StepOps() = default;

  // ---- Optimizer and buffer arithmetic (fp32 masters, gradients and moments)
  /// ops::adamw_step on n elements with the gradient scale scale[0], unless scale[1] != 0
  /// (the step is skipped: nothing is written). `scale` is this device's memory: [0..1] as
  /// step_scale writes them, [2..4] ops::adamw_step_values(lr, step) (CUDA reads them
  /// there, the CPU computes the same from lr and step), so clipping, the overflow skip and
  /// the scheduled lr need no host value inside the step (a CUDA graph replays it). With
  /// copy != nullptr the updated parameters are also written, rounded to nearest even, as
  /// copy_t (F32, BF16 or F16) into copy.
  virtual void adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWConfig& cfg, float lr,
                     int64_t step, bool decay, const float* scale, void* copy, DType copy_t) = 0;
  /// adamw on each of count tensors (each with its own decay flag and copy, copies of
  /// copy_t), results bit for bit those of one adamw per tensor; CUDA updates them in few
  /// launches (kernels::adamw_step_multi) instead of one per tensor.
  virtual void adamw_multi(const AdamWTensor* tensors, size_t count, const AdamWConfig& cfg, float lr, int64_t step,
                           const float* scale, DType copy_t) = 0;
  /// *acc += sum of g[i]^2 in double (acc: one double in this device's memory); inf/NaN
  /// gradients make it inf/NaN. The partition is fixed by n, so the result is deterministic.
  virtual void norm_sq_accumulate(double* acc, const float* g, size_t n) = 0;
  /// norm_sq_accumulate of count buffers (g[k], n[k] elements) in that order, the same
  /// double bit for bit; CUDA sums them in two launches (kernels::grad_norm_sq_multi)
  /// instead of two per buffer.
  virtual void norm_sq_accumulate_multi(double* acc, const float* const* g, const size_t* n, size_t count) = 0;
  /// red[0..2] = ops::norm_sq_pack(*sq): the sum of squares as an fp32 pair plus an
  /// overflow flag, for an fp32 SUM across ranks (all in this device's memory).
  virtual void norm_sq_pack(float* red, const double* sq) = 0;
  /// With total = red ? ops::norm_sq_unpack(red) : *sq: *sq = total, scale[0..1] =
  /// ops::step_scale(total, loss_scale, max_norm) (AdamW's gradient scale, skip flag).
  virtual void step_scale(float* scale, double* sq, const float* red, float loss_scale, float max_norm) = 0;
  /// *sum = ops::step_loss_sum(means, counts, n) (n micro-batches' mean losses and
  /// unmasked-target counts, fp32 device values) and *sum_f32 = (float)*sum.
  virtual void loss_sum(double* sum, float* sum_f32, const float* means, const float* counts, int n) = 0;
  /// dst[i] += src[i].
  virtual void add(float* dst, const float* src, size_t n) = 0;
  /// p[i] *= s (fp32; the 16-bit gradient wire's division by the world size).
  virtual void scale(float* p, size_t n, float s) = 0;
  /// Top-k with error feedback, ops::topk_select: the k largest |residual| (values and
  /// ascending int32 indices) out, zeroed in residual; the same set on every device.
  virtual void topk_select(float* residual, size_t n, size_t k, float* values, int32_t* indices) = 0;
  /// dense[indices[i]] += values[i], ops::sparse_add (indices distinct, as one top-k's).
  virtual void sparse_add(float* dense, const float* values, const int32_t* indices, size_t count) = 0;
  /// PowerSGD's Gram-Schmidt on the columns of a (rows x cols fp32, row-major), in place,
  /// ops::orthogonalize_columns (sums in double; the CUDA order differs from the CPU's).
  virtual void orthogonalize(float* a, size_t rows, size_t cols) = 0;
  /// dst = src converted from st to dt (round to nearest even); in place only when the
  /// dtypes are equal.
  virtual void cast(void* dst, DType dt, const void* src, DType st, size_t n) = 0;
  /// p[i] = p[i] rounded to t's precision (BF16 or F16, nearest even; F16 overflows to
  /// inf as fp16 storage would), kept as fp32. F32: nothing.
  virtual void round_to(float* p, size_t n, DType t) = 0;
};

/// Every op a device has (Device copies neither half: its Runtime is not copyable).
class OpTable : public LayerOps, public StepOps {};

}  // namespace dtrain::device
