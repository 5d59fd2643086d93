// GEMMs and linear layers through cuBLASLt (fp32 compute, CUBLAS_COMPUTE_32F: no TF32),
// row-major like lib/ops/linear.h with the weight stored [OC, IC] as nn.Linear. Epilogues:
// bias, bias + GELU (tanh) storing the pre-activation for backward, and the GELU
// derivative applied to the input-gradient GEMM (DGELU) reading it back; the weight
// gradient GEMM produces the bias gradient through CUBLASLT_EPILOGUE_BGRADB. One cuBLASLt
// handle and one 32 MiB workspace per device; descriptors, layouts and the algorithm
// (timed among the heuristic's candidates on the first call, or remembered in a cache
// file) are cached per (shape, dtypes, epilogue, pointer alignment). GEMMs on one
// device share its workspace: issue them from one stream at a time.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::kernels {

/// The cuBLASLt workspace each device holds (one per device, shared by its GEMMs).
inline constexpr size_t GEMM_WORKSPACE_BYTES = 32u << 20;

/// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when trans_x (as
/// ops::gemm). A is [M,K] ([K,M] when trans_a), B is [K,N] ([N,K] when trans_b), both of
/// ab_dtype; C is c_dtype: equal to ab_dtype, or F32 with bf16/fp16 inputs. Throws
/// DeviceError when cuBLASLt has no algorithm for the combination.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, const void* B, float beta,
          void* C, DType ab_dtype, DType c_dtype, cudaStream_t stream);

/// gemm() with row pitches (elements): A's rows lda apart, B's ldb, C's ldc, each at least
/// its row width (a column block of a wider array: a fused projection's output).
void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
             int ldb, float beta, void* C, int ldc, DType ab_dtype, DType c_dtype, cudaStream_t stream);

/// out[N,OC] = inp[N,IC] @ weight^T + bias (bias may be null); all of `dtype`. Overwrites
/// out's N x OC elements, rows ld_out >= OC apart (a padded vocabulary: the logits GEMM's
/// leading dimension a multiple of 128 keeps every row 16-byte aligned); the columns past
/// OC are neither read nor written.
void linear_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC, int ld_out,
                    DType dtype, cudaStream_t stream);

/// pre_gelu = inp @ weight^T + bias; out = gelu(pre_gelu) (tanh approximation), one GEMM
/// (CUBLASLT_EPILOGUE_GELU_AUX_BIAS). bias may be null. OC must be a multiple of 8 (a
/// cuBLASLt rule for the auxiliary output), else UsageError. Backward through the next
/// layer: linear_dgelu_backward.
void linear_gelu_forward(void* out, void* pre_gelu, const void* inp, const void* weight, const void* bias, int N,
                         int IC, int OC, DType dtype, cudaStream_t stream);

/// dinp (+)= dout @ weight (`dtype`; += when accumulate_dinp, else written by the GEMM
/// with beta = 0: never read, no zeroing needed); dweight += dout^T @ inp and dbias +=
/// sum_rows(dout) (both fp32: parameter gradients stay fp32). dout's rows are ld_dout >=
/// OC apart (only OC columns read). Any output may be null to skip it. The bias gradient
/// comes from the dW GEMM's BGRADB epilogue (into an OC-float scratch added to dbias)
/// when cuBLASLt offers one for the shape, else from a deterministic column-sum kernel.
void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight,
                     int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType dtype, cudaStream_t stream);

/// The backward of a linear layer whose input was inp = gelu(pre_gelu) (pre_gelu [N, IC]
/// as linear_gelu_forward stored it): WRITES dpre = gelu'(pre_gelu) * (dout @ weight) in
/// one GEMM (CUBLASLT_EPILOGUE_DGELU: d(inp) is never stored), and dweight += dout^T @ inp,
/// dbias += sum_rows(dout) as linear_backward. IC must be a multiple of 8 (the GELU
/// input's leading dimension rule), else UsageError.
void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp,
                           const void* weight, const void* pre_gelu, int N, int IC, int OC, DType dtype,
                           cudaStream_t stream);

// ----------------------------------------------------------------------------
// The algorithm of each GEMM problem. On a problem's first call cuBLASLt's heuristic is
// asked for up to GemmTuning::candidates algorithms; when it offers several, each is
// timed on the call's own operands into scratch outputs (one warm-up, then `repeats`
// runs between events on the call's stream; the caller's C, aux and bias outputs see
// exactly one run) and the fastest is kept with the problem's plan. No timing while the
// stream is being captured into a CUDA graph (candidate 0 then), for problems under
// min_flops, or once a device's timing passed budget_ms. A cache file, when set,
// remembers the timed choices per card and problem; each entry is checked with
// cublasLtMatmulAlgoCheck before use, and a missing, foreign, damaged or refused entry
// only sends its problem back to timing.

/// The cache file of timed choices: "" = in memory only. Until this is called the path
/// is $DTRAIN_GEMM_ALGO_CACHE (unset: in memory only). The file is read on the first new
/// problem after this call and rewritten (temporary file + rename) after each timing;
/// an existing file without the cache's header line is never replaced.
void gemm_algo_cache_set(const std::string& path);
/// The path to use when $DTRAIN_GEMM_ALGO_CACHE is unset and gemm_algo_cache_set was not
/// called (a rank passes <run dir>/gemm_algos.txt); call it before the first GEMM.
void gemm_algo_cache_default(const std::string& path);

/// How the algorithm of a new GEMM problem is chosen.
struct GemmTuning {
  int candidates = 8;       ///< heuristic candidates asked for (1..16); 1 = cuBLASLt's first, untimed
  int repeats = 3;          ///< timed runs per candidate after one warm-up run; 0 = no timing
  double min_flops = 1e9;   ///< 2*M*N*K below which the first candidate is taken (launch-bound)
  double budget_ms = 3000;  ///< GPU time per device and process spent timing, then candidate 0
};
void gemm_tuning_set(const GemmTuning& tuning);
GemmTuning gemm_tuning();

/// What the algorithm choice did since the process started (or gemm_plans_reset).
struct GemmAlgoStats {
  uint64_t timed = 0;            ///< problems whose algorithm was chosen by timing
  uint64_t loaded = 0;           ///< problems whose algorithm came from the cache file
  uint64_t rejected = 0;         ///< cache-file entries cuBLASLt refused for their problem (re-chosen)
  uint64_t untimed_capture = 0;  ///< problems first seen on a stream being captured (candidate 0)
  uint64_t file_writes = 0;      ///< rewrites of the cache file
  int last_candidate = -1;       ///< heuristic index chosen for the last new problem; -1: from the file
};
GemmAlgoStats gemm_algo_stats();

/// Forgets every device's plans, the cache file's entries read, the counters and the
/// timing budget, as a new process would start. Call with no GEMM in flight on the host.
void gemm_plans_reset();

}  // namespace dtrain::kernels
