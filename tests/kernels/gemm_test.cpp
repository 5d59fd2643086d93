// cuBLASLt GEMM sweep against ops::gemm (fp32 CPU on the same rounded inputs): every
// transpose pair, alpha/beta, fp32 / bf16 / fp16 inputs with same-dtype or fp32 output,
// aligned and odd shapes, C poisoned when beta == 0; plus the argument checks. Then the
// algorithm choice: the timed candidate computes what the heuristic's first does and the
// caller's outputs see one run, no timing under stream capture, and the cache file
// (round trip; foreign, damaged, garbled or refused entries only cost a re-timing).
#include "harness.h"
#include "temp_dir.h"

#include "core/crc32c.h"
#include "core/error.h"
#include "kernels/gemm.cuh"
#include "ops/linear.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#ifdef DTRAIN_CUDA_EMU
#include <cuda_emu_trace.h>
#endif

using namespace dtrain;
using namespace dtrain::kernels::test;

namespace {

double gemm_case(bool ta, bool tb, int M, int N, int K, float alpha, float beta, DType ab, DType c, uint64_t seed) {
  Rng r(seed);
  const Floats A = round_through(rand_floats(r, static_cast<size_t>(M) * K), ab);
  const Floats B = round_through(rand_floats(r, static_cast<size_t>(K) * N), ab);
  const Floats C0 = round_through(rand_floats(r, static_cast<size_t>(M) * N), c);
  Floats ref = C0;
  ops::gemm(ta, tb, M, N, K, alpha, A.data(), B.data(), beta, ref.data());
  DevBuf dA(A, ab), dB(B, ab), dC(C0, c);
  if (beta == 0.0f) dC.poison();  // beta == 0 must not read C (NaN * 0 is NaN)
  kernels::gemm(ta, tb, M, N, K, alpha, dA.ptr(), dB.ptr(), beta, dC.ptr(), ab, c, nullptr);
  return buf_err(dC, ref);
}

}  // namespace

TEST_CASE("gemm: transposes, dtypes, alpha/beta and odd shapes match ops::gemm") {
  DTK_SKIP_WITHOUT_GPU();
  struct Types {
    DType ab, c;
    double tol;
  };
  struct Shape {
    int M, N, K;
  };
  uint64_t seed = 900;
  std::printf("%-44s %12s\n", "gemm case", "max err");
  for (Types ty :
       {Types{DType::F32, DType::F32, 1e-4}, Types{DType::BF16, DType::BF16, 1e-2},
        Types{DType::BF16, DType::F32, 1e-4}, Types{DType::F16, DType::F16, 2e-3}, Types{DType::F16, DType::F32, 1e-4}})
    for (Shape s : {Shape{64, 128, 96}, Shape{33, 17, 45}, Shape{1, 64, 256}})
      for (int tr = 0; tr < 4; ++tr)
        for (float beta : {0.0f, 1.0f}) {
          const bool ta = tr & 1, tb = tr & 2;
          const double e = gemm_case(ta, tb, s.M, s.N, s.K, 0.5f, beta, ty.ab, ty.c, seed++);
          char name[128];
          std::snprintf(name, sizeof name, "%s->%s %dx%dx%d ta=%d tb=%d beta=%g", dtype_name(ty.ab), dtype_name(ty.c),
                        s.M, s.N, s.K, ta, tb, beta);
          std::printf("%-44s %12.3e%s\n", name, e, e <= ty.tol ? "" : "  FAIL");
          INFO(name);
          CHECK(e <= ty.tol);
        }
}

TEST_CASE("gemm: the cached plan is reused across calls with other pointers") {
  DTK_SKIP_WITHOUT_GPU();
  for (int i = 0; i < 3; ++i)
    CHECK(gemm_case(false, true, 48, 40, 32, 1.0f, 1.0f, DType::BF16, DType::F32, 77 + i) <= 1e-4);
}

TEST_CASE("gemm: bad arguments are UsageErrors") {
  DTK_SKIP_WITHOUT_GPU();
  DevBuf a(64, DType::F32), b(64, DType::F32), c(64, DType::BF16);
  CHECK_THROWS_AS(
      kernels::gemm(false, false, 8, 8, 8, 1.0f, a.ptr(), b.ptr(), 0.0f, c.ptr(), DType::F32, DType::BF16, nullptr),
      UsageError);
  CHECK_THROWS_AS(
      kernels::linear_gelu_forward(c.ptr(), c.ptr(), a.ptr(), b.ptr(), nullptr, 2, 4, 6, DType::BF16, nullptr),
      UsageError);
  // The GELU input of DGELU has d(inp)'s leading dimension IC: a multiple of 8.
  CHECK_THROWS_AS(kernels::linear_dgelu_backward(c.ptr(), nullptr, nullptr, c.ptr(), c.ptr(), c.ptr(), c.ptr(), 2, 6, 4,
                                                 DType::BF16, nullptr),
                  UsageError);
}

// ----------------------------------------------------------------------------
// The algorithm choice. The engine's heuristic offers four candidates per problem, all
// computing the same result bit for bit, so every result below must equal the plain run's
// exactly; which candidate the timing picks is never asserted.
namespace {

namespace fs = std::filesystem;
using kernels::gemm_algo_stats;

// Timing for every size (the engine's problems are tiny), the cache file at `path`, the
// plans forgotten (a new process); the defaults back and the plans forgotten on exit.
struct Tuning {
  kernels::GemmTuning saved = kernels::gemm_tuning();
  explicit Tuning(const std::string& path = "", int candidates = 8) {
    kernels::GemmTuning t;
    t.candidates = candidates;
    t.repeats = 2;
    t.min_flops = 0;
    t.budget_ms = 1e9;
    kernels::gemm_tuning_set(t);
    kernels::gemm_algo_cache_set(path);
    kernels::gemm_plans_reset();
  }
  ~Tuning() {
    kernels::gemm_tuning_set(saved);
    kernels::gemm_algo_cache_set("");
    kernels::gemm_plans_reset();
  }
  Tuning(const Tuning&) = delete;
  Tuning& operator=(const Tuning&) = delete;
};

// C[M,N] = 0.5 A B^T + C (bf16 -> fp32, beta = 1: a timing run into the caller's C would
// show), fixed inputs per shape; c_offset elements past C's 256-byte alignment.
struct GemmRun {
  int M = 48, N = 40, K = 32;
  size_t c_offset = 0;
};
struct GemmCase {
  GemmRun g;
  Rng r;
  DevBuf a, b, c;
  explicit GemmCase(const GemmRun& run)
      : g(run), r(4242 + static_cast<uint64_t>(run.M) * 7 + static_cast<uint64_t>(run.N)),
        a(input(r, static_cast<size_t>(g.M) * g.K, DType::BF16), DType::BF16),
        b(input(r, static_cast<size_t>(g.K) * g.N, DType::BF16), DType::BF16),
        c(input(r, static_cast<size_t>(g.M) * g.N, DType::F32), DType::F32, g.c_offset) {}
  void run(cudaStream_t stream = nullptr) {
    kernels::gemm(false, true, g.M, g.N, g.K, 0.5f, a.ptr(), b.ptr(), 1.0f, c.ptr(), DType::BF16, DType::F32, stream);
  }
  Floats result() { return c.download(); }
};

// The result with the heuristic's first candidate, untimed.
Floats plain_result(const GemmRun& g) {
  Tuning t("", 1);
  GemmCase c(g);
  c.run();
  CHECK(gemm_algo_stats().timed == 0);
  CHECK(gemm_algo_stats().last_candidate == 0);
  return c.result();
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The cache file's entry lines: "<card> <key> <algo hex> <crc32c of what precedes>".
struct Entry {
  std::string card, key, hex;
};
const char* kHeader = "dtrain-gemm-algos 1\n";

std::vector<Entry> file_entries(const fs::path& p) {
  std::istringstream in(file_text(p));
  std::string line;
  std::vector<Entry> out;
  std::getline(in, line);
  CHECK(line + "\n" == kHeader);
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    Entry e;
    std::string crc;
    f >> e.card >> e.key >> e.hex >> crc;
    out.push_back(e);
  }
  return out;
}

std::string entry_line(const Entry& e) {
  const std::string body = e.card + " " + e.key + " " + e.hex;
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", crc32c(body.data(), body.size()));
  return body + " " + crc + "\n";
}

std::string file_of(const std::vector<Entry>& es) {
  std::string s = kHeader;
  for (const Entry& e : es) s += entry_line(e);
  return s;
}

// Two dense layers through every epilogue dtrain uses: GELU_AUX_BIAS forward (out and
// its pre-activation aux), the input gradient accumulated (beta = 1), the weight gradients
// accumulated with BGRADB bias gradients, and DGELU reading the stored aux. Every output.
std::vector<Floats> layers_run() {
  const int N = 24, IC = 32, OC = 40, OC2 = 16;
  const DType t = DType::BF16;
  Rng r(515);
  DevBuf inp(input(r, static_cast<size_t>(N) * IC, t), t), w(input(r, static_cast<size_t>(OC) * IC, t), t);
  DevBuf bias(input(r, OC, t), t), dout(input(r, static_cast<size_t>(N) * OC, t), t);
  DevBuf w2(input(r, static_cast<size_t>(OC2) * OC, t), t), dout2(input(r, static_cast<size_t>(N) * OC2, t), t);
  DevBuf out(static_cast<size_t>(N) * OC, t), pre(static_cast<size_t>(N) * OC, t);
  DevBuf dinp(input(r, static_cast<size_t>(N) * IC, t), t), dpre(static_cast<size_t>(N) * OC, t);
  DevBuf dw(input(r, static_cast<size_t>(OC) * IC, DType::F32), DType::F32), db(input(r, OC, DType::F32), DType::F32);
  DevBuf dw2(input(r, static_cast<size_t>(OC2) * OC, DType::F32), DType::F32);
  DevBuf db2(input(r, OC2, DType::F32), DType::F32);
  kernels::linear_gelu_forward(out.ptr(), pre.ptr(), inp.ptr(), w.ptr(), bias.ptr(), N, IC, OC, t, nullptr);
  kernels::linear_dgelu_backward(dpre.ptr(), dw2.f32(), db2.f32(), dout2.ptr(), out.ptr(), w2.ptr(), pre.ptr(), N, OC,
                                 OC2, t, nullptr);
  kernels::linear_backward(dinp.ptr(), dw.f32(), db.f32(), dout.ptr(), inp.ptr(), w.ptr(), N, IC, OC, OC, true, t,
                           nullptr);
  return {out.download(), pre.download(),  dpre.download(), dw2.download(),
          db2.download(), dinp.download(), dw.download(),   db.download()};
}

}  // namespace

TEST_CASE("gemm algos: the timed choice computes what the heuristic's first does; C (beta = 1) sees one run") {
  DTK_SKIP_WITHOUT_GPU();
  const GemmRun g;
  const Floats plain = plain_result(g);
  Tuning t;
  GemmCase c(g);
  c.run();
  CHECK(gemm_algo_stats().timed == 1);
  CHECK(gemm_algo_stats().last_candidate >= 0);
  CHECK(c.result() == plain);
  // The plan keeps its choice: the next call times nothing.
  GemmCase again(g);
  again.run();
  CHECK(gemm_algo_stats().timed == 1);
  CHECK(again.result() == plain);
}

TEST_CASE("gemm algos: epilogue outputs (GELU aux, BGRADB, DGELU) and accumulated gradients see one run") {
  DTK_SKIP_WITHOUT_GPU();
  std::vector<Floats> plain;
  {
    Tuning t("", 1);
    plain = layers_run();
    CHECK(gemm_algo_stats().timed == 0);
  }
  Tuning t;
  const std::vector<Floats> timed = layers_run();
  // GELU_AUX_BIAS, DGELU, the input-gradient GEMM and two BGRADB weight-gradient GEMMs.
  CHECK(gemm_algo_stats().timed == 5);
  REQUIRE(timed.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(timed[i] == plain[i]);
  }
}

TEST_CASE("gemm algos: no timing below min_flops, past the budget, or with one candidate") {
  DTK_SKIP_WITHOUT_GPU();
  const GemmRun g;
  const Floats plain = plain_result(g);
  auto untimed = [&](auto&& adjust) {
    Tuning t;
    kernels::GemmTuning tuning = kernels::gemm_tuning();
    adjust(tuning);
    kernels::gemm_tuning_set(tuning);
    GemmCase c(g);
    c.run();
    CHECK(c.result() == plain);
    CHECK(gemm_algo_stats().timed == 0);
    CHECK(gemm_algo_stats().last_candidate == 0);
  };
  untimed([&](kernels::GemmTuning& t) { t.min_flops = 2.0 * g.M * g.N * g.K + 1; });
  untimed([](kernels::GemmTuning& t) { t.budget_ms = 0; });
  untimed([](kernels::GemmTuning& t) { t.repeats = 0; });
  untimed([](kernels::GemmTuning& t) { t.candidates = 1; });
}

TEST_CASE("gemm algos: no timing while the stream is being captured into a graph") {
  DTK_SKIP_WITHOUT_GPU();
  const GemmRun g{40, 32, 24};
  const Floats plain = plain_result(g);
  Tuning t;
  GemmCase warm(GemmRun{16, 16, 16});  // the device's cuBLASLt state exists before the capture
  warm.run();
  const uint64_t timed_before = gemm_algo_stats().timed;
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  GemmCase c(g);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the uploads ran on the legacy stream
#ifdef DTRAIN_CUDA_EMU
  cuda_emu::trace_begin();
#endif
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  c.run(s);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
#ifdef DTRAIN_CUDA_EMU
  // The graph holds the one GEMM: no timing run, no scratch, was recorded.
  const cuda_emu::Trace trace = cuda_emu::trace_take();
  CHECK(trace.matmuls.size() == 1);
  REQUIRE(trace.graph_launches.size() == 1);
  CHECK(trace.graph_launches[0].nodes == 1);
#endif
  CHECK(gemm_algo_stats().timed == timed_before);
  CHECK(gemm_algo_stats().untimed_capture == 1);
  CHECK(gemm_algo_stats().last_candidate == 0);
  CHECK(c.result() == plain);
  // Eager calls later keep the captured plan's algorithm.
  GemmCase eager(g);
  eager.run();
  CHECK(gemm_algo_stats().timed == timed_before);
  CHECK(eager.result() == plain);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("gemm algos: the cache file round-trips; a new process loads the choice and times nothing") {
  DTK_SKIP_WITHOUT_GPU();
  test::TempDir dir("gemm-algos");
  const fs::path path = dir.path / "algos.txt";
  const GemmRun g;
  const Floats plain = plain_result(g);
  {
    Tuning t(path.string());
    GemmCase c(g);
    c.run();
    CHECK(c.result() == plain);
    CHECK(gemm_algo_stats().timed == 1);
    CHECK(gemm_algo_stats().file_writes == 1);
  }
  const std::string written = file_text(path);
  const std::vector<Entry> es = file_entries(path);
  REQUIRE(es.size() == 1);
  CHECK(es[0].hex.size() == 128);
  CHECK(es[0].card.find("/sm") != std::string::npos);
  CHECK(es[0].card.find("/cublasLt") != std::string::npos);
  {
    Tuning t(path.string());
    GemmCase c(g);
    c.run();
    CHECK(c.result() == plain);
    CHECK(gemm_algo_stats().timed == 0);
    CHECK(gemm_algo_stats().loaded == 1);
    CHECK(gemm_algo_stats().rejected == 0);
    CHECK(gemm_algo_stats().last_candidate == -1);
    CHECK(gemm_algo_stats().file_writes == 0);
  }
  CHECK(file_text(path) == written);
  // With no file the choice lives in memory only: a new process times again.
  Tuning t;
  GemmCase c(g);
  c.run();
  CHECK(gemm_algo_stats().timed == 1);
}

TEST_CASE("gemm algos: a foreign, truncated, damaged or garbled cache file is ignored and rewritten") {
  DTK_SKIP_WITHOUT_GPU();
  test::TempDir dir("gemm-algos");
  const fs::path path = dir.path / "algos.txt";
  const GemmRun g;
  const Floats plain = plain_result(g);
  {
    Tuning t(path.string());
    GemmCase(g).run();
  }
  const std::string good = file_text(path);
  const Entry e = file_entries(path).at(0);
  Entry foreign = e;
  foreign.card = "NVIDIA_A100-SXM4-80GB/sm80/cublasLt120800";
  Entry flipped = e;
  flipped.hex[20] = flipped.hex[20] == '0' ? '1' : '0';
  const std::string sound = entry_line(e), damaged = entry_line(flipped);
  // The damaged bytes under the sound line's checksum.
  const std::string bad_crc = damaged.substr(0, damaged.size() - 9) + sound.substr(sound.size() - 9);
  const std::string junk = std::string("\0\xff\x01 binary\n", 11) + std::string(100000, 'z') + "\n" + "a b c d\n" +
                           e.card + " " + e.key + " " + e.hex + " 00000000 extra\n";
  struct Bad {
    const char* what;
    std::string text;
    uint64_t rejected, loaded, timed, writes;
    size_t entries_after;  // 0: not checked
  };
  for (const Bad& bad :
       {Bad{"another card's entry", file_of({foreign}), 0, 0, 1, 1, 2},
        Bad{"truncated mid-line", good.substr(0, good.size() - 30), 0, 0, 1, 1, 1},
        Bad{"an algo byte damaged, the line's checksum wrong", kHeader + bad_crc, 0, 0, 1, 1, 1},
        Bad{"an algo byte damaged, the line's checksum redone", file_of({flipped}), 1, 0, 1, 1, 1},
        Bad{"binary garbage, long and short lines", kHeader + junk, 0, 0, 1, 1, 1}, Bad{"empty", "", 0, 0, 1, 1, 1},
        Bad{"a sound entry among garbage (nothing new: not rewritten)", good + junk, 0, 1, 0, 0, 0}}) {
    CAPTURE(bad.what);
    dir.write("algos.txt", bad.text);
    {
      Tuning t(path.string());
      GemmCase c(g);
      c.run();
      CHECK(c.result() == plain);
      CHECK(gemm_algo_stats().rejected == bad.rejected);
      CHECK(gemm_algo_stats().loaded == bad.loaded);
      CHECK(gemm_algo_stats().timed == bad.timed);
      CHECK(gemm_algo_stats().file_writes == bad.writes);
    }
    if (bad.entries_after) CHECK(file_entries(path).size() == bad.entries_after);
    // The (rewritten) file serves the next process.
    Tuning t(path.string());
    GemmCase c(g);
    c.run();
    CHECK(gemm_algo_stats().timed == 0);
    CHECK(gemm_algo_stats().loaded == 1);
  }
}

TEST_CASE("gemm algos: a file that is not a cache, or a path that cannot be written, is used for nothing") {
  DTK_SKIP_WITHOUT_GPU();
  test::TempDir dir("gemm-algos");
  const GemmRun g;
  const Floats plain = plain_result(g);
  const std::string notes = "# my notes\nimportant\n";
  const fs::path path = dir.write("notes.txt", notes);
  for (const fs::path& p : {path, dir.path / "missing-dir" / "algos.txt", dir.path}) {
    CAPTURE(p.string());
    Tuning t(p.string());
    GemmCase c(g);
    c.run();
    CHECK(c.result() == plain);
    CHECK(gemm_algo_stats().timed == 1);
    CHECK(gemm_algo_stats().file_writes == 0);
  }
  CHECK(file_text(path) == notes);
  CHECK(!fs::exists(dir.path / "missing-dir"));
}

TEST_CASE("gemm algos: an entry holding another shape's algo is refused by AlgoCheck and timed again") {
  DTK_SKIP_WITHOUT_GPU();
  test::TempDir dir("gemm-algos");
  const fs::path path = dir.path / "algos.txt";
  const GemmRun p{48, 40, 32}, q{64, 40, 32};
  const Floats plain = plain_result(p);
  {
    Tuning t(path.string());
    GemmCase(p).run();
    GemmCase(q).run();
    CHECK(gemm_algo_stats().timed == 2);
  }
  std::vector<Entry> es = file_entries(path);
  REQUIRE(es.size() == 2);
  std::swap(es[0].hex, es[1].hex);
  dir.write("algos.txt", file_of(es));
  {
    Tuning t(path.string());
    GemmCase c(p);
    c.run();
    CHECK(c.result() == plain);
    CHECK(gemm_algo_stats().rejected == 1);
    CHECK(gemm_algo_stats().loaded == 0);
    CHECK(gemm_algo_stats().timed == 1);
    CHECK(gemm_algo_stats().file_writes == 1);
  }
  Tuning t(path.string());
  GemmCase c(p);
  c.run();
  CHECK(gemm_algo_stats().loaded == 1);
  CHECK(gemm_algo_stats().timed == 0);
}

TEST_CASE("gemm algos: an entry AlgoCheck accepts but the call refuses only costs a re-timing") {
  DTK_SKIP_WITHOUT_GPU();
  test::TempDir dir("gemm-algos");
  const fs::path path = dir.path / "algos.txt";
  // The same GEMM with C 256-byte aligned and 4-byte aligned: two problems (the key holds
  // the alignments), one signature; the aligned one's algo promises more than the odd C has.
  const GemmRun aligned{48, 40, 32, 0}, odd{48, 40, 32, 1};
  const Floats plain = plain_result(odd);
  {
    Tuning t(path.string());
    GemmCase(aligned).run();
    GemmCase(odd).run();
    CHECK(gemm_algo_stats().timed == 2);
  }
  std::vector<Entry> es = file_entries(path);
  REQUIRE(es.size() == 2);
  std::swap(es[0].hex, es[1].hex);
  dir.write("algos.txt", file_of(es));
  Tuning t(path.string());
  GemmCase c(odd);
  c.run();
  CHECK(c.result() == plain);
  CHECK(gemm_algo_stats().loaded == 1);
  CHECK(gemm_algo_stats().timed == 1);
}
