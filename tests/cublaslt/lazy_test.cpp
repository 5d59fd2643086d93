// libcublasLt is loaded on the first cuBLASLt call, not at process start (lib/cublaslt).
#include "cublaslt/lazy.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {
std::string capture(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  REQUIRE(p);
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p.get())) out.append(buf.data(), n);
  return out;
}
}  // namespace

TEST_CASE("cuBLASLt is mapped only once a cuBLASLt function is called, and then it is the real library") {
  // Nothing in this test process has called cuBLASLt yet.
  CHECK_FALSE(dtrain::cublaslt::mapped_in_process());
  const size_t v = cublasLtGetVersion();
  INFO("load error: " << dtrain::cublaslt::load_error());
  REQUIRE(dtrain::cublaslt::ensure_loaded());
  CHECK(dtrain::cublaslt::load_error().empty());
  CHECK(dtrain::cublaslt::mapped_in_process());
  // The library's own version, with the major version of the header it was built against.
  CHECK(v / 10000 == CUBLAS_VER_MAJOR);
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  // The forwarders are not exported, and the library was loaded RTLD_LOCAL: a global lookup
  // finds neither, so the library's calls between its own functions cannot land in ours.
  CHECK(dlsym(RTLD_DEFAULT, "cublasLtMatmul") == nullptr);
}

TEST_CASE("the descriptor calls reach the real library with their arguments intact (no GPU needed)") {
  cublasLtMatrixLayout_t layout = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 48, 32, 64) == CUBLAS_STATUS_SUCCESS);
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  size_t written = 0;
  CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols, &written) ==
        CUBLAS_STATUS_SUCCESS);
  const int64_t new_ld = 96;
  CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &new_ld, sizeof new_ld) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(rows == 48);
  CHECK(cols == 32);
  CHECK(ld == 96);
  CHECK(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);

  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  cublasOperation_t got = CUBLAS_OP_N;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &got, sizeof got, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(got == CUBLAS_OP_T);
  CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);

  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const size_t ws = 1 << 20;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
}

TEST_CASE("dtrain --version does not load libcublasLt") {
  const char* bin = std::getenv("DTRAIN_BIN");
  if (!bin) {
    MESSAGE("DTRAIN_BIN is not set (run through ctest)");
    return;
  }
  // The dynamic loader names every object it maps (LD_DEBUG=files).
  const std::string out = capture("LD_DEBUG=files '" + std::string(bin) + "' --version 2>&1");
  CHECK(out.find("dtrain ") != std::string::npos);
  CHECK(out.find("libcudart.so") != std::string::npos);  // the check can see a CUDA library
  CHECK(out.find("libcublasLt.so") == std::string::npos);
}
