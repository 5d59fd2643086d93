// The engine's cuBLASLt algorithms: the heuristic offers several distinct candidates per
// problem (returnedAlgoCount set, all computing the same result bit for bit), and an algo
// is bound to the problem it was returned for: cublasLtMatmul and cublasLtMatmulAlgoCheck
// refuse it for another shape, transposes, types or epilogue, or when its bytes are damaged.
#include <cstdint>
#include <cstring>
#include <vector>

#include <doctest/doctest.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace {

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) { REQUIRE(cudaMalloc(&p, n) == cudaSuccess); }
  ~Buf() { (void)cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// fp32 column-major D[m,n] = op(A) B with A m x k (k x m when ta), B k x n, packed.
struct Problem {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Problem(int m, int n, int k, bool ta = false, cudaDataType_t d_type = CUDA_R_32F,
          cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT, cudaDataType_t ab = CUDA_R_32F) {
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    const int32_t op = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op) == CUBLAS_STATUS_SUCCESS);
    const uint32_t e = epi;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&la, ab, ta ? k : m, ta ? m : k, ta ? k : m) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&lb, ab, k, n, k) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, m) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  }
  ~Problem() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;
  std::vector<cublasLtMatmulHeuristicResult_t> heuristic(int requested, cublasStatus_t* status = nullptr) {
    std::vector<cublasLtMatmulHeuristicResult_t> r(static_cast<size_t>(requested));
    int count = -1;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, requested, r.data(), &count);
    if (status) *status = s;
    r.resize(s == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(count) : 0);
    return r;
  }
  cublasStatus_t check(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulHeuristicResult_t* result) {
    return cublasLtMatmulAlgoCheck(h, desc, la, lb, ld, ld, &algo, result);
  }
  cublasStatus_t matmul(const cublasLtMatmulAlgo_t& algo, const void* A, const void* B, void* D) {
    const float alpha = 1, beta = 0;
    return cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &algo, nullptr, 0, nullptr);
  }
};

std::vector<unsigned char> download(const Buf& b, size_t n) {
  std::vector<unsigned char> h(n);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(h.data(), b.p, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

void upload_ramp(const Buf& b, size_t n_floats, float scale) {
  std::vector<float> v(n_floats);
  for (size_t i = 0; i < n_floats; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 13) - 6);
  REQUIRE(cudaMemcpy(b.p, v.data(), n_floats * 4, cudaMemcpyHostToDevice) == cudaSuccess);
}

}  // namespace

TEST_CASE("cublasLt algos: the heuristic offers several distinct candidates computing the same result") {
  const int m = 40, n = 24, k = 72;
  Problem p(m, n, k);
  const auto all = p.heuristic(8);
  REQUIRE(all.size() > 1);
  CHECK(all.size() <= 8);
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].state == CUBLAS_STATUS_SUCCESS);
    CHECK(all[i].workspaceSize == 0);
    for (size_t j = 0; j < i; ++j) CHECK(std::memcmp(&all[i].algo, &all[j].algo, sizeof all[i].algo) != 0);
  }
  // returnedAlgoCount never exceeds what was asked for; the first candidates do not depend
  // on how many were asked for.
  const auto two = p.heuristic(2);
  REQUIRE(two.size() == 2);
  CHECK(std::memcmp(&two[1].algo, &all[1].algo, sizeof two[1].algo) == 0);

  Buf A(m * k * 4), B(k * n * 4), D(m * n * 4);
  upload_ramp(A, m * k, 0.25f);
  upload_ramp(B, k * n, 0.5f);
  std::vector<unsigned char> first;
  for (const auto& r : all) {
    REQUIRE(cudaMemset(D.p, 0xff, m * n * 4) == cudaSuccess);
    REQUIRE(p.matmul(r.algo, A.p, B.p, D.p) == CUBLAS_STATUS_SUCCESS);
    const auto got = download(D, m * n * 4);
    if (first.empty()) first = got;
    CHECK(got == first);
  }
}

TEST_CASE("cublasLt algos: an algo made for another problem is refused by the call and by AlgoCheck") {
  Problem p(16, 8, 8);
  const auto cand = p.heuristic(4);
  REQUIRE(cand.size() == 4);
  Buf A(4096), B(4096), D(4096);

  SUBCASE("its own problem passes, every candidate") {
    for (const auto& r : cand) {
      cublasLtMatmulHeuristicResult_t res{};
      CHECK(p.check(r.algo, &res) == CUBLAS_STATUS_SUCCESS);
      CHECK(std::memcmp(&res.algo, &r.algo, sizeof r.algo) == 0);
      CHECK(res.state == CUBLAS_STATUS_SUCCESS);
      CHECK(res.workspaceSize == 0);
    }
  }
  SUBCASE("another shape, transpose, output type or epilogue") {
    Problem rows(24, 8, 8), cols(16, 16, 8), depth(16, 8, 16), trans(16, 8, 8, true);
    Problem bf16_out(16, 8, 8, false, CUDA_R_16BF, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF);
    Problem relu(16, 8, 8, false, CUDA_R_32F, CUBLASLT_EPILOGUE_RELU);
    for (Problem* other : {&rows, &cols, &depth, &trans, &bf16_out, &relu}) {
      cublasLtMatmulHeuristicResult_t res{};
      CHECK(other->check(cand[1].algo, &res) == CUBLAS_STATUS_INVALID_VALUE);
      CHECK(other->matmul(cand[1].algo, A.p, B.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
      // Its own candidates run.
      const auto mine = other->heuristic(1);
      REQUIRE(mine.size() == 1);
      CHECK(other->check(mine[0].algo, &res) == CUBLAS_STATUS_SUCCESS);
    }
  }
  SUBCASE("damaged or made-up bytes") {
    for (int word = 0; word < 8; ++word) {
      cublasLtMatmulAlgo_t bad = cand[2].algo;
      bad.data[word] ^= 1ull << 9;
      cublasLtMatmulHeuristicResult_t res{};
      CAPTURE(word);
      CHECK(p.check(bad, &res) == CUBLAS_STATUS_INVALID_VALUE);
      CHECK(p.matmul(bad, A.p, B.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    }
    cublasLtMatmulAlgo_t zero{};
    cublasLtMatmulHeuristicResult_t res{};
    CHECK(p.check(zero, &res) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("arguments") {
    cublasLtMatmulHeuristicResult_t res{};
    CHECK(p.check(cand[0].algo, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulAlgoCheck(p.h, p.desc, p.la, p.lb, p.ld, p.ld, nullptr, &res) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulAlgoCheck(nullptr, p.desc, p.la, p.lb, p.ld, p.ld, &cand[0].algo, &res) ==
          CUBLAS_STATUS_NOT_INITIALIZED);
    // A combination no algorithm implements: NOT_SUPPORTED, as the heuristic says.
    Problem mixed(16, 8, 8, false, CUDA_R_16F, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    CHECK(mixed.heuristic(1, &s).empty());
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(mixed.check(cand[0].algo, &res) == CUBLAS_STATUS_NOT_SUPPORTED);
  }
}
