// CUDA execution engine: the cuBLASLt subset (include/cublasLt.h). Descriptors are plain
// host structs; the heuristic offers several algorithms per problem, each bound to it
// (cublasLtMatmulAlgoCheck); cublasLtMatmul validates everything a GPU run depends on, then
// enqueues a CPU GEMM (fp32 accumulation, k ascending per element, deterministic, the same
// for every algorithm) on the stream.
// Restrictions NVIDIA documents are quoted where they are enforced.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_emu_trace.h>
#include <cuda_fp16.h>

#include "engine.h"

// NVIDIA: "a cuBLASLt handle is not tied to any particular CUDA context", so it holds nothing.
struct cublasLtContext {
  int unused = 0;
};

struct cublasLtMatmulDescOpaque_t {
  int32_t compute = CUBLAS_COMPUTE_32F;
  int32_t scale = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int64_t aux_batch_stride = 0;
  int32_t aux_type = -1;
  int32_t bias_type = -1;
};

struct cublasLtMatrixLayoutOpaque_t {
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t batch_offset = 0;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint32_t search_mode = 0;
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: NVIDIA's documented defaults
};

namespace {

using cuda_emu::Alloc;

// ----------------------------------------------------------------------------
// Live objects: a destroyed or made-up handle is reported instead of dereferenced.
std::mutex g_live_mu;
std::unordered_set<const void*>& live() {
  static auto* s = new std::unordered_set<const void*>();
  return *s;
}
template <typename T>
T* object_new() {
  T* p = new T();
  std::lock_guard<std::mutex> lock(g_live_mu);
  live().insert(p);
  return p;
}
bool object_live(const void* p) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return p && live().count(p);
}
template <typename T>
cublasStatus_t object_delete(T* p, cublasStatus_t if_unknown) {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    if (!live().erase(p)) return if_unknown;
  }
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t fail(cublasStatus_t s, const std::string& why) {
  std::fprintf(stderr, "cuda_emu cublasLt: %s\n", why.c_str());
  return s;
}

// ----------------------------------------------------------------------------
// Attribute storage: where each attribute lives and the size SetAttribute must match.
struct Field {
  void* p = nullptr;
  size_t size = 0;
};
template <typename V>
Field field(V& v) {
  return Field{&v, sizeof v};
}

Field desc_field(cublasLtMatmulDescOpaque_t& d, cublasLtMatmulDescAttributes_t a) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return field(d.compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return field(d.scale);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return field(d.pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA: return field(d.transa);
    case CUBLASLT_MATMUL_DESC_TRANSB: return field(d.transb);
    case CUBLASLT_MATMUL_DESC_TRANSC: return field(d.transc);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return field(d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return field(d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return field(d.bias_batch_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return field(d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return field(d.aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return field(d.aux_batch_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return field(d.aux_type);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return field(d.bias_type);
  }
  return Field{};
}

Field layout_field(cublasLtMatrixLayoutOpaque_t& l, cublasLtMatrixLayoutAttribute_t a) {
  switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return field(l.type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return field(l.order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return field(l.rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return field(l.cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return field(l.ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return field(l.batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return field(l.batch_offset);
  }
  return Field{};
}

Field pref_field(cublasLtMatmulPreferenceOpaque_t& p, cublasLtMatmulPreferenceAttributes_t a) {
  switch (a) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return field(p.search_mode);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return field(p.max_workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return field(p.align[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return field(p.align[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return field(p.align[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return field(p.align[3]);
  }
  return Field{};
}

cublasStatus_t field_set(Field f, const void* buf, size_t size, const char* what) {
  if (!f.p) return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(what) + ": attribute not implemented by cuda_emu");
  // NVIDIA: INVALID_VALUE "if buf is NULL or sizeInBytes doesn't match size of internal
  // storage for selected attribute".
  if (!buf || size != f.size)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(what) + ": buffer is null or sizeInBytes " +
                                                 std::to_string(size) + " != " + std::to_string(f.size));
  std::memcpy(f.p, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t field_get(Field f, void* buf, size_t size, size_t* written, const char* what) {
  if (!f.p) return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(what) + ": attribute not implemented by cuda_emu");
  if (size == 0) {  // a size query
    if (!written) return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(what) + ": size 0 and sizeWritten null");
    *written = f.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf || size != f.size)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(what) + ": buffer is null or sizeInBytes " +
                                                 std::to_string(size) + " != " + std::to_string(f.size));
  std::memcpy(buf, f.p, size);
  if (written) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// Data types.
size_t type_size(int t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

const char* type_name(int t) {
  switch (t) {
    case CUDA_R_32F: return "R_32F";
    case CUDA_R_16F: return "R_16F";
    case CUDA_R_16BF: return "R_16BF";
    default: return "unsupported type";
  }
}

inline float to_f32(float v) { return v; }
inline float to_f32(__half v) { return __half2float(v); }
inline float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
T from_f32(float v);
template <>
float from_f32<float>(float v) {
  return v;
}
template <>
__half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls f with a value of the storage type of t (one of the three this subset supports).
template <typename F>
void with_type(int t, F&& f) {
  switch (t) {
    case CUDA_R_16F: f(__half{}); break;
    case CUDA_R_16BF: f(__nv_bfloat16{}); break;
    default: f(0.0f); break;
  }
}

using Load = float (*)(const void*, size_t);
using Store = void (*)(void*, size_t, float);
template <typename T>
float load_as(const void* base, size_t i) {
  return to_f32(static_cast<const T*>(base)[i]);
}
template <typename T>
void store_as(void* base, size_t i, float v) {
  static_cast<T*>(base)[i] = from_f32<T>(v);
}
Load loader(int t) {
  Load l = nullptr;
  with_type(t, [&](auto tag) { l = &load_as<decltype(tag)>; });
  return l;
}
Store storer(int t) {
  Store s = nullptr;
  with_type(t, [&](auto tag) { s = &store_as<decltype(tag)>; });
  return s;
}

// ----------------------------------------------------------------------------
// The problem a descriptor set describes, checked once for the heuristic and again for
// the call (which must not trust an algo chosen for something else).
struct Shape {
  int type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
  bool operator==(const Shape&) const = default;
};

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  Shape a, b, c, d;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool bias_add = false, relu = false, gelu = false, aux_out = false, dgelu = false;
  bool bgrad_d = false, bgrad_a = false, bgrad_b = false;  // bias gradient from D rows / op(A) / op(B)
  int64_t aux_ld = 0;
  bool device_scalars = false;
  bool uses_bias() const { return bias_add || bgrad_d || bgrad_a || bgrad_b; }
  bool uses_aux() const { return aux_out || dgelu; }
  int64_t bias_len() const { return bgrad_b ? n : m; }
};

struct Verdict {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  std::string why;
};
Verdict refuse(cublasStatus_t s, std::string why) { return Verdict{s, std::move(why)}; }

Shape shape_of(const cublasLtMatrixLayoutOpaque_t& l) {
  return Shape{static_cast<int>(l.type), static_cast<int64_t>(l.rows), static_cast<int64_t>(l.cols), l.ld};
}

// for_call: the aux restrictions NVIDIA states as cublasLtMatmul errors become
// INVALID_VALUE; for the heuristic they mean "no algorithm" (NOT_SUPPORTED).
Verdict problem_check(const cublasLtMatmulDescOpaque_t& dd, const cublasLtMatrixLayoutOpaque_t* const lay[4],
                      bool for_call, Problem* out) {
  Problem p;
  const char* names[4] = {"A", "B", "C", "D"};
  const cublasStatus_t unsupported = CUBLAS_STATUS_NOT_SUPPORTED, invalid = CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t aux_status = for_call ? invalid : unsupported;

  // cublasLtMatmul, "Datatypes Supported", table 1 (regular column-major matrices),
  // rows for computeType CUBLAS_COMPUTE_32F[_PEDANTIC] with scaleType CUDA_R_32F:
  // Atype/Btype 16BF -> Ctype 16BF or 32F, 16F -> 16F or 32F, 32F -> 32F (the bias
  // type column equals Ctype in each of these rows). TF32/FAST modes, 16F/64F/32I
  // compute are outside this subset.
  if (dd.compute != CUBLAS_COMPUTE_32F && dd.compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return refuse(unsupported, "compute type " + std::to_string(dd.compute) +
                                   " not implemented (only CUBLAS_COMPUTE_32F[_PEDANTIC])");
  if (dd.scale != CUDA_R_32F) return refuse(unsupported, "scale type must be CUDA_R_32F with CUBLAS_COMPUTE_32F");
  for (int i = 0; i < 4; ++i) {
    const auto& l = *lay[i];
    if (type_size(static_cast<int>(l.type)) == 0)
      return refuse(unsupported, std::string(names[i]) + ": data type " + std::to_string(l.type) + " not implemented");
    // Row order is a documented cuBLASLt feature this subset does not implement;
    // NVIDIA's footnote 6 also rules out every epilogue with a row-major D.
    if (l.order != CUBLASLT_ORDER_COL)
      return refuse(unsupported, std::string(names[i]) + ": only CUBLASLT_ORDER_COL is implemented");
    if (l.batch != 1) return refuse(unsupported, std::string(names[i]) + ": batched matmul is not implemented");
    // cublasLtMatrixLayoutAttribute_t: rows/cols "Normally only values that can be
    // expressed as int32_t are supported".
    if (l.rows > INT32_MAX || l.cols > INT32_MAX)
      return refuse(unsupported, std::string(names[i]) + ": rows/cols beyond int32_t");
  }
  p.a = shape_of(*lay[0]);
  p.b = shape_of(*lay[1]);
  p.c = shape_of(*lay[2]);
  p.d = shape_of(*lay[3]);
  if (p.a.type != p.b.type)
    return refuse(unsupported, std::string("A and B types differ (") + type_name(p.a.type) + ", " +
                                   type_name(p.b.type) + "): no such row in NVIDIA's table");
  // "out-of-place matrix multiplication (C != D, both matrices must have the same data type ...)"
  if (p.c.type != p.d.type) return refuse(unsupported, "C and D types differ");
  if (p.d.type != p.a.type && p.d.type != CUDA_R_32F)
    return refuse(unsupported, std::string("A/B ") + type_name(p.a.type) + " with C/D " + type_name(p.d.type) +
                                   ": no such row in NVIDIA's table");

  auto op_ok = [](int32_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
  if (!op_ok(dd.transa) || !op_ok(dd.transb)) return refuse(invalid, "TRANSA/TRANSB is not a cublasOperation_t");
  // Real data: the conjugate transpose is the transpose.
  p.ta = dd.transa != CUBLAS_OP_N;
  p.tb = dd.transb != CUBLAS_OP_N;
  // CUBLASLT_MATMUL_DESC_TRANSC: "Currently only CUBLAS_OP_N is supported."
  if (dd.transc != CUBLAS_OP_N) return refuse(unsupported, "TRANSC must be CUBLAS_OP_N");
  if (dd.pointer_mode != CUBLASLT_POINTER_MODE_HOST && dd.pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
    return refuse(unsupported, "only CUBLASLT_POINTER_MODE_HOST and _DEVICE are implemented");
  p.device_scalars = dd.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;

  // Shapes: op(A) is m x k, op(B) k x n, C and D m x n.
  p.m = p.d.rows;
  p.n = p.d.cols;
  p.k = p.ta ? p.a.rows : p.a.cols;
  const int64_t am = p.ta ? p.a.cols : p.a.rows;
  const int64_t bk = p.tb ? p.b.cols : p.b.rows, bn = p.tb ? p.b.rows : p.b.cols;
  if (am != p.m || bk != p.k || bn != p.n || p.c.rows != p.m || p.c.cols != p.n)
    return refuse(invalid, "shapes do not match: op(A) " + std::to_string(am) + "x" + std::to_string(p.k) + ", op(B) " +
                               std::to_string(bk) + "x" + std::to_string(bn) + ", C " + std::to_string(p.c.rows) + "x" +
                               std::to_string(p.c.cols) + ", D " + std::to_string(p.m) + "x" + std::to_string(p.n));
  // CUBLASLT_MATRIX_LAYOUT_LD: "Currently only non-negative values are supported ... must
  // be ... greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of CUBLASLT_ORDER_COL".
  // cublasLtMatmul: "the leading dimension of C can be 0 to achieve row or column
  // broadcast" (out of place only, checked with the pointers).
  for (int i = 0; i < 4; ++i) {
    const Shape& s = i == 0 ? p.a : i == 1 ? p.b : i == 2 ? p.c : p.d;
    const bool broadcast_c = i == 2 && s.ld == 0;
    if (!broadcast_c && s.ld < std::max<int64_t>(1, s.rows))
      return refuse(invalid, std::string(names[i]) + ": leading dimension " + std::to_string(s.ld) + " < rows " +
                                 std::to_string(s.rows));
  }

  p.epilogue = dd.epilogue;
  switch (dd.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_RELU: p.relu = true; break;
    case CUBLASLT_EPILOGUE_BIAS: p.bias_add = true; break;
    case CUBLASLT_EPILOGUE_RELU_BIAS: p.relu = p.bias_add = true; break;
    case CUBLASLT_EPILOGUE_GELU: p.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: p.gelu = p.aux_out = true; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: p.gelu = p.bias_add = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: p.gelu = p.aux_out = p.bias_add = true; break;
    case CUBLASLT_EPILOGUE_DGELU: p.dgelu = true; break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: p.dgelu = p.bgrad_d = true; break;
    case CUBLASLT_EPILOGUE_BGRADA: p.bgrad_a = true; break;
    case CUBLASLT_EPILOGUE_BGRADB: p.bgrad_b = true; break;
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
      return refuse(unsupported, "ReLU bit-mask epilogues are not implemented by cuda_emu");
    default: return refuse(invalid, "EPILOGUE " + std::to_string(dd.epilogue) + " is not a cublasLtEpilogue_t");
  }
  // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: "If unset (or set to the default value of -1),
  // the bias vector elements are the same type as the elements of the output matrix"; the
  // exceptions are IMMA and FP8 kernels, and table 1 lists bias type == Ctype for every
  // combination here.
  if (p.uses_bias() && dd.bias_type != -1 && dd.bias_type != p.d.type)
    return refuse(unsupported, std::string("bias data type ") + type_name(dd.bias_type) + " with D " +
                                   type_name(p.d.type) + ": NVIDIA's table allows only the D type");
  if (p.uses_aux()) {
    // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: non-default only for FP8 outputs;
    // "Otherwise, the data type should be left unset or set to the default value of -1.
    // If set for an unsupported ... combination, calling cublasLtMatmul() will return
    // CUBLAS_INVALID_VALUE."
    if (dd.aux_type != -1) return refuse(aux_status, "EPILOGUE_AUX_DATA_TYPE may only be set for FP8 kernels");
    // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, GELU input matrix: "Must be divisible by 8 and
    // be no less than the number of rows in the output matrix." (GELU_AUX writes the same
    // matrix as GELU_AUX_BIAS.)
    if (dd.aux_ld % 8 != 0 || dd.aux_ld < std::max<int64_t>(1, p.m))
      return refuse(aux_status, "EPILOGUE_AUX_LD " + std::to_string(dd.aux_ld) +
                                    " must be divisible by 8 and >= rows of D (" + std::to_string(p.m) + ")");
    p.aux_ld = dd.aux_ld;
  }
  *out = p;
  return Verdict{};
}

// ----------------------------------------------------------------------------
// Algorithms: what the heuristic promised, so cublasLtMatmul can hold the caller to it.
// The heuristic offers ALGO_CANDIDATES distinct algorithms per problem (each its own id
// and tile configuration; all compute the same result, bit for bit). Stricter than a GPU,
// where an algo may serve other shapes too: each algo is bound to the problem it was
// returned for (shape, transposes, types, epilogue), and a checksum over its bytes makes
// a damaged or hand-made one INVALID_VALUE (cublasLtMatmulAlgoCheck says the same).
constexpr uint64_t ALGO_MAGIC = 0x4f474c41554d45ull;  // "EMUALGO"
constexpr int ALGO_CANDIDATES = 4;
// Tile rows << 16 | tile columns of each candidate: a label the algo carries, as a GPU
// algo's CUBLASLT_ALGO_CONFIG_TILE_ID does; the engine runs one kernel for all of them.
constexpr uint64_t ALGO_TILES[ALGO_CANDIDATES] = {64u << 16 | 4u, 32u << 16 | 8u, 128u << 16 | 2u, 16u << 16 | 16u};

uint32_t align_of(const void* p) {  // largest power of two dividing p, at most 256
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return static_cast<uint32_t>(std::min<uintptr_t>(low, 256));
}

uint64_t algo_fingerprint(const Problem& p) {
  return static_cast<uint64_t>(p.epilogue) | static_cast<uint64_t>(p.a.type) << 32 |
         static_cast<uint64_t>(p.d.type) << 40;
}

uint64_t fnv1a(const uint64_t* words, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i)
    for (int b = 0; b < 8; ++b) h = (h ^ ((words[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  return h;
}

// The problem an algo was returned for: sizes, transposes, the four types, the epilogue.
uint64_t algo_signature(const Problem& p) {
  const uint64_t w[] = {static_cast<uint64_t>(p.m),
                        static_cast<uint64_t>(p.n),
                        static_cast<uint64_t>(p.k),
                        static_cast<uint64_t>(p.ta) | static_cast<uint64_t>(p.tb) << 1,
                        static_cast<uint64_t>(p.a.type) | static_cast<uint64_t>(p.b.type) << 16 |
                            static_cast<uint64_t>(p.c.type) << 32 | static_cast<uint64_t>(p.d.type) << 48,
                        p.epilogue};
  return fnv1a(w, sizeof w / sizeof w[0]);
}

// data[0] magic; data[1] promised alignments of A, B, C, D (16 bits each); data[2] of bias
// and aux, which NVIDIA's heuristic reads from the descriptor ("Routines that don't
// dereference this pointer, like cublasLtMatmulAlgoGetHeuristic() depend on its value to
// determine expected pointer alignment"); data[3] epilogue and types; data[4] the
// candidate (algo id); data[5] its tile; data[6] the problem's signature; data[7] checksum.
cublasLtMatmulAlgo_t algo_make(const Problem& p, const uint32_t align[4], const cublasLtMatmulDescOpaque_t& dd,
                               int candidate = 0) {
  cublasLtMatmulAlgo_t algo{};
  algo.data[0] = ALGO_MAGIC;
  for (int i = 0; i < 4; ++i) algo.data[1] |= static_cast<uint64_t>(std::min<uint32_t>(align[i], 0xffff)) << (16 * i);
  algo.data[2] = align_of(dd.bias) | static_cast<uint64_t>(align_of(dd.aux)) << 16;
  algo.data[3] = algo_fingerprint(p);
  algo.data[4] = static_cast<uint64_t>(candidate);
  algo.data[5] = ALGO_TILES[candidate];
  algo.data[6] = algo_signature(p);
  algo.data[7] = fnv1a(algo.data, 7);
  return algo;
}
uint32_t algo_align(const cublasLtMatmulAlgo_t& algo, int slot) {  // 0..3 A..D, 4 bias, 5 aux
  const uint64_t w = slot < 4 ? algo.data[1] >> (16 * slot) : algo.data[2] >> (16 * (slot - 4));
  return static_cast<uint32_t>(w & 0xffff);
}

// NVIDIA (cublasLtMatmulAlgoCheck): INVALID_VALUE "if matrix layout descriptors or the
// operation descriptor do not match the algo descriptor"; cublasLtMatmul answers the same.
Verdict algo_check(const Problem& p, const cublasLtMatmulAlgo_t& algo) {
  const cublasStatus_t invalid = CUBLAS_STATUS_INVALID_VALUE;
  if (algo.data[0] != ALGO_MAGIC || algo.data[7] != fnv1a(algo.data, 7))
    return refuse(invalid, "algo is not one cublasLtMatmulAlgoGetHeuristic returned (damaged or made up)");
  if (algo.data[4] >= ALGO_CANDIDATES || algo.data[5] != ALGO_TILES[algo.data[4]])
    return refuse(invalid, "algo id " + std::to_string(algo.data[4]) + " is not an algorithm of this library");
  if (algo.data[3] != algo_fingerprint(p))
    return refuse(invalid, "algo was not returned by the heuristic for this epilogue and these types");
  if (algo.data[6] != algo_signature(p))
    return refuse(invalid, "algo was returned for another problem (shape, transposes, types or epilogue)");
  return Verdict{};
}

// ----------------------------------------------------------------------------
// Execution.
constexpr int64_t TILE_I = 64;  // rows per accumulator tile (a vectorisable fixed length)
constexpr int64_t TILE_J = 4;   // columns sharing one pass over the A tile

struct Job {
  Problem p;
  const void *a = nullptr, *b = nullptr, *c = nullptr;
  void* d = nullptr;
  const void* bias_in = nullptr;
  void* bias_out = nullptr;
  void* aux = nullptr;
  float alpha = 1, beta = 0;
  const float *alpha_dev = nullptr, *beta_dev = nullptr;
};

inline float gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}
inline float gelu_grad(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

// op(A) as fp32, column-major m x k with the row count padded to mp (zeros).
std::vector<float> pack_a(const Job& j, int64_t mp) {
  const Problem& p = j.p;
  std::vector<float> out(std::max<size_t>(1, static_cast<size_t>(mp * p.k)), 0.0f);  // never empty: k may be 0
  with_type(p.a.type, [&](auto tag) {
    using T = decltype(tag);
    const T* a = static_cast<const T*>(j.a);
    // Loop order follows A's storage so the reads are contiguous.
    if (!p.ta) {
      for (int64_t kk = 0; kk < p.k; ++kk)
        for (int64_t i = 0; i < p.m; ++i) out[kk * mp + i] = to_f32(a[i + kk * p.a.ld]);
    } else {
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t kk = 0; kk < p.k; ++kk) out[kk * mp + i] = to_f32(a[kk + i * p.a.ld]);
    }
  });
  return out;
}

// op(B) as fp32, one k-vector per column, columns padded to np (zeros).
std::vector<float> pack_b(const Job& j, int64_t np) {
  const Problem& p = j.p;
  std::vector<float> out(std::max<size_t>(1, static_cast<size_t>(np * p.k)), 0.0f);
  with_type(p.b.type, [&](auto tag) {
    using T = decltype(tag);
    const T* b = static_cast<const T*>(j.b);
    if (!p.tb) {
      for (int64_t col = 0; col < p.n; ++col)
        for (int64_t kk = 0; kk < p.k; ++kk) out[col * p.k + kk] = to_f32(b[kk + col * p.b.ld]);
    } else {
      for (int64_t kk = 0; kk < p.k; ++kk)
        for (int64_t col = 0; col < p.n; ++col) out[col * p.k + kk] = to_f32(b[col + kk * p.b.ld]);
    }
  });
  return out;
}

// acc[jj][i] = sum over kk ascending of a[kk][i] * b[jj][kk]: every element accumulates
// in k order (deterministic), the i loop has a fixed length the compiler vectorises.
void tile_accumulate(const float* a, int64_t mp, const float* b, int64_t k, float (&acc)[TILE_J][TILE_I]) {
  for (auto& row : acc)
    for (float& v : row) v = 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* __restrict ak = a + kk * mp;
    for (int64_t jj = 0; jj < TILE_J; ++jj) {
      const float bv = b[jj * k + kk];
      float* __restrict c = acc[jj];
      for (int64_t i = 0; i < TILE_I; ++i) c[i] += ak[i] * bv;
    }
  }
}

void job_run(const Job& j) {
  const Problem& p = j.p;
  const float alpha = j.alpha_dev ? *j.alpha_dev : j.alpha;
  const float beta = j.beta_dev ? *j.beta_dev : j.beta;
  const int64_t m = p.m, n = p.n, k = p.k;
  const int64_t mp = (m + TILE_I - 1) / TILE_I * TILE_I;
  const int64_t groups = (n + TILE_J - 1) / TILE_J;
  const std::vector<float> ap = pack_a(j, mp);
  const std::vector<float> bp = pack_b(j, groups * TILE_J);

  const Store store_d = storer(p.d.type);  // D, aux and bias share D's type
  const Load load_d = loader(p.d.type);
  std::vector<float> bias(p.bias_add ? m : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(bias.size()); ++i) bias[i] = load_d(j.bias_in, i);
  std::vector<float> grad(p.bgrad_d ? static_cast<size_t>(m * n) : 0);  // DGELU output, fp32

  cuda_emu::parallel_for(static_cast<size_t>(groups), [&](size_t gb, size_t ge) {
    alignas(64) float acc[TILE_J][TILE_I];
    for (size_t g = gb; g < ge; ++g) {
      const int64_t j0 = static_cast<int64_t>(g) * TILE_J, jn = std::min(TILE_J, n - j0);
      for (int64_t i0 = 0; i0 < m; i0 += TILE_I) {
        tile_accumulate(ap.data() + i0, mp, bp.data() + j0 * k, k, acc);
        const int64_t in = std::min(TILE_I, m - i0);
        for (int64_t jj = 0; jj < jn; ++jj) {
          const int64_t col = j0 + jj;
          for (int64_t ii = 0; ii < in; ++ii) {
            const int64_t row = i0 + ii;
            float v = alpha * acc[jj][ii];
            if (beta != 0.0f) v += beta * load_d(j.c, static_cast<size_t>(row + col * p.c.ld));
            if (p.bias_add) v += bias[row];
            if (p.aux_out) store_d(j.aux, static_cast<size_t>(row + col * p.aux_ld), v);
            if (p.relu) v = std::max(v, 0.0f);
            if (p.gelu) v = gelu(v);
            if (p.dgelu) v *= gelu_grad(load_d(j.aux, static_cast<size_t>(row + col * p.aux_ld)));
            if (p.bgrad_d) grad[static_cast<size_t>(row + col * m)] = v;
            store_d(j.d, static_cast<size_t>(row + col * p.d.ld), v);
          }
        }
      }
    }
  });

  // Bias gradients overwrite the bias vector; sums run in ascending index order.
  if (p.bgrad_d) {
    for (int64_t row = 0; row < m; ++row) {
      float s = 0.0f;
      for (int64_t col = 0; col < n; ++col) s += grad[static_cast<size_t>(row + col * m)];
      store_d(j.bias_out, static_cast<size_t>(row), s);
    }
  } else if (p.bgrad_a) {
    std::vector<float> s(static_cast<size_t>(m), 0.0f);
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t row = 0; row < m; ++row) s[row] += ap[static_cast<size_t>(kk * mp + row)];
    for (int64_t row = 0; row < m; ++row) store_d(j.bias_out, static_cast<size_t>(row), s[row]);
  } else if (p.bgrad_b) {
    for (int64_t col = 0; col < n; ++col) {
      float s = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) s += bp[static_cast<size_t>(col * k + kk)];
      store_d(j.bias_out, static_cast<size_t>(col), s);
    }
  }
}

// ----------------------------------------------------------------------------
// Call-time pointer validation.
size_t extent_bytes(const Shape& s, int64_t ld) {
  if (s.rows == 0 || s.cols == 0) return 0;
  return static_cast<size_t>((s.cols - 1) * ld + s.rows) * type_size(s.type);
}

struct Range {
  const char* name;
  const char* lo;
  size_t bytes;
  bool overlaps(const Range& o) const { return bytes && o.bytes && lo < o.lo + o.bytes && o.lo < lo + bytes; }
};

// The operation touches [p, p + bytes): it must be device memory of `device`, aligned to
// the element size and to what the algorithm was chosen for.
Verdict pointer_check(const char* name, const void* ptr, size_t bytes, size_t elem, uint32_t promised, int device,
                      const char* promise =
                          "the algo was chosen for (set CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES "
                          "or the descriptor's pointer before the heuristic)") {
  if (!ptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(name) + " is null");
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  char buf[256];
  if (a % elem != 0) {
    std::snprintf(buf, sizeof buf, "%s=%p is not aligned to its %zu-byte elements", name, ptr, elem);
    return refuse(CUBLAS_STATUS_INVALID_VALUE, buf);
  }
  if (promised > 1 && a % promised != 0) {
    std::snprintf(buf, sizeof buf, "%s=%p is not aligned to the %u bytes %s", name, ptr, promised, promise);
    return refuse(CUBLAS_STATUS_INVALID_VALUE, buf);
  }
  if (bytes == 0) return Verdict{};
  const std::optional<Alloc> al = cuda_emu::alloc_find(ptr, bytes);
  if (!al || al->pinned_host || al->device != device) {
    std::snprintf(buf, sizeof buf, "%s=[%p, +%zu bytes) is not inside one live device allocation of device %d", name,
                  ptr, bytes, device);
    return refuse(CUBLAS_STATUS_INVALID_VALUE, buf);
  }
  return Verdict{};
}

Verdict call_check(const Problem& p, const cublasLtMatmulDescOpaque_t& dd, const cublasLtMatmulAlgo_t& algo,
                   const void* alpha, const void* beta, const void* A, const void* B, const void* C, void* D,
                   void* workspace, size_t workspace_bytes, int device, Job* job) {
  const cublasStatus_t invalid = CUBLAS_STATUS_INVALID_VALUE;
  if (Verdict v = algo_check(p, algo); v.status) return v;
  if (!alpha || !beta) return refuse(invalid, "alpha or beta is null");
  Job j;
  j.p = p;
  bool beta_zero = false;
  if (p.device_scalars) {
    if (Verdict v = pointer_check("alpha", alpha, 4, 4, 1, device); v.status) return v;
    if (Verdict v = pointer_check("beta", beta, 4, 4, 1, device); v.status) return v;
    j.alpha_dev = static_cast<const float*>(alpha);
    j.beta_dev = static_cast<const float*>(beta);
  } else {
    j.alpha = *static_cast<const float*>(alpha);
    j.beta = *static_cast<const float*>(beta);
    beta_zero = j.beta == 0.0f;
  }

  const size_t ab_elem = type_size(p.a.type), d_elem = type_size(p.d.type);
  const size_t a_bytes = extent_bytes(p.a, p.a.ld), b_bytes = extent_bytes(p.b, p.b.ld);
  const size_t d_bytes = extent_bytes(p.d, p.d.ld);
  const size_t c_bytes = p.c.ld == 0 ? extent_bytes(Shape{p.c.type, p.c.rows, 1, 0}, 0) : extent_bytes(p.c, p.c.ld);
  if (Verdict v = pointer_check("A", A, a_bytes, ab_elem, algo_align(algo, 0), device); v.status) return v;
  if (Verdict v = pointer_check("B", B, b_bytes, ab_elem, algo_align(algo, 1), device); v.status) return v;
  if (Verdict v = pointer_check("D", D, d_bytes, d_elem, algo_align(algo, 3), device); v.status) return v;
  // With a zero host beta C is never read (it may be anything, even null).
  if (C || !beta_zero)
    if (Verdict v = pointer_check("C", C, beta_zero ? 0 : c_bytes, d_elem, algo_align(algo, 2), device); v.status)
      return v;
  // "in-place matrix multiplication (C == D and Cdesc == Ddesc)"
  if (C == D && !(p.c == p.d)) return refuse(invalid, "C == D requires identical C and D layouts");
  std::vector<Range> inputs{{"A", static_cast<const char*>(A), a_bytes}, {"B", static_cast<const char*>(B), b_bytes}};
  std::vector<Range> outputs{{"D", static_cast<const char*>(D), d_bytes}};
  if (C != D && !beta_zero) inputs.push_back({"C", static_cast<const char*>(C), c_bytes});

  if (p.uses_bias()) {
    const size_t bytes = static_cast<size_t>(p.bias_len()) * d_elem;
    if (Verdict v = pointer_check("bias", dd.bias, bytes, d_elem, algo_align(algo, 4), device); v.status) return v;
    if (p.bias_add) {
      j.bias_in = dd.bias;
      inputs.push_back({"bias", static_cast<const char*>(dd.bias), bytes});
    } else {
      j.bias_out = const_cast<void*>(dd.bias);
      outputs.push_back({"bias", static_cast<const char*>(dd.bias), bytes});
    }
  }
  if (p.uses_aux()) {
    const size_t bytes = extent_bytes(p.d, p.aux_ld);
    if (Verdict v = pointer_check("aux", dd.aux, bytes, d_elem, algo_align(algo, 5), device); v.status) return v;
    j.aux = dd.aux;
    (p.aux_out ? outputs : inputs).push_back({"aux", static_cast<const char*>(dd.aux), bytes});
  }
  // A GPU computing an output while it overwrites an input, or two outputs into the same
  // memory, races: the result would depend on the kernel's tiling.
  for (size_t o = 0; o < outputs.size(); ++o) {
    for (const Range& in : inputs)
      if (outputs[o].overlaps(in)) return refuse(invalid, std::string(outputs[o].name) + " overlaps input " + in.name);
    for (size_t q = o + 1; q < outputs.size(); ++q)
      if (outputs[o].overlaps(outputs[q]))
        return refuse(invalid, std::string(outputs[o].name) + " overlaps output " + outputs[q].name);
  }
  // cublasLtMatmul: "The workspace pointer must be aligned to at least a multiple of 256
  // bytes"; the algorithms here need no workspace, so any size will do.
  if (workspace) {
    if (Verdict v = pointer_check("workspace", workspace, workspace_bytes, 1, 256, device, "cublasLtMatmul requires");
        v.status)
      return v;
  } else if (workspace_bytes) {
    return refuse(invalid, "workspace is null but workspaceSizeInBytes is " + std::to_string(workspace_bytes));
  }
  j.a = A;
  j.b = B;
  j.c = C;
  j.d = D;
  *job = j;
  return Verdict{};
}

}  // namespace

// ----------------------------------------------------------------------------
// Status strings and version.
const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was passed";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "the device does not support the operation";
    case CUBLAS_STATUS_MAPPING_ERROR: return "access to GPU memory failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the configuration is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
  }
  return "unknown status";
}

size_t cublasLtGetVersion() { return 120800; }  // reports itself as cuBLASLt 12.8.0

// ----------------------------------------------------------------------------
// Handles and descriptors.
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: handle is null");
  *handle = object_new<cublasLtContext>();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtDestroy: handle is null");
  return object_delete(handle, CUBLAS_STATUS_NOT_INITIALIZED);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  if (!desc) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: desc is null");
  *desc = object_new<cublasLtMatmulDescOpaque_t>();
  (*desc)->compute = compute_type;
  (*desc)->scale = scale_type;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (!desc) return CUBLAS_STATUS_SUCCESS;
  return object_delete(desc, CUBLAS_STATUS_INVALID_VALUE);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (!object_live(desc)) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute: unknown descriptor");
  return field_set(desc_field(*desc, attr), buf, size, "MatmulDescSetAttribute");
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t size, size_t* size_written) {
  if (!object_live(desc)) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescGetAttribute: unknown descriptor");
  return field_get(desc_field(*desc, attr), buf, size, size_written, "MatmulDescGetAttribute");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!layout) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: layout is null");
  *layout = object_new<cublasLtMatrixLayoutOpaque_t>();
  (*layout)->type = static_cast<uint32_t>(type);
  (*layout)->rows = rows;
  (*layout)->cols = cols;
  (*layout)->ld = ld;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (!layout) return CUBLAS_STATUS_SUCCESS;
  return object_delete(layout, CUBLAS_STATUS_INVALID_VALUE);
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (!object_live(layout)) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatrixLayoutSetAttribute: unknown layout");
  return field_set(layout_field(*layout, attr), buf, size, "MatrixLayoutSetAttribute");
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* size_written) {
  if (!object_live(layout)) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatrixLayoutGetAttribute: unknown layout");
  return field_get(layout_field(*layout, attr), buf, size, size_written, "MatrixLayoutGetAttribute");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: pref is null");
  *pref = object_new<cublasLtMatmulPreferenceOpaque_t>();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (!pref) return CUBLAS_STATUS_SUCCESS;
  return object_delete(pref, CUBLAS_STATUS_INVALID_VALUE);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (!object_live(pref)) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceSetAttribute: unknown preference");
  return field_set(pref_field(*pref, attr), buf, size, "MatmulPreferenceSetAttribute");
}

// ----------------------------------------------------------------------------
// Heuristic and matmul.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                              cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                              cublasLtMatmulPreference_t pref, int requested_count,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned_count) {
  if (!object_live(handle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "heuristic: handle not initialized");
  if (returned_count) *returned_count = 0;
  // NVIDIA: INVALID_VALUE "if requestedAlgoCount is less or equal to zero".
  if (requested_count <= 0 || !results || !returned_count)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "heuristic: requestedAlgoCount <= 0 or null result pointers");
  const cublasLtMatrixLayoutOpaque_t* lay[4] = {a_desc, b_desc, c_desc, d_desc};
  if (!object_live(desc) || !object_live(pref) || !object_live(a_desc) || !object_live(b_desc) ||
      !object_live(c_desc) || !object_live(d_desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "heuristic: unknown descriptor, layout or preference");
  Problem p;
  if (Verdict v = problem_check(*desc, lay, false, &p); v.status)
    return fail(v.status, "heuristic: no algorithm: " + v.why);
  // "heuristicResultsArray: Array containing the algorithm heuristics and associated
  // runtime characteristics, returned by this function, in the order of increasing
  // estimated compute time"; "returnAlgoCount: The number of heuristicResultsArray
  // elements written".
  const int count = std::min(requested_count, ALGO_CANDIDATES);
  for (int i = 0; i < count; ++i) {
    results[i] = cublasLtMatmulHeuristicResult_t{};
    results[i].algo = algo_make(p, pref->align, *desc, i);
    results[i].workspaceSize = 0;
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].wavesCount = 1.0f;
  }
  *returned_count = count;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                       cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                       const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  if (!object_live(handle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "algo check: handle not initialized");
  if (!algo || !result) return fail(CUBLAS_STATUS_INVALID_VALUE, "algo check: algo or result is null");
  const cublasLtMatrixLayoutOpaque_t* lay[4] = {a_desc, b_desc, c_desc, d_desc};
  if (!object_live(desc) || !object_live(a_desc) || !object_live(b_desc) || !object_live(c_desc) ||
      !object_live(d_desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "algo check: unknown descriptor or layout");
  // NOT_SUPPORTED "if the algo configuration or data type combination is not currently
  // supported on the given device": what the heuristic says for the descriptors.
  Problem p;
  if (Verdict v = problem_check(*desc, lay, false, &p); v.status) return fail(v.status, "algo check: " + v.why);
  if (Verdict v = algo_check(p, *algo); v.status) return fail(v.status, "algo check: " + v.why);
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = *algo;
  result->workspaceSize = 0;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a_desc, const void* B, cublasLtMatrixLayout_t b_desc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!object_live(handle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "matmul: handle not initialized");
  // "If Cdesc is omitted, this function assumes it to be equal to Ddesc."
  if (!c_desc) c_desc = d_desc;
  const cublasLtMatrixLayoutOpaque_t* lay[4] = {a_desc, b_desc, c_desc, d_desc};
  if (!object_live(desc) || !object_live(a_desc) || !object_live(b_desc) || !object_live(c_desc) ||
      !object_live(d_desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul: unknown descriptor or layout");
  Problem p;
  if (Verdict v = problem_check(*desc, lay, true, &p); v.status) return fail(v.status, "matmul: " + v.why);
  // "When NULL, an implicit heuristics query with default search preferences will be
  // performed" (alignment 256 for every matrix).
  const cublasLtMatmulPreferenceOpaque_t defaults;
  const cublasLtMatmulAlgo_t chosen = algo ? *algo : algo_make(p, defaults.align, *desc);
  const int device = cuda_emu::stream_device(stream);
  if (device < 0) return fail(CUBLAS_STATUS_EXECUTION_FAILED, "matmul: invalid stream");
  auto job = std::make_shared<Job>();
  if (Verdict v = call_check(p, *desc, chosen, alpha, beta, A, B, C, D, workspace, workspace_bytes, device, job.get());
      v.status)
    return fail(v.status, "matmul: " + v.why);
  const cudaError_t e = cuda_emu::enqueue(stream, "cublasLtMatmul", [job] { job_run(*job); });
  if (e != cudaSuccess)
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, std::string("matmul: enqueue failed: ") + cudaGetErrorName(e));
  cuda_emu::TraceMatmul t;
  t.m = p.m;
  t.n = p.n;
  t.k = p.k;
  t.transa = p.ta;
  t.transb = p.tb;
  t.a_type = p.a.type;
  t.b_type = p.b.type;
  t.c_type = p.c.type;
  t.d_type = p.d.type;
  t.epilogue = p.epilogue;
  t.alpha = p.device_scalars ? NAN : job->alpha;
  t.beta = p.device_scalars ? NAN : job->beta;
  t.batch = d_desc->batch;
  t.device = device;
  cuda_emu::trace_matmul(t);
  return CUBLAS_STATUS_SUCCESS;
}
