// DT_CUDA_CHECK / DT_CUBLAS_CHECK / DT_NCCL_CHECK and the post-launch check, built on
// the one DT_STATUS_CHECK macro. Include only from CUDA-enabled translation units.
#pragma once

#include "core/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace dtrain::detail {
inline bool cuda_ok(cudaError_t s) { return s == cudaSuccess; }
inline std::string cuda_describe(cudaError_t s) {
  return std::string(cudaGetErrorName(s)) + " (" + cudaGetErrorString(s) + ")";
}
inline bool cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline std::string cublas_describe(cublasStatus_t s) { return "cuBLAS status " + std::to_string(static_cast<int>(s)); }
inline bool nccl_ok(ncclResult_t s) { return s == ncclSuccess || s == ncclInProgress; }
inline std::string nccl_describe(ncclResult_t s) { return ncclGetErrorString(s); }
}  // namespace dtrain::detail

#define DT_CUDA_CHECK(expr) \
  DT_STATUS_CHECK(expr, ::dtrain::detail::cuda_ok, ::dtrain::detail::cuda_describe, ::dtrain::Exit::DEVICE)
#define DT_CUBLAS_CHECK(expr) \
  DT_STATUS_CHECK(expr, ::dtrain::detail::cublas_ok, ::dtrain::detail::cublas_describe, ::dtrain::Exit::DEVICE)
#define DT_NCCL_CHECK(expr) \
  DT_STATUS_CHECK(expr, ::dtrain::detail::nccl_ok, ::dtrain::detail::nccl_describe, ::dtrain::Exit::COMM)
// After every kernel launch.
#define DT_CUDA_LAUNCH_CHECK() DT_CUDA_CHECK(cudaGetLastError())
