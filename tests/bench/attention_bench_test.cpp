// bench attention: the shape grammar, FlashAttention's FLOP count against hand-computed
// values, and a CPU run of a small GQA shape (finite outputs, positive times, the rates
// from the times). Nothing here asserts a speed.
#include "bench/bench_attention.h"

#include "core/error.h"

#include <doctest/doctest.h>

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
  o.dtype = DType::BF16;  // the CPU ops compute in fp32
  CHECK_THROWS_AS(bench::bench_attention_run(o), UsageError);
  o.dtype = DType::F32;
  o.iters = 0;
  CHECK_THROWS_AS(bench::bench_attention_run(o), UsageError);
}
