// INTERNAL to kernels/gemm*.cu: the algorithm of a new GEMM plan. A valid choice
// remembered in the cache file for this card (cublasLtMatmulAlgoCheck), else the fastest
// of cuBLASLt's heuristic candidates timed on the call's own operands into scratch
// outputs, else (timing off, too small, over budget, stream capture) the first candidate.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::kernels::detail {

// One GEMM call as cuBLASLt sees it, with the plan's descriptors (their bias and aux
// pointers set to the call's). The choice may run it several times, never writing the
// caller's D, aux or bias output.
struct AlgoCall {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;  // C and D share lc
  uint32_t align_a = 256, align_b = 256, align_c = 256;             // the heuristic's promise
  const void* a = nullptr;                                          // cuBLASLt's A and B
  const void* b = nullptr;
  const void* c = nullptr;  // read when beta != 0
  float alpha = 1, beta = 0;
  const void* bias = nullptr;  // the descriptor's pointers (restored after timing)
  const void* aux = nullptr;
  size_t d_bytes = 0;         // D's extent
  size_t aux_out_bytes = 0;   // > 0 when the epilogue writes aux (GELU_AUX*)
  size_t bias_out_bytes = 0;  // > 0 when the epilogue writes the bias vector (BGRADB)
  double flops = 0;           // 2 m n k
  std::string key;            // the problem, as the cache file names it (no spaces)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

enum class AlgoSource { NONE, HEURISTIC, TIMED, FILE };

/// Chooses call's algorithm into *algo; NONE when cuBLASLt has none for it. use_file =
/// false skips the cache file (its entry passed the check but the call refused it).
/// Throws DeviceError only for cuBLASLt failures outside the choice (a bad descriptor).
AlgoSource gemm_algo_choose(const AlgoCall& call, bool use_file, cublasLtMatmulAlgo_t* algo);

/// Drops the file entries read and the counters and timing budget (gemm_plans_reset).
void gemm_algo_forget();

}  // namespace dtrain::kernels::detail
