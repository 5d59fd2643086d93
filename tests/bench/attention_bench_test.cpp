// bench attention: the shape grammar, FlashAttention's FLOP count against hand-computed
// values, and a CPU run of a small GQA shape (finite outputs, positive times, the rates
// from the times). Under the CPU execution engine (EMU tree): the variant the result names
// against the forward launches the engine traced, once per $DTRAIN_ATTN_VARIANT and card
// (ctest entries bench_attention_bench_test{,_hopper,_hopper_a100}). Nothing here asserts a
// speed.
#include "bench/bench_attention.h"

#include "core/error.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#ifdef DTRAIN_CUDA_EMU
#include <cuda_emu_trace.h>
#include <cuda_runtime.h>

#include <cstdlib>
#endif

using namespace dtrain;

TEST_CASE("bench attention: the shape grammar names the flag and the part") {
  const bench::BenchAttnShape s = bench::bench_attn_shape_parse("16,1024,12,4,64");
  CHECK(s.B == 16);
  CHECK(s.T == 1024);
  CHECK(s.NH == 12);
  CHECK(s.NKV == 4);
  CHECK(s.HD == 64);
  for (const char* bad : {"16,1024,12,4", "16,1024,12,4,64,1", "16,x,12,4,64", "16,1024,12,0,64", "16,1024,12,5,64", "",
                          "16,,12,4,64", "16,1024,12,4,64x"})
    CHECK_THROWS_AS(bench::bench_attn_shape_parse(bad), UsageError);
}

TEST_CASE("bench attention: FLOPs as FlashAttention counts them (causal half, backward 2.5x)") {
  // B 2, T 8, NH 3, HD 16: 4 * 2 * 3 * 64 * 16 / 2 = 12288 forward, 30720 backward.
  const bench::BenchAttnShape s{2, 8, 3, 1, 16};
  CHECK(bench::attn_fwd_flops(s) == 12288.0);
  CHECK(bench::attn_bwd_flops(s) == 30720.0);
  // GPT-2 124M's layer at B 16, T 1024: 4 * 16 * 12 * 1024^2 * 64 / 2 = 25.77 GFLOP.
  CHECK(bench::attn_fwd_flops({16, 1024, 12, 12, 64}) == doctest::Approx(25769803776.0));
}

TEST_CASE("bench attention: a CPU run of a GQA shape gives finite outputs and rates from its times") {
  bench::BenchAttnOptions o;
  o.shape = {2, 70, 4, 2, 16};
  o.dtype = DType::F32;
  o.device = device::Kind::CPU;
  o.warmup = 1;
  o.iters = 2;
  const bench::BenchAttnResult r = bench::bench_attention_run(o);
  CHECK(r.finite);
  CHECK(r.fwd_ms > 0);
  CHECK(r.bwd_ms > 0);
  CHECK(r.fwd_tflops == doctest::Approx(bench::attn_fwd_flops(o.shape) / (r.fwd_ms * 1e-3) / 1e12));
  CHECK(r.total_tflops > 0);
  const std::string table = bench::bench_attention_format(r, false);
  CHECK(table.find("GQA 2:1") != std::string::npos);
  CHECK(bench::bench_attention_format(r, true).find("\"fwd_ms\"") != std::string::npos);
  CHECK(r.variant == "-");  // the CPU ops: no tensor-core kernels
  CHECK(r.variant_requested == "-");
  CHECK(r.variant_fallback.empty());
  CHECK(table.find("kernels ") == std::string::npos);
  o.dtype = DType::BF16;  // the CPU ops compute in fp32
  CHECK_THROWS_AS(bench::bench_attention_run(o), UsageError);
  o.dtype = DType::F32;
  o.iters = 0;
  CHECK_THROWS_AS(bench::bench_attention_run(o), UsageError);
}

#ifdef DTRAIN_CUDA_EMU

namespace {

// The forward launches of one bench run as the engine traced them: the tensor-core forwards
// are all launched as `kernel` (kernels/attention_mma_fwd.cu, attention_hopper.cu), the mma.sync
// ones with 128 threads, the hopper one with 288.
struct Ran {
  bench::BenchAttnResult r;
  int hopper = 0, mma = 0;
};
Ran run_traced(int HD, DType dt) {
  bench::BenchAttnOptions o;
  o.shape = {1, 130, 4, 2, HD};  // GQA 2:1, a partial last query tile
  o.dtype = dt;
  o.device = device::Kind::CUDA;
  o.warmup = 0;
  o.iters = 1;
  cuda_emu::trace_begin();
  Ran out{bench::bench_attention_run(o)};
  for (const cuda_emu::TraceKernel& k : cuda_emu::trace_take().kernels) {
    if (k.name != "kernel") continue;
    if (k.block.x == 288) ++out.hopper;
    if (k.block.x == 128) ++out.mma;
  }
  return out;
}

}  // namespace

TEST_CASE("bench attention: the variant reported is the kernels the engine ran") {
  const char* env = std::getenv("DTRAIN_ATTN_VARIANT");
  const std::string asked = env && *env ? env : "legacy";
  int major = 0, minor = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess);
  const bool hopper_card = major == 9 && minor == 0;
  INFO("DTRAIN_ATTN_VARIANT=" << asked << ", compute capability " << major << "." << minor);
  for (auto [HD, dt] : {std::pair{64, DType::BF16}, std::pair{128, DType::F16}, std::pair{32, DType::BF16}}) {
    INFO("head dim " << HD << " " << dtype_name(dt));
    const Ran ran = run_traced(HD, dt);
    const bench::BenchAttnResult& r = ran.r;
    CHECK(r.finite);
    CHECK(r.variant_requested == asked);
    // The label against the launches: "hopper" exactly when the 288-thread forward ran, and
    // then no mma.sync forward.
    CHECK((r.variant == "hopper") == (ran.hopper > 0));
    CHECK(ran.hopper + ran.mma > 0);
    if (r.variant == "hopper") CHECK(ran.mma == 0);
    if (asked != "hopper") {
      CHECK(r.variant == asked);
      CHECK(r.variant_fallback.empty());
    } else if (hopper_card && (HD == 64 || HD == 128)) {
      CHECK(r.variant == "hopper");  // the engine's h100/h200 profile: the wgmma forward runs
      CHECK(r.variant_fallback.empty());
    } else {
      CHECK(r.variant == "fa2");
      const std::string why = !hopper_card ? "compute capability " + std::to_string(major) + "." + std::to_string(minor)
                                           : "head dim " + std::to_string(HD);
      CHECK_MESSAGE(r.variant_fallback.find(why) != std::string::npos, r.variant_fallback);
    }
    // The JSON and the table say the same.
    const nlohmann::json j = nlohmann::json::parse(bench::bench_attention_format(r, true));
    CHECK(j.at("variant") == r.variant);
    CHECK(j.at("variant_requested") == r.variant_requested);
    CHECK(j.at("variant_fallback") == r.variant_fallback);
    const std::string table = bench::bench_attention_format(r, false);
    CHECK(table.find("DTRAIN_ATTN_VARIANT=" + asked) != std::string::npos);
    CHECK(table.find(r.variant == "hopper" ? "kernels      hopper forward, fa2 backward"
                                           : "kernels      " + r.variant + " ") != std::string::npos);
    CHECK((table.find("hopper unavailable: " + r.variant_fallback) != std::string::npos) ==
          !r.variant_fallback.empty());
  }
  // fp32 runs on CUDA cores: no tensor-core variant to name.
  bench::BenchAttnOptions o;
  o.shape = {1, 40, 2, 1, 32};
  o.dtype = DType::F32;
  o.warmup = 0;
  o.iters = 1;
  const bench::BenchAttnResult r = bench::bench_attention_run(o);
  CHECK(r.variant == "-");
  CHECK(r.variant_requested == "-");
  CHECK(r.variant_fallback.empty());
}

#endif  // DTRAIN_CUDA_EMU
