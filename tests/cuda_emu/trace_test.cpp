// The engine's trace (cuda_emu_trace.h): what it records of launches, memsets, memcpys,
// cuBLASLt matmuls and NCCL collectives, from several host threads at once; nothing
// before trace_begin, after trace_take, or of a call the engine rejects.
#include <cublasLt.h>
#include <cuda_emu_trace.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#define LAUNCH(grid, block, smem, stream, ...) \
  ::cuda_emu::launch(#__VA_ARGS__, __FILE__, __LINE__, grid, block, smem, stream, __VA_ARGS__)

namespace {

__global__ void fill_kernel(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

}  // namespace

TEST_CASE("trace: launches, memsets and memcpys from several threads; nothing outside begin/take") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 64 * sizeof(float)) == cudaSuccess);
  LAUNCH(1, 64, 0, nullptr, fill_kernel)(d, 64, 1.0f);  // before trace_begin: not recorded
  cuda_emu::trace_begin();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([d] {
      for (int i = 0; i < 25; ++i) LAUNCH(dim3(2, 1, 1), dim3(32, 1, 1), 16, nullptr, fill_kernel)(d, 64, 2.0f);
    });
  for (auto& t : threads) t.join();
  LAUNCH(1, 2048, 0, nullptr, fill_kernel)(d, 64, 3.0f);  // rejected: 2048 threads per block
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  REQUIRE(cudaMemsetAsync(d, 0, 64 * sizeof(float), nullptr) == cudaSuccess);
  std::vector<float> host(64, 1.0f);
  REQUIRE(cudaMemcpy(d, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy2DAsync(d, 32, d + 32, 32, 16, 3, cudaMemcpyDeviceToDevice, nullptr) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d, 0, 0, nullptr) == cudaSuccess);  // a no-op: not recorded
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const cuda_emu::Trace tr = cuda_emu::trace_take();
  LAUNCH(1, 64, 0, nullptr, fill_kernel)(d, 64, 4.0f);  // after trace_take: not recorded
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cuda_emu::trace_take().kernels.empty());

  REQUIRE(tr.kernels.size() == 100);
  for (const auto& k : tr.kernels) {
    CHECK(k.name == "fill_kernel");
    CHECK(k.grid.x == 2);
    CHECK(k.block.x == 32);
    CHECK(k.dynamic_smem == 16);
    CHECK(k.device == 0);
  }
  REQUIRE(tr.memops.size() == 3);
  CHECK(tr.memops[0].kind == -1);
  CHECK(tr.memops[0].bytes() == 256);
  CHECK(tr.memops[1].kind == cudaMemcpyHostToDevice);
  CHECK(tr.memops[1].bytes() == 256);
  CHECK(tr.memops[2].kind == cudaMemcpyDeviceToDevice);
  CHECK(tr.memops[2].width == 16);
  CHECK(tr.memops[2].height == 3);
  CHECK(tr.matmuls.empty());
  CHECK(tr.collectives.empty());
  cudaFree(d);
}

TEST_CASE("trace: a cuBLASLt matmul as cuBLASLt sees it, and a single-rank NCCL allreduce") {
  // D[4,2] = 2 A[4,3] B^T (B stored 2x3), fp32, bias epilogue.
  float *A = nullptr, *B = nullptr, *D = nullptr, *bias = nullptr;
  REQUIRE(cudaMalloc(&A, 12 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&B, 6 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&D, 8 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&bias, 4 * sizeof(float)) == cudaSuccess);
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 4, 3, 4) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 2, 3, 2) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 4, 2, 4) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 2.0f, beta = 0.0f;

  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitAll(&comm, 1, nullptr) == ncclSuccess);

  cuda_emu::trace_begin();
  REQUIRE(cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, nullptr, nullptr, 0, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(ncclAllReduce(D, D, 8, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const cuda_emu::Trace tr = cuda_emu::trace_take();

  REQUIRE(tr.matmuls.size() == 1);
  const cuda_emu::TraceMatmul& m = tr.matmuls[0];
  CHECK(m.m == 4);
  CHECK(m.n == 2);
  CHECK(m.k == 3);
  CHECK_FALSE(m.transa);
  CHECK(m.transb);
  CHECK(m.a_type == CUDA_R_32F);
  CHECK(m.d_type == CUDA_R_32F);
  CHECK(m.epilogue == CUBLASLT_EPILOGUE_BIAS);
  CHECK(m.alpha == 2.0f);
  CHECK(m.beta == 0.0f);
  CHECK(m.batch == 1);
  REQUIRE(tr.collectives.size() == 1);
  CHECK(tr.collectives[0].op == "ncclAllReduce");
  CHECK(tr.collectives[0].count == 8);
  CHECK(tr.collectives[0].type == ncclFloat32);
  CHECK(tr.collectives[0].rank == 0);
  CHECK(tr.kernels.empty());

  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  for (float* p : {A, B, D, bias}) cudaFree(p);
}
