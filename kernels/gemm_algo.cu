// The algorithm of each new GEMM problem (gemm_algo.cuh): cuBLASLt's heuristic candidates
// timed on the call's operands into stream-ordered scratch outputs, and the cache file
// that remembers the winners per card (device name, compute capability, cuBLASLt version)
// and problem. The file is a hint, never a correctness dependency: every entry is checked
// by cublasLtMatmulAlgoCheck for its problem, and a missing, foreign, damaged or refused
// entry only sends its problem back to timing.
#include "kernels/gemm_algo.cuh"

#include "core/crc32c.h"
#include "core/cuda_check.h"
#include "core/env.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/output_path.h"
#include "kernels/gemm.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

namespace dtrain::kernels {

namespace {

// ----------------------------------------------------------------------------
// Settings, counters, the timing budget and the file's entries: one mutex (taken after a
// device's plan mutex, never before, and never held while the GPU runs).
constexpr const char* kHeader = "dtrain-gemm-algos 1";
constexpr uint64_t kFileMaxBytes = uint64_t{4} << 20;  // ~15k entries; a larger file is not ours
constexpr int kMaxCandidates = 16;

struct State {
  std::mutex mu;
  GemmTuning tuning;
  GemmAlgoStats stats;
  std::map<int, double> spent_ms;  // per device: GPU time spent timing
  bool path_set = false;           // gemm_algo_cache_set called (else $DTRAIN_GEMM_ALGO_CACHE)
  std::string path;
  std::string default_path;                    // gemm_algo_cache_default: the path when the variable is unset
  bool loaded = false;                         // `entries` hold the file's lines
  std::map<std::string, std::string> entries;  // "<card> <key>" -> the algo's hex, every card's
  bool write_off = false;                      // a write failed or the file is not ours: warned once
};

State& state() {
  static State s;
  return s;
}

void warn(const std::string& what) { log_write(LogLevel::WARN, "GEMM algorithm cache: " + what); }

// DTRAIN_GEMM_ALGO_CACHE is declared in config's schema_env_knobs; this layer sits below
// config, so it reads the variable itself (through core's env table).
const std::string& cache_path(State& s) {
  if (!s.path_set) {
    const char* v = env_get("DTRAIN_GEMM_ALGO_CACHE");
    s.path = v ? v : s.default_path;
    s.path_set = true;
  }
  return s.path;
}

// ----------------------------------------------------------------------------
// The card: what an algo's bytes are valid for (NVIDIA: cublasLtMatmulAlgo_t "can be
// trivially serialized and later restored for use with the same version of cuBLAS
// library"), e.g. NVIDIA_H100_80GB_HBM3/sm90/cublasLt120800.
std::string card_of_current_device() {
  static std::mutex mu;
  static std::map<int, std::string> cards;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return "";
  std::lock_guard<std::mutex> lock(mu);
  auto it = cards.find(dev);
  if (it != cards.end()) return it->second;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "";
  std::string name;
  for (const char* q = prop.name; *q && name.size() < 128; ++q) {
    const char ch = *q;
    const bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                      ch == '-' || ch == '_';
    name += keep ? ch : '_';
  }
  if (name.empty()) name = "unnamed";
  std::string card = name + "/sm" + std::to_string(prop.major) + std::to_string(prop.minor) + "/cublasLt" +
                     std::to_string(cublasLtGetVersion());
  cards[dev] = card;
  return card;
}

// ----------------------------------------------------------------------------
// The file: a header line, then one line per card and problem:
//   <card> <key> <the algo's 64 bytes as 128 hex digits> <crc32c of what precedes: 8 hex>
// Lines that do not parse, or whose checksum is wrong, are ignored (and dropped on the
// next rewrite); so is every line of a file without the header.
std::string hex_of(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

bool bytes_of(const std::string& hex, void* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto* b = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    b[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

std::string crc_hex(const std::string& s) {
  const uint32_t crc = crc32c(s.data(), s.size());
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

bool token_ok(const std::string& t) {
  if (t.empty() || t.size() > 512) return false;
  for (const char ch : t)
    if (ch <= ' ' || ch > '~') return false;
  return true;
}

// "<card> <key>" and the algo's hex from one line; false when it is not a sound line.
bool line_parse(const std::string& line, std::string* entry, std::string* hex) {
  std::vector<std::string> tok;
  size_t pos = 0;
  while (pos <= line.size() && tok.size() <= 4) {
    const size_t sp = line.find(' ', pos);
    tok.push_back(line.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos));
    if (sp == std::string::npos) break;
    pos = sp + 1;
  }
  if (tok.size() != 4) return false;
  for (const std::string& t : tok)
    if (!token_ok(t)) return false;
  cublasLtMatmulAlgo_t probe{};
  if (!bytes_of(tok[2], &probe, sizeof probe) || tok[3].size() != 8) return false;
  const std::string body = tok[0] + " " + tok[1] + " " + tok[2];
  if (crc_hex(body) != tok[3]) return false;
  *entry = tok[0] + " " + tok[1];
  *hex = tok[2];
  return true;
}

// The entries of the file at path. *ours: the file is absent, empty or has the header
// (so it may be rewritten). Never throws: an unreadable file has no entries.
std::map<std::string, std::string> file_read(const std::string& path, bool* ours) {
  std::map<std::string, std::string> out;
  *ours = true;
  std::string problem;
  InputFile f = input_file_try_open(path, kFileMaxBytes, &problem);
  if (!f.is_open()) {
    try {
      if (!input_present(path, "DTRAIN_GEMM_ALGO_CACHE")) return out;  // none yet: written after a timing
    } catch (const std::exception&) {
    }
    *ours = false;
    warn("'" + path + "' " + problem + ": not used");
    return out;
  }
  std::string text;
  try {
    text = f.read_all("DTRAIN_GEMM_ALGO_CACHE", kFileMaxBytes);
  } catch (const std::exception& e) {
    *ours = false;
    warn(std::string("cannot read it: ") + e.what());
    return out;
  }
  if (text.empty()) return out;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    *ours = false;
    warn("'" + path + "' is not a dtrain GEMM algorithm cache (no '" + kHeader + "' line): not used, not replaced");
    return out;
  }
  while (std::getline(in, line)) {
    std::string entry, hex;
    if (!line.empty() && line[0] != '#' && line_parse(line, &entry, &hex)) out[entry] = hex;
  }
  return out;
}

// Rewrites the file with `entries` and whatever others added since it was read (another
// rank on the node sharing it): temporary file + rename (core/output_path.h).
void file_write(State& s) {
  if (s.write_off) return;
  const std::string& path = s.path;
  bool ours = true;
  std::map<std::string, std::string> now = file_read(path, &ours);
  if (!ours) {
    s.write_off = true;
    return;
  }
  for (auto& [entry, hex] : now) s.entries.emplace(entry, hex);  // ours win
  std::string text = std::string(kHeader) + "\n";
  text += "# <card> <GEMM problem> <cublasLtMatmulAlgo_t bytes> <crc32c>: timed choices, checked before use\n";
  for (const auto& [entry, hex] : s.entries) {
    const std::string body = entry + " " + hex;
    text += body + " " + crc_hex(body) + "\n";
  }
  try {
    OutputRule rule;
    rule.what = "DTRAIN_GEMM_ALGO_CACHE";
    rule.own = [](const std::string& target) {
      bool own = true;
      (void)file_read(target, &own);
      return own;
    };
    rule.own_kind = "a dtrain GEMM algorithm cache";
    output_file_write(output_file_check(path, rule), text);
    ++s.stats.file_writes;
  } catch (const std::exception& e) {
    s.write_off = true;
    warn(std::string("not written (the choices stay in memory): ") + e.what());
  }
}

// ----------------------------------------------------------------------------
// Timing: each candidate once to warm up, then `repeats` times between two events, on the
// call's stream with the call's inputs; D, and aux or bias when the epilogue writes them,
// go to one stream-ordered scratch allocation (256-byte aligned regions: at least what the
// candidates were promised). The caller's outputs are never touched, so beta != 0 and the
// epilogue's outputs see exactly one run. Returns the fastest candidate, or -1 when it
// could not time (no memory, a failed launch, over budget): the caller takes candidate 0.
size_t round256(size_t n) { return (n + 255) / 256 * 256; }

struct Events {
  std::vector<cudaEvent_t> ev;
  ~Events() {
    for (cudaEvent_t e : ev)
      if (e) (void)cudaEventDestroy(e);
  }
  cudaEvent_t make() {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    ev.push_back(e);
    return e;
  }
};

int candidates_time(const detail::AlgoCall& c, const cublasLtMatmulHeuristicResult_t* cand, int n, int repeats,
                    double budget_left_ms, double* spent_ms) {
  const size_t aux_off = round256(c.d_bytes), bias_off = aux_off + round256(c.aux_out_bytes);
  const size_t bytes = bias_off + round256(c.bias_out_bytes);
  void* scratch = nullptr;
  if (cudaMallocAsync(&scratch, bytes, c.stream) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory is not sticky: the call itself goes on
    return -1;
  }
  void* d = scratch;
  int best = -1;
  {
    Events events;
    const bool aligned = reinterpret_cast<uintptr_t>(scratch) % 256 == 0;
    void* aux_out = static_cast<char*>(scratch) + aux_off;
    const void* bias_out = static_cast<char*>(scratch) + bias_off;
    bool redirected = true;
    if (c.aux_out_bytes)
      redirected = cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_out,
                                                  sizeof aux_out) == CUBLAS_STATUS_SUCCESS;
    if (c.bias_out_bytes && redirected)
      redirected = cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_out,
                                                  sizeof bias_out) == CUBLAS_STATUS_SUCCESS;
    const void* c_in = c.beta != 0.0f ? c.c : d;
    auto run = [&](int i) {
      return cublasLtMatmul(c.handle, c.desc, &c.alpha, c.a, c.la, c.b, c.lb, &c.beta, c_in, c.lc, d, c.lc,
                            &cand[i].algo, c.workspace, c.workspace_bytes, c.stream) == CUBLAS_STATUS_SUCCESS;
    };
    auto elapsed = [](cudaEvent_t a, cudaEvent_t b) {
      float ms = -1;
      return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? static_cast<double>(ms) : -1.0;
    };
    // A probe run of candidate 0 prices the problem: stop when the whole search would
    // overrun the budget.
    cudaEvent_t p0 = events.make(), p1 = events.make();
    bool ok = aligned && redirected && p0 && p1 && run(0) && cudaEventRecord(p0, c.stream) == cudaSuccess && run(0) &&
              cudaEventRecord(p1, c.stream) == cudaSuccess && cudaEventSynchronize(p1) == cudaSuccess;
    const double t0 = ok ? elapsed(p0, p1) : -1.0;
    if (t0 >= 0) *spent_ms += 2 * t0;
    if (t0 >= 0 && 2 * t0 + t0 * n * (1 + repeats) <= budget_left_ms) {
      std::vector<cudaEvent_t> start(n, nullptr), end(n, nullptr);
      cudaEvent_t last = nullptr;
      for (int i = 0; i < n; ++i) {
        if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > c.workspace_bytes) continue;
        start[i] = events.make();
        end[i] = events.make();
        if (!start[i] || !end[i] || !run(i) || cudaEventRecord(start[i], c.stream) != cudaSuccess) {
          start[i] = end[i] = nullptr;
          continue;
        }
        bool all = true;
        for (int r = 0; r < repeats && all; ++r) all = run(i);
        if (!all || cudaEventRecord(end[i], c.stream) != cudaSuccess) {
          start[i] = end[i] = nullptr;
          continue;
        }
        last = end[i];
      }
      if (last && cudaEventSynchronize(last) == cudaSuccess) {
        double best_ms = 0;
        for (int i = 0; i < n; ++i) {
          if (!start[i]) continue;
          const double ms = elapsed(start[i], end[i]);
          if (ms < 0) continue;
          *spent_ms += ms * (repeats + 1) / repeats;
          if (best < 0 || ms < best_ms) {
            best = i;
            best_ms = ms;
          }
        }
      }
    }
    // The call's own pointers back (matmul_try sets them again before its run anyway).
    if (c.aux_out_bytes)
      (void)cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof c.aux);
    if (c.bias_out_bytes)
      (void)cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
    // Events still pending are released once complete (cudaEventDestroy).
  }
  // Stream-ordered after the timing runs; the pool reuses the memory for the real call.
  if (cudaFreeAsync(scratch, c.stream) != cudaSuccess) (void)cudaGetLastError();
  return best;
}

}  // namespace

// ----------------------------------------------------------------------------
namespace detail {

AlgoSource gemm_algo_choose(const AlgoCall& c, bool use_file, cublasLtMatmulAlgo_t* algo) {
  State& s = state();
  GemmTuning tuning;
  std::string path, card, entry;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    tuning = s.tuning;
    path = cache_path(s);
  }
  if (!path.empty()) {
    card = card_of_current_device();
    entry = card + " " + c.key;
  }

  // A remembered choice, if this card's cuBLASLt accepts it for the problem.
  if (use_file && !card.empty()) {
    std::string hex;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.loaded) {
        bool ours = true;
        s.entries = file_read(path, &ours);
        s.write_off = s.write_off || !ours;
        s.loaded = true;
      }
      auto it = s.entries.find(entry);
      if (it != s.entries.end()) hex = it->second;
    }
    cublasLtMatmulAlgo_t stored{};
    if (!hex.empty() && bytes_of(hex, &stored, sizeof stored)) {
      cublasLtMatmulHeuristicResult_t check{};
      const cublasStatus_t st = cublasLtMatmulAlgoCheck(c.handle, c.desc, c.la, c.lb, c.lc, c.lc, &stored, &check);
      if (st == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= c.workspace_bytes) {
        *algo = stored;
        std::lock_guard<std::mutex> lock(s.mu);
        ++s.stats.loaded;
        s.stats.last_candidate = -1;
        return AlgoSource::FILE;
      }
      std::lock_guard<std::mutex> lock(s.mu);
      ++s.stats.rejected;
    }
  }

  // cuBLASLt's candidates for the problem, in its order of estimated speed.
  cublasLtMatmulPreference_t pref = nullptr;
  DT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto pref_set = [&](cublasLtMatmulPreferenceAttributes_t a, const auto& v) {
    const cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, a, &v, sizeof v);
    if (st != CUBLAS_STATUS_SUCCESS) cublasLtMatmulPreferenceDestroy(pref);
    DT_CUBLAS_CHECK(st);
  };
  pref_set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(c.workspace_bytes));
  pref_set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, c.align_a);
  pref_set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, c.align_b);
  pref_set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c.align_c);
  pref_set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c.align_c);
  cublasLtMatmulHeuristicResult_t cand[kMaxCandidates] = {};
  const int want = std::clamp(tuning.candidates, 1, kMaxCandidates);
  int n = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(c.handle, c.desc, c.la, c.lb, c.lc, c.lc, pref, want, cand, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && n <= 0)) return AlgoSource::NONE;
  DT_CUBLAS_CHECK(st);
  n = std::min(n, want);

  // Timing: not while the stream is captured into a graph (a synchronising event, a
  // stream-ordered allocation and extra GEMMs would be recorded, or break the capture);
  // not for problems where launch overhead dominates; not past the budget.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c.stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    capture = cudaStreamCaptureStatusActive;  // unknown: as if captured
  }
  int dev = 0;
  (void)cudaGetDevice(&dev);
  double budget_left = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (capture != cudaStreamCaptureStatusNone) ++s.stats.untimed_capture;
    budget_left = tuning.budget_ms - s.spent_ms[dev];
  }
  int pick = 0;
  bool timed = false;
  if (n > 1 && capture == cudaStreamCaptureStatusNone && c.flops >= tuning.min_flops && budget_left > 0 &&
      tuning.repeats > 0) {
    double spent = 0;
    const int best = candidates_time(c, cand, n, tuning.repeats, budget_left, &spent);
    std::lock_guard<std::mutex> lock(s.mu);
    s.spent_ms[dev] += spent;
    if (best >= 0) {
      pick = best;
      timed = true;
      ++s.stats.timed;
    }
  }
  *algo = cand[pick].algo;
  std::lock_guard<std::mutex> lock(s.mu);
  s.stats.last_candidate = pick;
  if (timed && !card.empty()) {
    s.entries[entry] = hex_of(algo, sizeof *algo);
    file_write(s);
  }
  return timed ? AlgoSource::TIMED : AlgoSource::HEURISTIC;
}

void gemm_algo_forget() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.stats = GemmAlgoStats{};
  s.spent_ms.clear();
  s.entries.clear();
  s.loaded = false;
  s.write_off = false;
}

}  // namespace detail

// ----------------------------------------------------------------------------
void gemm_algo_cache_set(const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.path_set = true;
  s.path = path;
  s.entries.clear();
  s.loaded = false;
  s.write_off = false;
}

void gemm_algo_cache_default(const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.default_path = path;
}

void gemm_tuning_set(const GemmTuning& t) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.tuning = t;
}

GemmTuning gemm_tuning() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.tuning;
}

GemmAlgoStats gemm_algo_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.stats;
}

}  // namespace dtrain::kernels
