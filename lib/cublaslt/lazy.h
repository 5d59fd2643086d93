// cuBLASLt loaded on first use. libcublasLt's own static constructors cost about half a
// CPU-second per process (measured: a program that only links it takes 0.5-1.0 s to
// start), and every dtrain process paid it: `--version`, node agents, version probes,
// CPU-only ranks. The real CUDA build links this module instead of libcublasLt: it
// defines the cuBLASLt entry points dtrain calls, and the first call dlopen()s the
// library and forwards through the real symbol from then on. Processes that never touch
// a CUDA GEMM never load it. (The EMU tree keeps the CPU execution engine's cuBLASLt.)
#pragma once

#include <string>

namespace dtrain::cublaslt {

/// Loads libcublasLt now if it is not loaded yet (the entry points do this themselves).
/// True when it is loaded; otherwise load_error() says which files were tried and why.
bool ensure_loaded();

/// Empty while nothing failed; else what dlopen said for each file tried: the SONAME of
/// the toolkit the build used, then that name in the toolkit's directory at build time.
std::string load_error();

/// Whether libcublasLt is mapped into this process (read from /proc/self/maps): what the
/// lazy loading is for, and what its test checks.
bool mapped_in_process();

}  // namespace dtrain::cublaslt
