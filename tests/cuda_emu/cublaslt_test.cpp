// The cuBLASLt subset against a scalar double-precision reference: transposes, alpha and
// beta, every dtype combination and epilogue (aux and bias gradients included), in-place
// C == D, the NOT_SUPPORTED and INVALID_VALUE cases NVIDIA documents, and stream order.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

// ----------------------------------------------------------------------------
// Host-side matrices: values kept as floats exactly representable in the storage type.
size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

float round_to(cudaDataType_t t, float v) {
  if (t == CUDA_R_16F) return __half2float(__float2half_rn(v));
  if (t == CUDA_R_16BF) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

std::vector<unsigned char> encode(cudaDataType_t t, const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * esize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == CUDA_R_32F) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else if (t == CUDA_R_16F) {
      const __half h = __float2half_rn(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    } else {
      const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<float> decode(cudaDataType_t t, const std::vector<unsigned char>& b) {
  std::vector<float> out(b.size() / esize(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == CUDA_R_32F) {
      std::memcpy(&out[i], &b[i * 4], 4);
    } else if (t == CUDA_R_16F) {
      __half h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = __half2float(h);
    } else {
      __nv_bfloat16 h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = __bfloat162float(h);
    }
  }
  return out;
}

// A device buffer; cudaMalloc poisons fresh memory with 0xff bytes (NaN).
struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buf(size_t n) : bytes(n) { REQUIRE(cudaMalloc(&p, n) == cudaSuccess); }
  ~Buf() { (void)cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void upload(const std::vector<unsigned char>& h) {
    REQUIRE(h.size() <= bytes);
    REQUIRE(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<unsigned char> download(size_t n) const {
    std::vector<unsigned char> h(n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
};

struct Mat {
  cudaDataType_t type;
  int64_t rows, cols, ld;
  std::vector<float> v;  // column-major with ld
  float at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i + j * ld)]; }
};

Mat random_mat(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng, float lo = -1,
               float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Mat m{t, rows, cols, ld, std::vector<float>(static_cast<size_t>(ld * (cols - 1) + rows))};
  for (auto& x : m.v) x = round_to(t, dist(rng));
  return m;
}

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// Relative rounding unit of a storage type.
double unit(cudaDataType_t t) { return t == CUDA_R_32F ? 0x1p-24 : t == CUDA_R_16F ? 0x1p-11 : 0x1p-8; }

// ----------------------------------------------------------------------------
// One cuBLASLt problem, set up through the public API exactly as a caller would.
struct Lt {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Lt() { REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS); }
  ~Lt() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
  }
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  template <typename V>
  cublasStatus_t set(cublasLtMatmulDescAttributes_t a, const V& v) {
    return cublasLtMatmulDescSetAttribute(desc, a, &v, sizeof v);
  }
  template <typename V>
  cublasStatus_t pref_set(cublasLtMatmulPreferenceAttributes_t a, const V& v) {
    return cublasLtMatmulPreferenceSetAttribute(pref, a, &v, sizeof v);
  }
  // Descriptor for op(A) op(B) with A, B, C and D as given.
  void describe(const Mat& a, bool ta, const Mat& b, bool tb, const Mat& c, const Mat& d,
                cublasComputeType_t compute = CUBLAS_COMPUTE_32F, cudaDataType_t scale = CUDA_R_32F) {
    REQUIRE(cublasLtMatmulDescCreate(&desc, compute, scale) == CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    REQUIRE(set(CUBLASLT_MATMUL_DESC_TRANSA, opa) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(set(CUBLASLT_MATMUL_DESC_TRANSB, opb) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&la, a.type, a.rows, a.cols, a.ld) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&lb, b.type, b.rows, b.cols, b.ld) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&lc, c.type, c.rows, c.cols, c.ld) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&ld, d.type, d.rows, d.cols, d.ld) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t heuristic(cublasLtMatmulAlgo_t* algo) {
    cublasLtMatmulHeuristicResult_t r{};
    int count = -1;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 1, &r, &count);
    if (s == CUBLAS_STATUS_SUCCESS) {
      CHECK(count == 1);
      CHECK(r.state == CUBLAS_STATUS_SUCCESS);
      CHECK(r.workspaceSize == 0);
      *algo = r.algo;
    } else {
      CHECK(count == 0);
    }
    return s;
  }
  cublasStatus_t matmul(const cublasLtMatmulAlgo_t* algo, float alpha, const void* A, const void* B, float beta,
                        const void* C, void* D, cudaStream_t stream = 0, void* ws = nullptr, size_t ws_bytes = 0) {
    return cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, C, lc, D, ld, algo, ws, ws_bytes, stream);
  }
};

// ----------------------------------------------------------------------------
// A full case: random data, the GEMM through cuBLASLt, checked against doubles.
struct Case {
  int64_t m = 19, n = 13, k = 23;
  bool ta = false, tb = false;
  cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
  float alpha = 1, beta = 0;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  bool in_place = true;  // C == D (else a separate C with its own leading dimension)
  int64_t pad = 3;       // leading dimension = rows + pad for A, B and out-of-place C
};

struct Result {
  std::vector<float> d, aux, bias;
};

void check_close(const char* what, float got, double ref, double scale, double tol_unit) {
  const double tol = 1e-6 + tol_unit * (std::fabs(ref) + scale);
  if (!(std::fabs(got - ref) <= tol)) {
    FAIL_CHECK(what << ": got " << got << ", expected " << ref << " (tolerance " << tol << ")");
  }
}

Result run_case(const Case& cs, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const int64_t m = cs.m, n = cs.n, k = cs.k;
  const Mat a = cs.ta ? random_mat(cs.ab, k, m, k + cs.pad, rng) : random_mat(cs.ab, m, k, m + cs.pad, rng);
  const Mat b = cs.tb ? random_mat(cs.ab, n, k, n + cs.pad, rng) : random_mat(cs.ab, k, n, k + cs.pad, rng);
  const int64_t ldd = m + 1;
  Mat c = random_mat(cs.cd, m, n, cs.in_place ? ldd : m + cs.pad, rng);
  const Mat d_shape{cs.cd, m, n, ldd, {}};
  const bool bias_in = cs.epi == CUBLASLT_EPILOGUE_BIAS || cs.epi == CUBLASLT_EPILOGUE_RELU_BIAS ||
                       cs.epi == CUBLASLT_EPILOGUE_GELU_BIAS || cs.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool bgrad = cs.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD || cs.epi == CUBLASLT_EPILOGUE_BGRADA ||
                     cs.epi == CUBLASLT_EPILOGUE_BGRADB;
  const bool aux_out = cs.epi == CUBLASLT_EPILOGUE_GELU_AUX || cs.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool aux_in = cs.epi == CUBLASLT_EPILOGUE_DGELU || cs.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  const int64_t aux_ld = (m + 7) / 8 * 8 + 8;
  const int64_t bias_len = cs.epi == CUBLASLT_EPILOGUE_BGRADB ? n : m;
  const Mat bias = random_mat(cs.cd, bias_len, 1, bias_len, rng);
  const Mat aux = random_mat(cs.cd, m, n, aux_ld, rng, -3, 3);

  Buf da(a.v.size() * esize(a.type)), db(b.v.size() * esize(b.type));
  Buf dd(static_cast<size_t>(ldd * n) * esize(cs.cd));
  Buf dc(c.v.size() * esize(cs.cd));
  Buf dbias(static_cast<size_t>(bias_len) * esize(cs.cd)), daux(aux.v.size() * esize(cs.cd));
  da.upload(encode(a.type, a.v));
  db.upload(encode(b.type, b.v));
  // beta == 0: C must not be read, so leave it NaN (cudaMalloc's poison); else upload.
  void* cptr = cs.in_place ? dd.p : dc.p;
  if (cs.beta != 0) (cs.in_place ? dd : dc).upload(encode(cs.cd, c.v));
  if (bias_in) dbias.upload(encode(cs.cd, bias.v));
  if (aux_in) daux.upload(encode(cs.cd, aux.v));

  Lt lt;
  lt.describe(a, cs.ta, b, cs.tb, cs.in_place ? d_shape : c, d_shape);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, cs.epi) == CUBLAS_STATUS_SUCCESS);
  if (bias_in || bgrad) REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, dbias.p) == CUBLAS_STATUS_SUCCESS);
  if (aux_in || aux_out) {
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, daux.p) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld) == CUBLAS_STATUS_SUCCESS);
  }
  cublasLtMatmulAlgo_t algo{};
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.matmul(&algo, cs.alpha, da.p, db.p, cs.beta, cptr, dd.p) == CUBLAS_STATUS_SUCCESS);

  Result r;
  r.d = decode(cs.cd, dd.download(dd.bytes));
  if (aux_out) r.aux = decode(cs.cd, daux.download(daux.bytes));
  if (bgrad) r.bias = decode(cs.cd, dbias.download(dbias.bytes));

  // The reference, in doubles; `scale` bounds the magnitude of the terms summed.
  const double ulp_d = unit(cs.cd), acc_tol = 4.0 * (k + 4) * 0x1p-24;
  std::vector<double> pre(static_cast<size_t>(m * n)), out(static_cast<size_t>(m * n)), mag(pre.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sa = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double x = cs.ta ? a.at(kk, i) : a.at(i, kk), y = cs.tb ? b.at(j, kk) : b.at(kk, j);
        s += x * y;
        sa += std::fabs(x * y);
      }
      double v = cs.alpha * s, scale = std::fabs(cs.alpha) * sa;
      if (cs.beta != 0) {
        v += cs.beta * c.at(i, j);
        scale += std::fabs(cs.beta * c.at(i, j));
      }
      if (bias_in) {
        v += bias.at(i, 0);
        scale += std::fabs(bias.at(i, 0));
      }
      const size_t e = static_cast<size_t>(i + j * m);
      pre[e] = v;
      mag[e] = scale;
      if (cs.epi == CUBLASLT_EPILOGUE_RELU || cs.epi == CUBLASLT_EPILOGUE_RELU_BIAS) v = std::max(v, 0.0);
      if (cs.epi == CUBLASLT_EPILOGUE_GELU || cs.epi == CUBLASLT_EPILOGUE_GELU_BIAS || aux_out) v = gelu(v);
      if (aux_in) {
        const double g = gelu_grad(aux.at(i, j));
        v *= g;
        mag[e] *= std::fabs(g);
      }
      out[e] = v;
      const std::string where = "D(" + std::to_string(i) + "," + std::to_string(j) + ")";
      check_close(where.c_str(), r.d[static_cast<size_t>(i + j * ldd)], v, mag[e], acc_tol * 2 + ulp_d);
      if (aux_out)
        check_close(("aux" + where).c_str(), r.aux[static_cast<size_t>(i + j * aux_ld)], pre[e], scale,
                    acc_tol + ulp_d);
    }
  }
  if (bgrad) {
    for (int64_t x = 0; x < bias_len; ++x) {
      double s = 0, sa = 0;
      int64_t terms = 0;
      if (cs.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        for (int64_t j = 0; j < n; ++j) s += out[static_cast<size_t>(x + j * m)], sa += mag[x + j * m];
        terms = n;
      } else if (cs.epi == CUBLASLT_EPILOGUE_BGRADA) {
        for (int64_t kk = 0; kk < k; ++kk) s += cs.ta ? a.at(kk, x) : a.at(x, kk), sa += 1;
        terms = k;
      } else {
        for (int64_t kk = 0; kk < k; ++kk) s += cs.tb ? b.at(x, kk) : b.at(kk, x), sa += 1;
        terms = k;
      }
      check_close(("bias[" + std::to_string(x) + "]").c_str(), r.bias[static_cast<size_t>(x)], s, sa,
                  4.0 * (terms + k + 8) * 0x1p-24 + ulp_d);
    }
  }
  return r;
}

// Runs the heuristic for a descriptor set and expects "no algorithm".
void expect_not_supported(Lt& lt, const void* A, const void* B, void* D) {
  cublasLtMatmulAlgo_t algo{};
  CHECK(lt.heuristic(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(lt.matmul(nullptr, 1.0f, A, B, 0.0f, D, D) == CUBLAS_STATUS_NOT_SUPPORTED);
}

const Mat shape(cudaDataType_t t, int64_t r, int64_t c, int64_t ld) { return Mat{t, r, c, ld, {}}; }

}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE("cublasLt: every transpose pair with alpha and beta, fp32") {
  for (int t = 0; t < 4; ++t) {
    for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 2.0f}, {-1.5f, 1.0f}}) {
      Case cs;
      cs.ta = t & 1;
      cs.tb = t & 2;
      cs.alpha = alpha;
      cs.beta = beta;
      CAPTURE(t);
      CAPTURE(beta);
      run_case(cs);
      cs.in_place = false;
      run_case(cs, 2);
    }
  }
}

TEST_CASE("cublasLt: sizes spanning several tiles, and k = 1") {
  Case cs;
  cs.m = 131;
  cs.n = 70;
  cs.k = 65;
  cs.ta = true;
  cs.beta = 0.25f;
  run_case(cs);
  cs.m = 5;
  cs.n = 9;
  cs.k = 1;
  cs.ta = false;
  cs.tb = true;
  run_case(cs);
}

TEST_CASE("cublasLt: every supported dtype combination") {
  const std::pair<cudaDataType_t, cudaDataType_t> combos[] = {{CUDA_R_32F, CUDA_R_32F},
                                                              {CUDA_R_16F, CUDA_R_16F},
                                                              {CUDA_R_16F, CUDA_R_32F},
                                                              {CUDA_R_16BF, CUDA_R_16BF},
                                                              {CUDA_R_16BF, CUDA_R_32F}};
  for (auto [ab, cd] : combos) {
    for (int t = 0; t < 4; ++t) {
      Case cs;
      cs.ab = ab;
      cs.cd = cd;
      cs.ta = t & 1;
      cs.tb = t & 2;
      cs.beta = t == 3 ? 0.0f : 1.0f;
      CAPTURE(ab);
      CAPTURE(cd);
      CAPTURE(t);
      run_case(cs);
    }
  }
}

TEST_CASE("cublasLt: every epilogue, fp32 and bf16") {
  const cublasLtEpilogue_t epis[] = {
      CUBLASLT_EPILOGUE_RELU,          CUBLASLT_EPILOGUE_BIAS,     CUBLASLT_EPILOGUE_RELU_BIAS,
      CUBLASLT_EPILOGUE_GELU,          CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_BIAS,
      CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,    CUBLASLT_EPILOGUE_DGELU_BGRAD,
      CUBLASLT_EPILOGUE_BGRADA,        CUBLASLT_EPILOGUE_BGRADB};
  for (cublasLtEpilogue_t epi : epis) {
    for (cudaDataType_t ab : {CUDA_R_32F, CUDA_R_16BF}) {
      for (int t = 0; t < 4; t += 3) {
        Case cs;
        cs.epi = epi;
        cs.ab = cs.cd = ab;
        cs.ta = t & 1;
        cs.tb = t & 2;
        cs.beta = t ? 0.5f : 0.0f;
        CAPTURE(epi);
        CAPTURE(ab);
        CAPTURE(t);
        run_case(cs);
      }
    }
  }
}

TEST_CASE("cublasLt: dtrain's patterns (bf16 GELU_AUX_BIAS forward, BGRADB into fp32 dW)") {
  Case fwd;  // out[N,OC] = inp @ W^T + b: column-major m = OC, n = N, A = W (T), B = inp (N)
  fwd.m = 24;
  fwd.n = 10;
  fwd.k = 16;
  fwd.ta = true;
  fwd.ab = fwd.cd = CUDA_R_16BF;
  fwd.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  run_case(fwd);
  Case bwd;  // dW[OC,IC] += dout^T @ inp with dbias from BGRADB: m = IC, n = OC, k = N
  bwd.m = 12;
  bwd.n = 24;
  bwd.k = 10;
  bwd.tb = true;
  bwd.ab = CUDA_R_16BF;
  bwd.cd = CUDA_R_32F;
  bwd.beta = 1.0f;
  bwd.epi = CUBLASLT_EPILOGUE_BGRADB;
  run_case(bwd);
  Case dgelu;  // d(pre)[N,IC] = gelu'(pre) * (dout @ W): m = IC, n = N, k = OC, A = W (N), B = dout (N)
  dgelu.m = 24;
  dgelu.n = 10;
  dgelu.k = 16;
  dgelu.ab = dgelu.cd = CUDA_R_16BF;
  dgelu.epi = CUBLASLT_EPILOGUE_DGELU;
  run_case(dgelu);
  dgelu.in_place = false;  // C unread with beta 0, wherever it points
  run_case(dgelu, 3);
}

TEST_CASE("cublasLt: DGELU reads the GELU input the forward's GELU_AUX_BIAS stored") {
  // Forward: act = gelu(W1 x + b) with aux = the pre-activation; backward: d(pre) =
  // gelu'(aux) * (W2^T dy) through DGELU. The chain equals the scalar derivative.
  const int64_t F = 16, C = 8, N = 5;
  std::mt19937 rng(21);
  const Mat w1 = random_mat(CUDA_R_32F, C, F, C, rng), x = random_mat(CUDA_R_32F, C, N, C, rng);
  const Mat bias = random_mat(CUDA_R_32F, F, 1, F, rng), w2 = random_mat(CUDA_R_32F, C, F, C, rng);
  const Mat dy = random_mat(CUDA_R_32F, C, N, C, rng);
  Buf dw1(w1.v.size() * 4), dx(x.v.size() * 4), db(bias.v.size() * 4), dw2(w2.v.size() * 4), ddy(dy.v.size() * 4);
  Buf act(static_cast<size_t>(F * N) * 4), aux(static_cast<size_t>(F * N) * 4), dpre(static_cast<size_t>(F * N) * 4);
  dw1.upload(encode(CUDA_R_32F, w1.v));
  dx.upload(encode(CUDA_R_32F, x.v));
  db.upload(encode(CUDA_R_32F, bias.v));
  dw2.upload(encode(CUDA_R_32F, w2.v));
  ddy.upload(encode(CUDA_R_32F, dy.v));
  const Mat out = shape(CUDA_R_32F, F, N, F);
  cublasLtMatmulAlgo_t algo{};
  {
    Lt fwd;  // act[F,N] = W1^T[F,C] x[C,N] + b
    fwd.describe(w1, true, x, false, out, out);
    REQUIRE(fwd.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(fwd.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(db.p)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(fwd.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.p) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(fwd.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, F) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(fwd.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(fwd.matmul(&algo, 1.0f, dw1.p, dx.p, 0.0f, act.p, act.p) == CUBLAS_STATUS_SUCCESS);
  }
  {
    Lt bwd;  // d(pre)[F,N] = gelu'(aux) * (W2^T[F,C] dy[C,N])
    bwd.describe(w2, true, dy, false, out, out);
    REQUIRE(bwd.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DGELU) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(bwd.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.p) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(bwd.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, F) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(bwd.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(bwd.matmul(&algo, 1.0f, dw2.p, ddy.p, 0.0f, dpre.p, dpre.p) == CUBLAS_STATUS_SUCCESS);
  }
  const std::vector<float> a = decode(CUDA_R_32F, act.download(act.bytes));
  const std::vector<float> d = decode(CUDA_R_32F, dpre.download(dpre.bytes));
  for (int64_t f = 0; f < F; ++f)
    for (int64_t n = 0; n < N; ++n) {
      double pre = bias.at(f, 0), g = 0, mag = std::fabs(bias.at(f, 0)), gmag = 0;
      for (int64_t c = 0; c < C; ++c) {
        pre += double(w1.at(c, f)) * x.at(c, n);
        mag += std::fabs(double(w1.at(c, f)) * x.at(c, n));
        g += double(w2.at(c, f)) * dy.at(c, n);
        gmag += std::fabs(double(w2.at(c, f)) * dy.at(c, n));
      }
      const size_t e = static_cast<size_t>(f + n * F);
      check_close("act", a[e], gelu(pre), mag, 4.0 * (C + 4) * 0x1p-24);
      check_close("d(pre)", d[e], gelu_grad(pre) * g, gmag * (1 + mag), 8.0 * (C + 4) * 0x1p-24);
    }
}

TEST_CASE("cublasLt: DGELU needs its GELU input; DGELU_BGRAD its bias gradient vector") {
  Buf A(4096), B(4096), D(4096), aux(4096), bias(256);
  const Mat f8 = shape(CUDA_R_32F, 8, 8, 8);
  for (cublasLtEpilogue_t epi : {CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD}) {
    CAPTURE(epi);
    const bool bgrad = epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    cublasLtMatmulAlgo_t algo{};
    {  // no aux pointer: the heuristic has nothing to check, the call refuses
      Lt lt;
      lt.describe(f8, false, f8, false, f8, f8);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{8}) == CUBLAS_STATUS_SUCCESS);
      if (bgrad) REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
      CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    }
    {  // no aux leading dimension (default 0): "Must be divisible by 8 and be no less than the rows"
      Lt lt;
      lt.describe(f8, false, f8, false, f8, f8);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.p) == CUBLAS_STATUS_SUCCESS);
      if (bgrad) REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p) == CUBLAS_STATUS_SUCCESS);
      CHECK(lt.heuristic(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(lt.matmul(nullptr, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    }
    {  // the output written over the GELU input it reads: undefined on a GPU, refused here
      Lt lt;
      lt.describe(f8, false, f8, false, f8, f8);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, D.p) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{8}) == CUBLAS_STATUS_SUCCESS);
      if (bgrad) REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
      CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    }
    if (bgrad) {  // no bias gradient vector
      Lt lt;
      lt.describe(f8, false, f8, false, f8, f8);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.p) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{8}) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
      CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    }
  }
}

TEST_CASE("cublasLt: bias gradients overwrite the bias vector") {
  Case cs;
  cs.epi = CUBLASLT_EPILOGUE_BGRADB;
  const Result r = run_case(cs);  // the bias buffer held cudaMalloc's NaN poison before
  for (float x : r.bias) CHECK(std::isfinite(x));
}

TEST_CASE("cublasLt: exact and deterministic") {
  // Small integers: every partial sum is exact in fp32, whatever the order.
  Case cs;
  cs.m = 33;
  cs.n = 7;
  cs.k = 40;
  std::mt19937 rng(7);
  const Mat a = random_mat(CUDA_R_32F, cs.m, cs.k, cs.m, rng);
  const Mat b = random_mat(CUDA_R_32F, cs.k, cs.n, cs.k, rng);
  std::vector<float> ai(a.v.size()), bi(b.v.size());
  for (size_t i = 0; i < ai.size(); ++i) ai[i] = std::round(a.v[i] * 8);
  for (size_t i = 0; i < bi.size(); ++i) bi[i] = std::round(b.v[i] * 8);
  Buf da(ai.size() * 4), db(bi.size() * 4), dd(static_cast<size_t>(cs.m * cs.n) * 4);
  da.upload(encode(CUDA_R_32F, ai));
  db.upload(encode(CUDA_R_32F, bi));
  Lt lt;
  const Mat ma = shape(CUDA_R_32F, cs.m, cs.k, cs.m), mb = shape(CUDA_R_32F, cs.k, cs.n, cs.k),
            md = shape(CUDA_R_32F, cs.m, cs.n, cs.m);
  lt.describe(ma, false, mb, false, md, md);
  cublasLtMatmulAlgo_t algo{};
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.matmul(&algo, 1.0f, da.p, db.p, 0.0f, dd.p, dd.p) == CUBLAS_STATUS_SUCCESS);
  const std::vector<float> d = decode(CUDA_R_32F, dd.download(dd.bytes));
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = 0; j < cs.n; ++j) {
      float s = 0;
      for (int64_t kk = 0; kk < cs.k; ++kk) s += ai[i + kk * cs.m] * bi[kk + j * cs.k];
      CHECK(d[i + j * cs.m] == s);
    }
  // Random data twice: bitwise the same.
  Case r;
  r.m = 150;
  r.n = 9;
  r.k = 300;
  const Result x = run_case(r, 5), y = run_case(r, 5);
  CHECK(std::memcmp(x.d.data(), y.d.data(), x.d.size() * 4) == 0);
}

TEST_CASE("cublasLt: combinations NVIDIA does not support get no algorithm") {
  Buf A(4096), B(4096), D(4096);
  const Mat f8 = shape(CUDA_R_32F, 8, 8, 8), h8 = shape(CUDA_R_16F, 8, 8, 8), b8 = shape(CUDA_R_16BF, 8, 8, 8);
  SUBCASE("A and B types differ") {
    Lt lt;
    lt.describe(h8, false, b8, false, f8, f8);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("fp32 inputs with a 16-bit output") {
    Lt lt;
    lt.describe(f8, false, f8, false, h8, h8);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("C type differs from D type") {
    Lt lt;
    lt.describe(b8, false, b8, false, b8, f8);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("compute types this subset does not implement") {
    for (cublasComputeType_t ct : {CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_16F, CUBLAS_COMPUTE_64F}) {
      Lt lt;
      lt.describe(f8, false, f8, false, f8, f8, ct);
      expect_not_supported(lt, A.p, B.p, D.p);
    }
  }
  SUBCASE("scale type other than fp32") {
    Lt lt;
    lt.describe(h8, false, h8, false, h8, h8, CUBLAS_COMPUTE_32F, CUDA_R_16F);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("row order and batches") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    const int32_t row = CUBLASLT_ORDER_ROW;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(lt.la, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row) ==
            CUBLAS_STATUS_SUCCESS);
    expect_not_supported(lt, A.p, B.p, D.p);
    const int32_t col = CUBLASLT_ORDER_COL, two = 2;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(lt.la, CUBLASLT_MATRIX_LAYOUT_ORDER, &col, sizeof col) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(lt.ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof two) ==
            CUBLAS_STATUS_SUCCESS);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("a bias type other than D's") {
    Lt lt;
    lt.describe(b8, false, b8, false, b8, b8);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(B.p)) == CUBLAS_STATUS_SUCCESS);
    const int32_t f32 = CUDA_R_32F;
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, f32) == CUBLAS_STATUS_SUCCESS);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("ReLU bit-mask epilogues") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU_AUX) == CUBLAS_STATUS_SUCCESS);
    expect_not_supported(lt, A.p, B.p, D.p);
  }
  SUBCASE("aux leading dimension not a multiple of 8, or below the rows of D") {
    for (int64_t aux_ld : {int64_t{0}, int64_t{12}, int64_t{4}}) {
      const Mat f12 = shape(CUDA_R_32F, 12, 8, 12), f12x12 = shape(CUDA_R_32F, 12, 12, 12);
      Lt lt;
      lt.describe(f12x12, false, f12, false, f12, f12);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(B.p)) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld) == CUBLAS_STATUS_SUCCESS);
      cublasLtMatmulAlgo_t algo{};
      CHECK(lt.heuristic(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
      // NVIDIA documents the aux rules as cublasLtMatmul argument errors.
      CHECK(lt.matmul(nullptr, 1.0f, A.p, A.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    }
  }
  SUBCASE("aux data type set outside FP8") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(B.p)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{8}) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, int32_t{CUDA_R_32F}) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulAlgo_t algo{};
    CHECK(lt.heuristic(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(lt.matmul(nullptr, 1.0f, A.p, A.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  }
}

TEST_CASE("cublasLt: invalid shapes and arguments") {
  Buf A(4096), B(4096), D(4096);
  const Mat f8 = shape(CUDA_R_32F, 8, 8, 8);
  cublasLtMatmulAlgo_t algo{};
  SUBCASE("leading dimension below rows") {
    Lt lt;
    lt.describe(shape(CUDA_R_32F, 8, 8, 7), false, f8, false, f8, f8);
    CHECK(lt.heuristic(&algo) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt.matmul(nullptr, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("op(A) and op(B) do not chain") {
    Lt lt;
    lt.describe(shape(CUDA_R_32F, 8, 4, 8), false, f8, false, f8, f8);
    CHECK(lt.heuristic(&algo) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("requested algo count and handle") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    cublasLtMatmulHeuristicResult_t r{};
    int count = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt.h, lt.desc, lt.la, lt.lb, lt.lc, lt.ld, lt.pref, 0, &r, &count) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulAlgoGetHeuristic(nullptr, lt.desc, lt.la, lt.lb, lt.lc, lt.ld, lt.pref, 1, &r, &count) ==
          CUBLAS_STATUS_NOT_INITIALIZED);
  }
  SUBCASE("bias and aux pointers required by the epilogue") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("an algo from another epilogue") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU) == CUBLAS_STATUS_SUCCESS);
    CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("in-place needs identical C and D layouts; C may not partly overlap D") {
    Lt lt;
    lt.describe(f8, false, f8, false, shape(CUDA_R_32F, 8, 8, 9), f8);
    REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 1.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    Lt lt2;
    lt2.describe(f8, false, f8, false, f8, f8);
    cublasLtMatmulPreference_t pref = lt2.pref;
    const uint32_t four = 4;
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &four, 4) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(lt2.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(lt2.matmul(&algo, 1.0f, A.p, B.p, 1.0f, D.at(4), D.p) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt2.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.at(4), D.p) == CUBLAS_STATUS_SUCCESS);    // C unread
    CHECK(lt2.matmul(&algo, 1.0f, D.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);  // D overwrites A
  }
  SUBCASE("attribute sizes are checked") {
    Lt lt;
    lt.describe(f8, false, f8, false, f8, f8);
    const int64_t wide = CUBLAS_OP_T;
    CHECK(lt.set(CUBLASLT_MATMUL_DESC_TRANSA, wide) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int32_t{8}) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt.pref_set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint32_t{1}) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutSetAttribute(lt.la, CUBLASLT_MATRIX_LAYOUT_LD, &wide, 4) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_T}) == CUBLAS_STATUS_SUCCESS);
    size_t need = 0;
    CHECK(cublasLtMatmulDescGetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 0, &need) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(need == 4);
    int32_t got = -1;
    CHECK(cublasLtMatmulDescGetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &got, 4, &need) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(got == CUBLAS_OP_T);
    uint64_t rows = 0;
    CHECK(cublasLtMatrixLayoutGetAttribute(lt.la, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, 8, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(rows == 8);
  }
  SUBCASE("status names") {
    CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
    CHECK(std::string(cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS)) == "success");
    CHECK(cublasLtGetVersion() > 0);
  }
}

TEST_CASE("cublasLt: the alignment promise of the heuristic") {
  Buf A(8192), B(8192), D(8192);
  const Mat f8 = shape(CUDA_R_32F, 8, 8, 8);
  cublasLtMatmulAlgo_t algo{};
  Lt lt;
  lt.describe(f8, false, f8, false, f8, f8);
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);  // default promise: 256 bytes
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, A.at(16), B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.at(64), D.at(64)) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(nullptr, 1.0f, A.at(4), B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);  // implicit: 256
  const uint32_t four = 4, one = 1;
  REQUIRE(lt.pref_set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, four) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, A.at(4), B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.pref_set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, one) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, A.at(2), B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);  // below fp32
  // The bias alignment comes from the pointer in the descriptor at heuristic time.
  Buf bias(256);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.p)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.at(4))) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("cublasLt: every pointer must cover its extent in device memory of the stream's device") {
  Buf A(8 * 8 * 4), B(8 * 8 * 4), D(8 * 8 * 4), small(8 * 7 * 4), ws(1024);
  const Mat f8 = shape(CUDA_R_32F, 8, 8, 8);
  std::vector<float> host(64, 1.0f);
  cublasLtMatmulAlgo_t algo{};
  Lt lt;
  lt.describe(f8, false, f8, false, f8, f8);
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, small.p, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);  // runs off the end
  CHECK(lt.matmul(&algo, 1.0f, A.p, small.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, small.p, small.p) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 1.0f, small.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);  // C read
  CHECK(lt.matmul(nullptr, 1.0f, host.data(), B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(&algo, 1.0f, nullptr, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  // The workspace: device memory of at least the size given, 256-byte aligned.
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p, 0, ws.p, 1024) == CUBLAS_STATUS_SUCCESS);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p, 0, ws.p, 4096) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p, 0, ws.at(16), 512) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt.matmul(&algo, 1.0f, A.p, B.p, 0.0f, D.p, D.p, 0, host.data(), 64) == CUBLAS_STATUS_INVALID_VALUE);
  // Memory of another device.
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  if (count > 1) {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    void* other = nullptr;
    REQUIRE(cudaMalloc(&other, 8 * 8 * 4) == cudaSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    CHECK(lt.matmul(&algo, 1.0f, other, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaFree(other) == cudaSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
  }
  // Freed memory.
  void* gone = nullptr;
  REQUIRE(cudaMalloc(&gone, 8 * 8 * 4) == cudaSuccess);
  REQUIRE(cudaFree(gone) == cudaSuccess);
  CHECK(lt.matmul(&algo, 1.0f, gone, B.p, 0.0f, D.p, D.p) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("cublasLt: stream order; descriptor and scalars read at call time, inputs at run time") {
  const int64_t n = 8;
  const Mat f8 = shape(CUDA_R_32F, n, n, n);
  std::vector<float> ones(n * n, 1.0f), twos(n * n, 2.0f), bias_a(n, 10.0f), bias_b(n, 100.0f);
  Buf A(n * n * 4), B(n * n * 4), D(n * n * 4), ba(n * 4), bb(n * 4);
  A.upload(encode(CUDA_R_32F, ones));
  B.upload(encode(CUDA_R_32F, ones));
  ba.upload(encode(CUDA_R_32F, bias_a));
  bb.upload(encode(CUDA_R_32F, bias_b));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the uploads' DMA is not ordered with stream s
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  Lt lt;
  lt.describe(f8, false, f8, false, f8, f8);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(ba.p)) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulAlgo_t algo{};
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  float alpha = 1.0f, beta = 0.0f;
  REQUIRE(cublasLtMatmul(lt.h, lt.desc, &alpha, A.p, lt.la, B.p, lt.lb, &beta, D.p, lt.ld, D.p, lt.ld, &algo, nullptr,
                         0, s) == CUBLAS_STATUS_SUCCESS);
  // Changed after the call: none of this may affect the queued GEMM...
  alpha = 3.0f;
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bb.p)) == CUBLAS_STATUS_SUCCESS);
  // ...but a later write to A in the same stream runs after it.
  REQUIRE(cudaMemcpyAsync(A.p, twos.data(), n * n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
  const char* sched = std::getenv("CUDA_EMU_SCHEDULE");
  if (!sched || std::string(sched) != "fifo") {
    // The engine runs undemanded work late: nothing is visible before the sync.
    CHECK(std::isnan(static_cast<const float*>(D.p)[0]));
  }
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::vector<float> d = decode(CUDA_R_32F, D.download(D.bytes));
  for (float x : d) CHECK(x == 8.0f + 10.0f);
  // The next call sees the new A, alpha and bias.
  REQUIRE(cublasLtMatmul(lt.h, lt.desc, &alpha, A.p, lt.la, B.p, lt.lb, &beta, D.p, lt.ld, D.p, lt.ld, &algo, nullptr,
                         0, s) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::vector<float> d2 = decode(CUDA_R_32F, D.download(D.bytes));
  for (float x : d2) CHECK(x == 3.0f * 16.0f + 100.0f);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("cublasLt: device pointer mode reads alpha and beta when the GEMM runs") {
  const Mat f8 = shape(CUDA_R_32F, 8, 8, 8);
  std::vector<float> ones(64, 1.0f);
  Buf A(256), B(256), D(256), scal(8);
  A.upload(encode(CUDA_R_32F, ones));
  B.upload(encode(CUDA_R_32F, ones));
  D.upload(encode(CUDA_R_32F, ones));
  scal.upload(encode(CUDA_R_32F, {2.0f, 0.5f}));
  Lt lt;
  lt.describe(f8, false, f8, false, f8, f8);
  REQUIRE(lt.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t{CUBLASLT_POINTER_MODE_DEVICE}) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulAlgo_t algo{};
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  const float* alpha = static_cast<const float*>(scal.p);
  REQUIRE(cublasLtMatmul(lt.h, lt.desc, alpha, A.p, lt.la, B.p, lt.lb, alpha + 1, D.p, lt.ld, D.p, lt.ld, &algo,
                         nullptr, 0, 0) == CUBLAS_STATUS_SUCCESS);
  const std::vector<float> d = decode(CUDA_R_32F, D.download(D.bytes));
  for (float x : d) CHECK(x == 2.0f * 8.0f + 0.5f);
  float host_alpha = 1.0f;  // a host pointer in device mode
  CHECK(cublasLtMatmul(lt.h, lt.desc, &host_alpha, A.p, lt.la, B.p, lt.lb, alpha + 1, D.p, lt.ld, D.p, lt.ld, &algo,
                       nullptr, 0, 0) == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("cublasLt: a 1024 x 1024 x 256 bf16 GEMM matches a sampled reference") {
  const int64_t m = 1024, n = 1024, k = 256;
  std::mt19937 rng(11);
  const Mat a = random_mat(CUDA_R_16BF, k, m, k, rng), b = random_mat(CUDA_R_16BF, k, n, k, rng);
  const Mat d = shape(CUDA_R_32F, m, n, m);
  Buf da(a.v.size() * 2), db(b.v.size() * 2), dd(static_cast<size_t>(m * n) * 4);
  da.upload(encode(CUDA_R_16BF, a.v));
  db.upload(encode(CUDA_R_16BF, b.v));
  Lt lt;
  lt.describe(a, true, b, false, d, d);
  cublasLtMatmulAlgo_t algo{};
  REQUIRE(lt.heuristic(&algo) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.matmul(&algo, 1.0f, da.p, db.p, 0.0f, dd.p, dd.p) == CUBLAS_STATUS_SUCCESS);
  const std::vector<float> got = decode(CUDA_R_32F, dd.download(dd.bytes));
  for (int64_t i = 0; i < m; i += 37)
    for (int64_t j = 0; j < n; j += 41) {
      double s = 0, sa = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        s += double(a.at(kk, i)) * b.at(kk, j);
        sa += std::fabs(double(a.at(kk, i)) * b.at(kk, j));
      }
      check_close("D", got[i + j * m], s, sa, 4.0 * (k + 4) * 0x1p-24);
    }
}
