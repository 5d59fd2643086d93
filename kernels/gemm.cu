// cuBLASLt plumbing: a row-major GEMM is the column-major GEMM C^T = op(B)^T op(A)^T,
// so A and B swap places and M and N swap roles. Per device: a handle, a workspace and
// a plan cache (matmul descriptor + layouts + the algorithm gemm_algo.cu chose on the
// problem's first call); the cache mutex also guards the per-call pointer attributes set
// on a cached descriptor.
#include "kernels/gemm.cuh"

#include "kernels/cast.cuh"
#include "kernels/common.cuh"
#include "kernels/gemm_algo.cuh"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace dtrain::kernels {

namespace {
using namespace detail;

enum class Epi : int { DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADB };

cublasLtEpilogue_t epi_lt(Epi e) {
  switch (e) {
    case Epi::BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case Epi::GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epi::GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epi::DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case Epi::BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

cudaDataType_t cuda_type(DType t) { return t == DType::F32 ? CUDA_R_32F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; }

// Largest power of two (<= 256) dividing the address: the heuristic's alignment promise.
uint32_t align_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return static_cast<uint32_t>(low < 256 ? low : 256);
}

// Column-major problem as cuBLASLt sees it.
struct Problem {
  cublasOperation_t ta, tb;
  int m, n, k;
  int64_t lda, ldb, ldc;
  DType ab, c;
  Epi epi;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  auto key() const {
    return std::make_tuple(static_cast<int>(ta), static_cast<int>(tb), m, n, k, lda, ldb, ldc, static_cast<int>(ab),
                           static_cast<int>(c), static_cast<int>(epi), align_a, align_b, align_c, align_bias,
                           align_aux);
  }
  // The same fields as the cache file names them (NVIDIA's epilogue values, dtype names):
  // "NT:m,n,k:lda,ldb,ldc:bfloat16>float32:e512:a256,256,16,256,0".
  std::string key_text() const;
};
using Key = decltype(std::declval<Problem>().key());

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  bool from_file = false;  // algo came from the cache file (refused at the call: chosen again)
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  std::map<Key, std::unique_ptr<Plan>> plans;
  DeviceState() {
    DT_CUBLAS_CHECK(cublasLtCreate(&handle));
    DT_CUDA_CHECK(cudaMalloc(&workspace, GEMM_WORKSPACE_BYTES));
  }
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;
  ~DeviceState() {
    plans.clear();
    // At process exit the runtime may already be gone: nothing to report then.
    if (workspace) (void)cudaFree(workspace);
    if (handle) (void)cublasLtDestroy(handle);
  }
};

struct DeviceStates {
  std::mutex mu;
  std::map<int, std::unique_ptr<DeviceState>> by_device;
};
DeviceStates& device_states() {
  static DeviceStates states;
  return states;
}

DeviceState& device_state() {
  DeviceStates& all = device_states();
  int dev = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(all.mu);
  auto& s = all.by_device[dev];
  if (!s) s = std::make_unique<DeviceState>();
  return *s;
}

std::string Problem::key_text() const {
  auto num = [](auto v) { return std::to_string(v); };
  return std::string(ta == CUBLAS_OP_N ? "N" : "T") + (tb == CUBLAS_OP_N ? "N" : "T") + ":" + num(m) + "," + num(n) +
         "," + num(k) + ":" + num(lda) + "," + num(ldb) + "," + num(ldc) + ":" + dtype_name(ab) + ">" + dtype_name(c) +
         ":e" + num(static_cast<int>(epi_lt(epi))) + ":a" + num(align_a) + "," + num(align_b) + "," + num(align_c) +
         "," + num(align_bias) + "," + num(align_aux);
}

template <typename V>
void desc_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

// The plan's descriptors for p (its algorithm comes from plan_choose).
std::unique_ptr<Plan> plan_create(const Problem& p, const void* bias, const void* aux) {
  auto plan = std::make_unique<Plan>();
  DT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  desc_set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, p.ta);
  desc_set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, p.tb);
  desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi_lt(p.epi));
  if (bias) desc_set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux) {
    desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(p.ldc));
  }
  const cudaDataType_t tab = cuda_type(p.ab), tc = cuda_type(p.c);
  const bool na = p.ta == CUBLAS_OP_N, nb = p.tb == CUBLAS_OP_N;
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, tab, na ? p.m : p.k, na ? p.k : p.m, p.lda));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, tab, nb ? p.k : p.n, nb ? p.n : p.k, p.ldb));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, tc, p.m, p.n, p.ldc));
  return plan;
}

// Chooses plan's algorithm on this call (gemm_algo.cuh); false when cuBLASLt has none.
bool plan_choose(DeviceState& st, Plan& plan, const Problem& p, bool use_file, float alpha, const void* A,
                 const void* B, float beta, const void* C, const void* bias, const void* aux, cudaStream_t stream) {
  AlgoCall call;
  call.handle = st.handle;
  call.desc = plan.desc;
  call.la = plan.la;
  call.lb = plan.lb;
  call.lc = plan.lc;
  call.align_a = p.align_a;
  call.align_b = p.align_b;
  call.align_c = p.align_c;
  call.a = B;
  call.b = A;
  call.c = C;
  call.alpha = alpha;
  call.beta = beta;
  call.bias = bias;
  call.aux = aux;
  call.d_bytes =
      (static_cast<size_t>(p.n - 1) * static_cast<size_t>(p.ldc) + static_cast<size_t>(p.m)) * dtype_size(p.c);
  if (p.epi == Epi::GELU_AUX || p.epi == Epi::GELU_AUX_BIAS) call.aux_out_bytes = call.d_bytes;
  if (p.epi == Epi::BGRADB) call.bias_out_bytes = static_cast<size_t>(p.n) * dtype_size(p.c);
  call.flops = 2.0 * p.m * p.n * p.k;
  call.key = p.key_text();
  call.workspace = st.workspace;
  call.workspace_bytes = GEMM_WORKSPACE_BYTES;
  call.stream = stream;
  const AlgoSource src = gemm_algo_choose(call, use_file, &plan.algo);
  plan.found = src != AlgoSource::NONE;
  plan.from_file = src == AlgoSource::FILE;
  return plan.found;
}

// Runs p; returns false (nothing enqueued) when cuBLASLt has no algorithm for it. A and B
// are the row-major operands of gemm(): cuBLASLt's A is our B and its B is our A (the
// plan's layouts la / lb describe them in that order).
bool matmul_try(const Problem& p, float alpha, const void* A, const void* B, float beta, void* C, const void* bias,
                const void* aux, cudaStream_t stream) {
  DeviceState& st = device_state();
  std::lock_guard<std::mutex> lock(st.mu);
  auto& plan = st.plans[p.key()];
  if (!plan) {
    auto fresh = plan_create(p, bias, aux);
    plan_choose(st, *fresh, p, true, alpha, A, B, beta, C, bias, aux, stream);
    plan = std::move(fresh);
  }
  if (!plan->found) return false;
  auto run = [&] {
    if (bias) desc_set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (aux) desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    return cublasLtMatmul(st.handle, plan->desc, &alpha, B, plan->la, A, plan->lb, &beta, C, plan->lc, C, plan->lc,
                          &plan->algo, st.workspace, GEMM_WORKSPACE_BYTES, stream);
  };
  cublasStatus_t s = run();
  // An algorithm from the cache file that passed cublasLtMatmulAlgoCheck but that the call
  // refuses (nothing was enqueued): the file is never a correctness dependency, so the
  // problem is chosen again without it.
  if (s != CUBLAS_STATUS_SUCCESS && plan->from_file) {
    if (!plan_choose(st, *plan, p, false, alpha, A, B, beta, C, bias, aux, stream)) return false;
    s = run();
  }
  DT_CUBLAS_CHECK(s);
  return true;
}

// Row pitches (elements) of gemm()'s row-major A, B and C.
struct Pitch {
  int64_t a, b, c;
};
Pitch packed(bool trans_a, bool trans_b, int M, int N, int K) { return {trans_a ? M : K, trans_b ? K : N, N}; }

// The row-major problem of gemm(...) in cuBLASLt's column-major terms.
Problem problem_for(bool trans_a, bool trans_b, int M, int N, int K, const void* A, const void* B, void* C, Pitch ld,
                    DType ab, DType c, Epi epi, const void* bias, const void* aux) {
  Problem p;
  p.ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  p.tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // and its B is our A
  p.m = N;
  p.n = M;
  p.k = K;
  p.lda = ld.b;
  p.ldb = ld.a;
  p.ldc = ld.c;
  p.ab = ab;
  p.c = c;
  p.epi = epi;
  p.align_a = align_of(B);
  p.align_b = align_of(A);
  p.align_c = align_of(C);
  p.align_bias = bias ? align_of(bias) : 0;
  p.align_aux = aux ? align_of(aux) : 0;
  return p;
}

void dtypes_check(DType ab, DType c) {
  DTK_REQUIRE(c == ab || (c == DType::F32 && ab != DType::F32), UsageError,
              "gemm: C must have the inputs' dtype, or fp32 with bf16/fp16 inputs");
}

void matmul_run(const Problem& p, float alpha, const void* A, const void* B, float beta, void* C, const void* bias,
                const void* aux, cudaStream_t stream) {
  if (!matmul_try(p, alpha, A, B, beta, C, bias, aux, stream))
    ::dtrain::detail::throw_error(Exit::DEVICE,
                                  "cuBLASLt has no algorithm for this GEMM (m=" + std::to_string(p.m) +
                                      " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) + " " +
                                      dtype_name(p.ab) + "->" + dtype_name(p.c) + ", epilogue " +
                                      std::to_string(static_cast<int>(p.epi)) + ")",
                                  __FILE__, __LINE__);
}

// gemm() with row pitches.
void gemm_pitched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, const void* B,
                  float beta, void* C, Pitch ld, DType ab_dtype, DType c_dtype, cudaStream_t stream) {
  const Problem p =
      problem_for(trans_a, trans_b, M, N, K, A, B, C, ld, ab_dtype, c_dtype, Epi::DEFAULT, nullptr, nullptr);
  matmul_run(p, alpha, A, B, beta, C, nullptr, nullptr, stream);
}
}  // namespace

void gemm_plans_reset() {
  DeviceStates& all = device_states();
  std::lock_guard<std::mutex> lock(all.mu);
  for (auto& entry : all.by_device) {
    std::lock_guard<std::mutex> plans_lock(entry.second->mu);
    entry.second->plans.clear();
  }
  detail::gemm_algo_forget();
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, const void* B, float beta,
          void* C, DType ab_dtype, DType c_dtype, cudaStream_t stream) {
  dtypes_check(ab_dtype, c_dtype);
  DTK_REQUIRE(M >= 0 && N >= 0 && K > 0, UsageError, "gemm: sizes must be positive");
  if (M == 0 || N == 0) return;
  gemm_pitched(trans_a, trans_b, M, N, K, alpha, A, B, beta, C, packed(trans_a, trans_b, M, N, K), ab_dtype, c_dtype,
               stream);
}

void gemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
             int ldb, float beta, void* C, int ldc, DType ab_dtype, DType c_dtype, cudaStream_t stream) {
  dtypes_check(ab_dtype, c_dtype);
  DTK_REQUIRE(M >= 0 && N >= 0 && K > 0, UsageError, "gemm: sizes must be positive");
  const Pitch min = packed(trans_a, trans_b, M, N, K);
  DTK_REQUIRE(lda >= min.a && ldb >= min.b && ldc >= min.c, UsageError,
              "gemm_ld: a row pitch is below its matrix's row width");
  if (M == 0 || N == 0) return;
  gemm_pitched(trans_a, trans_b, M, N, K, alpha, A, B, beta, C, Pitch{lda, ldb, ldc}, ab_dtype, c_dtype, stream);
}

void linear_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC, int OC, int ld_out,
                    DType dtype, cudaStream_t stream) {
  DTK_REQUIRE(N >= 0 && IC > 0 && OC > 0, UsageError, "linear: sizes must be positive");
  DTK_REQUIRE(ld_out >= OC, UsageError, "linear_forward: the output's row pitch is below its width");
  if (N == 0) return;
  const Epi epi = bias ? Epi::BIAS : Epi::DEFAULT;
  const Problem p =
      problem_for(false, true, N, OC, IC, inp, weight, out, Pitch{IC, IC, ld_out}, dtype, dtype, epi, bias, nullptr);
  matmul_run(p, 1.0f, inp, weight, 0.0f, out, bias, nullptr, stream);
}

void linear_gelu_forward(void* out, void* pre_gelu, const void* inp, const void* weight, const void* bias, int N,
                         int IC, int OC, DType dtype, cudaStream_t stream) {
  DTK_REQUIRE(N >= 0 && IC > 0 && OC > 0, UsageError, "linear: sizes must be positive");
  DTK_REQUIRE(OC % 8 == 0, UsageError, "linear_gelu_forward: cuBLASLt's GELU auxiliary output needs OC % 8 == 0");
  if (N == 0) return;
  const Epi epi = bias ? Epi::GELU_AUX_BIAS : Epi::GELU_AUX;
  const Problem p = problem_for(false, true, N, OC, IC, inp, weight, out, packed(false, true, N, OC, IC), dtype, dtype,
                                epi, bias, pre_gelu);
  matmul_run(p, 1.0f, inp, weight, 0.0f, out, bias, pre_gelu, stream);
}

namespace {
// dweight += dout^T @ inp and dbias += sum_rows(dout), the parameter half of a linear
// backward (dout's rows ld_dout apart). BGRADB writes (never accumulates) its vector, so
// the dW GEMM leaves the bias gradient in an OC-float scratch that one add folds into dbias.
void weight_grads(float* dweight, float* dbias, const void* dout, int ld_dout, const void* inp, int N, int IC, int OC,
                  DType dtype, cudaStream_t stream) {
  const Pitch ld{ld_dout, IC, IC};
  bool bias_done = false;
  if (dweight) {
    if (dbias) {
      Scratch tmp(static_cast<size_t>(OC) * sizeof(float), stream);
      const Problem p = problem_for(true, false, OC, IC, N, dout, inp, dweight, ld, dtype, DType::F32, Epi::BGRADB,
                                    tmp.as<float>(), nullptr);
      if (matmul_try(p, 1.0f, dout, inp, 1.0f, dweight, tmp.as<float>(), nullptr, stream)) {
        add_f32(dbias, tmp.as<float>(), static_cast<size_t>(OC), stream);
        bias_done = true;
      }
    }
    if (!bias_done) gemm_pitched(true, false, OC, IC, N, 1.0f, dout, inp, 1.0f, dweight, ld, dtype, DType::F32, stream);
  }
  if (dbias && !bias_done) column_sum_accumulate(dbias, dout, N, OC, ld_dout, dtype, stream);
}
}  // namespace

void linear_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight,
                     int N, int IC, int OC, int ld_dout, bool accumulate_dinp, DType dtype, cudaStream_t stream) {
  DTK_REQUIRE(N >= 0 && IC > 0 && OC > 0, UsageError, "linear: sizes must be positive");
  DTK_REQUIRE(ld_dout >= OC, UsageError, "linear_backward: dout's row pitch is below its width");
  if (N == 0) return;
  if (dinp)
    gemm_pitched(false, false, N, IC, OC, 1.0f, dout, weight, accumulate_dinp ? 1.0f : 0.0f, dinp,
                 Pitch{ld_dout, IC, IC}, dtype, dtype, stream);
  weight_grads(dweight, dbias, dout, ld_dout, inp, N, IC, OC, dtype, stream);
}

void linear_dgelu_backward(void* dpre, float* dweight, float* dbias, const void* dout, const void* inp,
                           const void* weight, const void* pre_gelu, int N, int IC, int OC, DType dtype,
                           cudaStream_t stream) {
  DTK_REQUIRE(N >= 0 && IC > 0 && OC > 0, UsageError, "linear: sizes must be positive");
  DTK_REQUIRE(IC % 8 == 0, UsageError, "linear_dgelu_backward: cuBLASLt's GELU input (aux) needs IC % 8 == 0");
  if (N == 0) return;
  // dpre[N,IC] = gelu'(pre_gelu) * (dout[N,OC] @ weight[OC,IC]): beta = 0, the epilogue
  // reads pre_gelu with dpre's leading dimension.
  const Problem p = problem_for(false, false, N, IC, OC, dout, weight, dpre, packed(false, false, N, IC, OC), dtype,
                                dtype, Epi::DGELU, nullptr, pre_gelu);
  matmul_run(p, 1.0f, dout, weight, 0.0f, dpre, nullptr, pre_gelu, stream);
  weight_grads(dweight, dbias, dout, OC, inp, N, IC, OC, dtype, stream);
}

}  // namespace dtrain::kernels
