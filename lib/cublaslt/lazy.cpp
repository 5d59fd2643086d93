// The cuBLASLt entry points dtrain uses, each forwarding to the real one in a libcublasLt
// loaded on the first call (lazy.h says why). The definitions are checked against
// cublasLt.h's declarations: each forwarder's pointer type is decltype(&name), and a
// parameter list that differed from the header's would declare a second extern "C"
// function of the same name, which does not compile. This file is compiled with
// -fvisibility=hidden, so the executable exports none of these names and the loaded
// library's own calls between its functions never land here.
#include "cublaslt/lazy.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <fstream>
#include <string>
#include <type_traits>

#define DT_STR2(x) #x
#define DT_STR(x) DT_STR2(x)

namespace dtrain::cublaslt {
namespace {

// The file names tried, in order: the SONAME of the toolkit the build used (found through
// LD_LIBRARY_PATH, the binary's RUNPATH and the loader cache), then the same name in the
// toolkit's library directory at build time.
constexpr const char* kSoname = "libcublasLt.so." DT_STR(CUBLAS_VER_MAJOR);
#ifdef DTRAIN_CUBLASLT_BUILD_DIR
constexpr const char* kBuildDirPath = DTRAIN_CUBLASLT_BUILD_DIR "/libcublasLt.so." DT_STR(CUBLAS_VER_MAJOR);
#else
constexpr const char* kBuildDirPath = "";
#endif

struct Library {
  void* handle = nullptr;
  std::string error;  // empty while nothing failed
};

Library load() {
  Library l;
  for (const char* name : {kSoname, kBuildDirPath}) {
    if (!*name) continue;
    dlerror();
    // RTLD_LOCAL: its symbols resolve only through dlsym below, never for other objects.
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return {h, ""};
    const char* why = dlerror();
    if (!l.error.empty()) l.error += "; ";
    l.error += std::string(name) + ": " + (why ? why : "dlopen failed");
  }
  l.error = "cannot load cuBLASLt (" + l.error +
            "); install the CUDA toolkit's libcublasLt or put its directory on LD_LIBRARY_PATH";
  return l;
}

// Loaded once, on the first call from any thread (a function-local static).
const Library& lib() {
  static const Library l = load();
  return l;
}

void* symbol(const char* name) { return lib().handle ? dlsym(lib().handle, name) : nullptr; }

// A forwarder's answer when the library or the symbol is missing.
template <typename R>
R unavailable() {
  if constexpr (std::is_same_v<R, cublasStatus_t>) {
    return CUBLAS_STATUS_NOT_INITIALIZED;
  } else {
    return R{};
  }
}

}  // namespace

bool ensure_loaded() { return lib().handle != nullptr; }

std::string load_error() { return lib().error; }

bool mapped_in_process() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublasLt.so") != std::string::npos) return true;
  return false;
}

}  // namespace dtrain::cublaslt

// Each forwarder resolves its symbol once (a function-local static: thread-safe) and
// calls it; without the library it answers CUBLAS_STATUS_NOT_INITIALIZED.
#define DT_FORWARD(ret, name, params, args)                                                        \
  extern "C" ret name params {                                                                     \
    static const auto real = reinterpret_cast<decltype(&name)>(::dtrain::cublaslt::symbol(#name)); \
    if (!real) return ::dtrain::cublaslt::unavailable<ret>();                                      \
    return real args;                                                                              \
  }

DT_FORWARD(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h))
DT_FORWARD(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))
DT_FORWARD(size_t, cublasLtGetVersion, (void), ())
DT_FORWARD(cublasStatus_t, cublasLtMatmul,
           (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
            cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
            cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
            void* workspace, size_t workspace_bytes, cudaStream_t stream),
           (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspace_bytes, stream))
DT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutCreate,
           (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
           (layout, type, rows, cols, ld))
DT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
DT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
           (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t bytes),
           (layout, attr, buf, bytes))
DT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutGetAttribute,
           (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, void* buf, size_t bytes,
            size_t* written),
           (layout, attr, buf, bytes, written))
DT_FORWARD(cublasStatus_t, cublasLtMatmulDescCreate,
           (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale), (desc, compute, scale))
DT_FORWARD(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
DT_FORWARD(cublasStatus_t, cublasLtMatmulDescSetAttribute,
           (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes),
           (desc, attr, buf, bytes))
DT_FORWARD(cublasStatus_t, cublasLtMatmulDescGetAttribute,
           (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf, size_t bytes, size_t* written),
           (desc, attr, buf, bytes, written))
DT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
DT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
DT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
           (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf, size_t bytes),
           (pref, attr, buf, bytes))
DT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
           (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
            cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t pref, int requested,
            cublasLtMatmulHeuristicResult_t results[], int* returned),
           (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned))
DT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoCheck,
           (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
            cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
            cublasLtMatmulHeuristicResult_t* result),
           (h, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result))

// The status names answer without the library too: an error message must not need it.
// Where it failed to load, the status string is why.
extern "C" const char* cublasLtGetStatusName(cublasStatus_t s) {
  static const auto real =
      reinterpret_cast<decltype(&cublasLtGetStatusName)>(::dtrain::cublaslt::symbol("cublasLtGetStatusName"));
  return real ? real(s) : "CUBLAS_STATUS_NOT_INITIALIZED";
}
extern "C" const char* cublasLtGetStatusString(cublasStatus_t s) {
  static const auto real =
      reinterpret_cast<decltype(&cublasLtGetStatusString)>(::dtrain::cublaslt::symbol("cublasLtGetStatusString"));
  if (real) return real(s);
  static const std::string why = ::dtrain::cublaslt::load_error();
  return why.c_str();
}
