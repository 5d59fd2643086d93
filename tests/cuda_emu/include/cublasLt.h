// CUDA execution engine (test-only): the subset of cuBLASLt dtrain uses, with NVIDIA's
// names and numeric values. cublasLtMatmul runs on the CPU, in stream order, with fp32
// accumulation; combinations outside the subset are reported as NOT_SUPPORTED, so the
// caller's fallback paths run as they would on a GPU without a matching kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// ----------------------------------------------------------------------------
// Shared CUDA library types (library_types.h / cublas_api.h in the toolkit).
#ifndef CUDA_EMU_LIBRARY_TYPES_DEFINED
#define CUDA_EMU_LIBRARY_TYPES_DEFINED
enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_C_16F = 6,
  CUDA_R_16BF = 14,
  CUDA_C_16BF = 15,
  CUDA_R_32F = 0,
  CUDA_C_32F = 4,
  CUDA_R_64F = 1,
  CUDA_C_64F = 5,
  CUDA_R_8I = 3,
  CUDA_C_8I = 7,
  CUDA_R_8U = 8,
  CUDA_C_8U = 9,
  CUDA_R_32I = 10,
  CUDA_C_32I = 11,
  CUDA_R_32U = 12,
  CUDA_C_32U = 13,
  CUDA_R_8F_E4M3 = 28,
  CUDA_R_8F_E5M2 = 29,
};
using cudaDataType = cudaDataType_t;
#endif

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};

enum cublasOperation_t {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
};

enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73,
};

// ----------------------------------------------------------------------------
// Opaque objects.
struct cublasLtContext;
struct cublasLtMatmulDescOpaque_t;
struct cublasLtMatrixLayoutOpaque_t;
struct cublasLtMatmulPreferenceOpaque_t;
using cublasLtHandle_t = cublasLtContext*;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

/// An algorithm chosen by cublasLtMatmulAlgoGetHeuristic; trivially copyable (NVIDIA: it
/// "can be trivially serialized and later restored for use with the same version of
/// cuBLAS library").
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};

struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

// ----------------------------------------------------------------------------
// Attributes. Each comment names the value type SetAttribute expects (its size is checked).
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,                // int32_t (cublasComputeType_t)
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,                  // int32_t (cudaDataType_t)
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,                // int32_t (cublasLtPointerMode_t)
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                      // int32_t (cublasOperation_t)
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                      // int32_t
  CUBLASLT_MATMUL_DESC_TRANSC = 5,                      // int32_t, only CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,                    // uint32_t (cublasLtEpilogue_t)
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,                // void*
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,          // int64_t
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,       // void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,            // int64_t
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13,  // int64_t
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,     // int32_t (cudaDataType_t), default -1
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,             // int32_t (cudaDataType_t), default -1
};

enum cublasLtMatrixLayoutAttribute_t {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                  // uint32_t (cudaDataType_t)
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                 // int32_t (cublasLtOrder_t)
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_LD = 4,                    // int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,           // int32_t
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,  // int64_t
};

enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t, default 0
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,  // uint32_t, default 256
};

enum cublasLtOrder_t {
  CUBLASLT_ORDER_COL = 0,
  CUBLASLT_ORDER_ROW = 1,
};

enum cublasLtPointerMode_t {
  CUBLASLT_POINTER_MODE_HOST = 0,
  CUBLASLT_POINTER_MODE_DEVICE = 1,
  CUBLASLT_POINTER_MODE_DEVICE_VECTOR = 2,
  CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO = 3,
  CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST = 4,
};

enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_RELU_AUX = 130,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = 6,
  CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134,
  CUBLASLT_EPILOGUE_DRELU = 136,
  CUBLASLT_EPILOGUE_DRELU_BGRAD = 152,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = 160,
  CUBLASLT_EPILOGUE_GELU_BIAS = 36,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
  CUBLASLT_EPILOGUE_DGELU = 192,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
};

// ----------------------------------------------------------------------------
// Functions.
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);
size_t cublasLtGetVersion();

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size);
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t size, size_t* size_written);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size);
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* size_written);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size);

/// Up to requested_count distinct algorithms for the descriptors (the engine has four per
/// problem, each bound to the problem's shape, transposes, types and epilogue; all compute
/// the same result), *returned_count of them written. Returns NOT_SUPPORTED with
/// *returned_count = 0 when no algorithm implements the descriptors (dtype combination,
/// epilogue restriction, ...).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                              cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                              cublasLtMatmulPreference_t pref, int requested_count,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned_count);

/// Whether algo can run the problem the descriptors describe: INVALID_VALUE when it was
/// not made for them (another shape, types or epilogue; damaged bytes), NOT_SUPPORTED when
/// no algorithm implements the descriptors; on success *result holds the algo and its
/// workspace size.
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                       cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                       const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result);

/// D = epilogue(alpha * op(A) op(B) + beta * C), enqueued on `stream`. Argument errors
/// are returned here (nothing is enqueued); algo may be null (implicit heuristic query).
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a_desc, const void* B, cublasLtMatrixLayout_t b_desc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream);
