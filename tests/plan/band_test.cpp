// bench train --plan's band: blocks per SM from registers, shared memory and threads; wave
// quantisation; the shape-dependent GEMM efficiency table (monotone, low <= high, the
// published point inside its band); an attention kernel with more registers (fewer blocks per
// SM) is slower at both ends; a wave tail and the re-read tiles cost only the slow end; the
// whole GPT-2 and Llama budgets give low <= mid <= high on both GPU profiles, with the
// attention kernels' registers taken from the ptxas table; DTRAIN_ATTN_VARIANT=hopper's
// forward planned as its own launch where it runs and as legacy's kernels elsewhere. Nothing
// executes.
#include "plan/bench_plan.h"
#include "plan/plan_gemm.h"
#include "plan/plan_occupancy.h"
#include "device/plan_device.h"
#include "core/error.h"
#include "temp_dir.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

using namespace dtrain;
using plan::PlanEnd;

namespace {

// A launch of the dQ kernel at head dim 64 as kernels/attention_mma.cu issues it (two stages:
// Qs, dOs and two K/V stages of 64 x 72 bf16).
device::PlanEntry dq_entry(int64_t blocks, int registers) {
  device::PlanEntry e;
  e.op = "attention_backward";
  e.kernel = "kernel_dq";
  e.unit = device::PlanUnit::TENSOR_ATTN_BWD;
  e.flops = 1e12;
  e.bytes = 1e8;
  e.launch.kernel = "attn_bwd_dq_kernel";
  e.launch.hdp = 64;
  e.launch.blocks = blocks;
  e.launch.threads = 128;
  e.launch.smem_two_stages = 2 * 6 * 64 * 72;
  e.launch.smem_one_stage = 2 * 4 * 64 * 72;
  e.launch.registers = registers;
  return e;
}

plan::BenchPlanOptions plan_options(const std::string& path, std::vector<std::string> sets) {
  plan::BenchPlanOptions o;
  o.config_path = path;
  o.sets = std::move(sets);
  return o;
}

}  // namespace

TEST_CASE("plan band: blocks per SM from registers, shared memory and threads") {
  const plan::PlanGpu& g = plan::plan_gpu("h100");
  // The tensor-core attention at head dim 64 on sm_90: 127 registers (forward), 164 (dQ), 181
  // (dK/dV), 128 threads: per warp 4096, 5376, 5888 registers of the SM's 65536.
  plan::Occupancy o = plan::blocks_per_sm(g, 127, 128, 46080);
  CHECK(o.blocks_per_sm == 4);
  CHECK(std::string(o.limit) == "registers");  // 4 x 16384 registers; shared memory allows 4 too (4 x 47104)
  CHECK(std::string(plan::blocks_per_sm(g, 64, 128, 100000).limit) == "shared memory");
  CHECK(plan::blocks_per_sm(g, 164, 128, 55296).blocks_per_sm == 3);
  o = plan::blocks_per_sm(g, 181, 128, 56320);
  CHECK(o.blocks_per_sm == 2);
  CHECK(std::string(o.limit) == "registers");
  o = plan::blocks_per_sm(g, 32, 1024, 0);
  CHECK(o.blocks_per_sm == 2);
  CHECK(std::string(o.limit) == "threads");
  o = plan::blocks_per_sm(g, 32, 32, 0);
  CHECK(o.blocks_per_sm == 32);
  CHECK(std::string(o.limit) == "blocks");
  CHECK(plan::blocks_per_sm(g, 64, 128, g.smem_optin + 1).blocks_per_sm == 0);
  // More registers never give more blocks.
  int last = 1 << 30;
  for (int regs = 16; regs <= 255; ++regs) {
    const int b = plan::blocks_per_sm(g, regs, 128, 0).blocks_per_sm;
    CHECK(b <= last);
    last = b;
  }
  CHECK(last == 2);  // 255 registers: 8192 per warp, 4 warps a block
  CHECK_THROWS_AS(plan::plan_gpu("a100"), UsageError);
}

TEST_CASE("plan band: wave quantisation") {
  CHECK(plan::wave_efficiency(264, 264) == doctest::Approx(1.0));
  CHECK(plan::wave_efficiency(265, 264) == doctest::Approx(265.0 / 528));
  // The example: 384 blocks on 264 resident places, 1.45 waves run as 2.
  CHECK(plan::wave_efficiency(384, 264) == doctest::Approx(384.0 / 528));
  CHECK(plan::wave_efficiency(100, 264) == doctest::Approx(100.0 / 264));
  CHECK(plan::wave_efficiency(3072, 264) == doctest::Approx(3072.0 / (12 * 264)));
}

TEST_CASE("plan band: GEMM efficiency is monotone in K and in outputs, low <= high, clamped outside the grid") {
  const std::vector<int64_t> ks = {64, 256, 384, 768, 1024, 3072, 4096, 16384, 1 << 20};
  const std::vector<int64_t> ns = {256, 768, 1024, 2304, 4096, 16384, 50304, 1 << 20};
  for (int64_t n : ns) {
    double prev_low = 0, prev_high = 0;
    for (int64_t k : ks) {
      const plan::GemmEfficiency e = plan::gemm_efficiency(4096, n, k);
      CHECK(e.low <= e.high);
      CHECK(e.low > 0);
      CHECK(e.high < 1);
      CHECK(e.low >= prev_low);
      CHECK(e.high >= prev_high);
      prev_low = e.low;
      prev_high = e.high;
    }
  }
  for (int64_t k : ks) {
    double prev_low = 0, prev_high = 0;
    for (int64_t n : ns) {
      const plan::GemmEfficiency e = plan::gemm_efficiency(4096, n, k);
      CHECK(e.low >= prev_low);
      CHECK(e.high >= prev_high);
      prev_low = e.low;
      prev_high = e.high;
    }
  }
  // The published 4096^3 bf16 rate (783.3 TFLOP/s of 989) lies in its grid point's band (the
  // table keeps three decimals), and a batch counts as outputs.
  const plan::GemmEfficiency sq = plan::gemm_efficiency(4096, 4096, 4096);
  CHECK(sq.low <= 783.3 / 989 + 5e-4);
  CHECK(sq.high >= 783.3 / 989 - 5e-4);
  CHECK(plan::gemm_efficiency(1024, 4096, 4096, 4).low == doctest::Approx(plan::gemm_efficiency(4096, 4096, 4096).low));
  // Beyond the grid the edge holds: K 4096 and 2^26 outputs.
  CHECK(plan::gemm_efficiency(1 << 14, 1 << 14, 1 << 14).high ==
        doctest::Approx(plan::gemm_efficiency(8192, 8192, 4096).high));
  // GPT-2's K = 768 GEMMs sit below Llama 1B's K = 2048 ones at the same outputs.
  CHECK(plan::gemm_efficiency(2304, 16384, 768).high < plan::gemm_efficiency(2304, 16384, 2048).low);
}

TEST_CASE("plan band: more registers, fewer blocks per SM, a slower attention kernel at both ends") {
  plan::PlanBudgetTable t;  // H100
  const int64_t slots3 = 132 * 3;
  plan::PlanKernelFit fit;
  const device::PlanEntry at_ref = dq_entry(8 * slots3, 164);
  const plan::PlanTime ref_slow = plan::plan_entry_time(at_ref, t, PlanEnd::SLOW, &fit);
  CHECK(fit.occupancy.blocks_per_sm == 3);
  CHECK(fit.stages == 2);
  CHECK(fit.waves == doctest::Approx(8.0));
  const plan::PlanTime ref_fast = plan::plan_entry_time(at_ref, t, PlanEnd::FAST);
  CHECK(ref_slow.compute == doctest::Approx(1e12 / (989e12 * t.attn_bwd_eff.slow)));  // whole waves: no tail
  CHECK(ref_fast.compute == doctest::Approx(1e12 / (989e12 * t.attn_bwd_eff.fast)));
  CHECK(ref_slow.total() >= ref_fast.total());

  // 200 registers: 6400 per warp, 2 blocks per SM instead of the reference 3.
  const device::PlanEntry heavy = dq_entry(8 * slots3, 200);
  const plan::PlanTime heavy_fast = plan::plan_entry_time(heavy, t, PlanEnd::FAST, &fit);
  CHECK(fit.occupancy.blocks_per_sm == 2);
  CHECK(std::string(fit.occupancy.limit) == "registers");
  CHECK(heavy_fast.compute == doctest::Approx(ref_fast.compute * 1.5));
  CHECK(plan::plan_entry_time(heavy, t, PlanEnd::SLOW).compute > ref_slow.compute * 1.5 - 1e-12);
  // Fewer registers than when the cap was measured: no gain is assumed.
  CHECK(plan::plan_entry_time(dq_entry(8 * slots3, 96), t, PlanEnd::FAST).compute == doctest::Approx(ref_fast.compute));
  // Registers from the ptxas table when the launch does not name them.
  const int table_regs = plan::plan_kernel_registers("attn_bwd_dq_kernel", 64, 2, 90);
  REQUIRE(table_regs > 0);
  plan::plan_entry_time(dq_entry(100, 0), t, PlanEnd::FAST, &fit);
  CHECK(fit.registers == table_regs);
}

TEST_CASE("plan band: a wave tail and the re-read tiles cost only the slow end") {
  plan::PlanBudgetTable t;
  const int64_t slots = 132 * 3;
  device::PlanEntry full = dq_entry(2 * slots, 164), tail = dq_entry(2 * slots + 1, 164);
  CHECK(plan::plan_entry_time(tail, t, PlanEnd::FAST).compute ==
        doctest::Approx(plan::plan_entry_time(full, t, PlanEnd::FAST).compute));
  // One block past two full waves: three waves for 2.0025 waves of work.
  CHECK(plan::plan_entry_time(tail, t, PlanEnd::SLOW).compute ==
        doctest::Approx(plan::plan_entry_time(full, t, PlanEnd::SLOW).compute * 3.0 / (2.0 + 1.0 / slots)));
  full.launch.reread_bytes = 5e9;
  const double bw_slow = 3.35e12 * t.hbm_eff.slow, bw_fast = 3.35e12 * t.hbm_eff.fast;
  CHECK(plan::plan_entry_time(full, t, PlanEnd::SLOW).memory == doctest::Approx((1e8 + 5e9) / bw_slow));
  CHECK(plan::plan_entry_time(full, t, PlanEnd::FAST).memory == doctest::Approx(1e8 / bw_fast));
}

TEST_CASE("plan band: GPT-2 124M and Llama 1B, low <= mid <= high, H200 faster than H100") {
  struct Case {
    const char* path;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases = {
      {"configs/gpt2-124m.yaml", {"train_micro_batch_size_per_gpu=16", "data.seq_len=1024"}},
      {"configs/llama-1b.yaml", {"train_micro_batch_size_per_gpu=4", "data.seq_len=2048"}}};
  for (const Case& c : cases) {
    CAPTURE(c.path);
    const plan::BenchPlanResult h100 = plan::bench_plan_run(plan_options(c.path, c.sets), "h100");
    const plan::BenchPlanResult h200 = plan::bench_plan_run(plan_options(c.path, c.sets), "h200");
    for (const auto* r : {&h100, &h200}) {
      CHECK(r->mfu_low > 0);
      CHECK(r->mfu_low <= r->mfu);
      CHECK(r->mfu <= r->mfu_high);
      CHECK(r->mfu_high < 1);
      CHECK(r->step_ms_fast <= r->step_ms);
      CHECK(r->step_ms <= r->step_ms_slow);
      double slow = 0, fast = 0;
      for (const auto& w : r->rows) {
        slow += w.ms_slow;
        fast += w.ms_fast;
        CHECK(w.ms_fast <= w.ms_slow);
        if (w.attn) CHECK(w.occupancy.find("blocks/SM") != std::string::npos);
      }
      CHECK(slow == doctest::Approx(r->step_ms_slow));
      CHECK(fast == doctest::Approx(r->step_ms_fast));
      REQUIRE(r->anchors.size() == 1);
      CHECK(r->anchors[0].tokens_per_s == 460e3);
    }
    // Same compute, more HBM bandwidth: the memory-bound kernels are faster on the H200.
    CHECK(h200.step_ms_slow < h100.step_ms_slow);
    CHECK(h200.step_ms_fast < h100.step_ms_fast);
    CHECK(h200.table.gpu.label == "H200 SXM");
    // The dK/dV kernel (head dim 64 in both models) runs at the ptxas table's registers.
    const int regs = plan::plan_kernel_registers("attn_bwd_dkdv_kernel", 64, 2, 90);
    REQUIRE(regs > 0);
    bool seen = false;
    for (const auto& w : h100.rows)
      if (w.kernel == "kernel_dkdv") {
        seen = true;
        CHECK(w.occupancy.find(std::to_string(regs) + " regs") != std::string::npos);
      }
    CHECK(seen);
  }
  CHECK_THROWS_AS(plan::bench_plan_run(plan_options("configs/gpt2-124m.yaml", {}), "a100"), UsageError);
}

namespace {

// One attention forward on a plan device of `variant` (the card: compute capability sm,
// opt-in shared memory smem_optin), dense q/k/v/out rows (or q `skew` bytes off its
// alignment); its entries.
struct FwdCase {
  std::string variant = "hopper";
  int sm = 90;
  size_t smem_optin = 227 * 1024;
  int B = 2, T = 1000, NH = 8, NKV = 4, HD = 64;
  DType dt = DType::BF16;
  size_t skew = 0;
};
std::vector<device::PlanEntry> plan_forward(const FwdCase& c) {
  device::PlanDevice dev;
  dev.set_attention_variant(c.variant);
  dev.set_compute_capability(c.sm);
  dev.set_smem_optin(c.smem_optin);
  const size_t rows = static_cast<size_t>(c.B) * c.T, es = dtype_size(c.dt);
  char* q = static_cast<char*>(dev.alloc(rows * c.NH * c.HD * es + 64));
  void* k = dev.alloc(rows * c.NKV * c.HD * es);
  void* v = dev.alloc(rows * c.NKV * c.HD * es);
  void* out = dev.alloc(rows * c.NH * c.HD * es);
  auto* lse = static_cast<float*>(dev.alloc(dev.attention_saved_floats(c.B, c.T, c.NH) * sizeof(float)));
  dev.record(true);
  dev.attention_forward(out, lse, q + c.skew, k, v, c.B, c.T, c.NH, c.NKV, c.HD, c.NH * c.HD, c.NKV * c.HD, 0, nullptr,
                        c.dt);
  return dev.take();
}

}  // namespace

TEST_CASE("plan band: the hopper variant's forward as its own launch where it runs, legacy's kernels elsewhere") {
  const plan::PlanBudgetTable t;  // H100
  for (int HD : {64, 128}) {
    for (DType dt : {DType::BF16, DType::F16}) {
      CAPTURE(HD);
      FwdCase c;
      c.HD = HD;
      c.dt = dt;
      const std::vector<device::PlanEntry> hop = plan_forward(c);
      c.variant = "legacy";
      const std::vector<device::PlanEntry> legacy = plan_forward(c);
      // One kernel launch each and nothing else: no workspace (the hopper forward writes out
      // and the lse only, as the mma.sync one).
      REQUIRE(hop.size() == 1);
      REQUIRE(legacy.size() == 1);
      const device::PlanLaunch& l = hop[0].launch;
      CHECK(hop[0].kernel == "kernel");  // kernels/attention_hopper.cu's launch text
      CHECK(l.kernel == "attn_fwd_hopper_kernel");
      CHECK(legacy[0].launch.kernel == "attn_fwd_mma_kernel");
      CHECK(l.threads == 288);
      // Its layout (kernels/attention_hopper.cu's hopper_bytes): 2048 bytes of pad and barriers,
      // the 128-row Q tile, two stages of 64-key K and V tiles, 2-byte elements: 51,200 B at
      // head dim 64, 100,352 at 128.
      CHECK(l.smem_two_stages == 2048u + 128u * HD * 2 + 4u * 64 * HD * 2);
      CHECK(l.smem_two_stages == (HD == 64 ? 51200u : 100352u));
      CHECK(l.blocks == int64_t{c.B} * c.NH * ((c.T + 127) / 128));
      // The same causal 64 x 64 tile pairs computed, the same arrays read and written once;
      // 128-row query tiles load the K/V tiles half as often.
      CHECK(hop[0].flops == doctest::Approx(legacy[0].flops));
      CHECK(hop[0].bytes == doctest::Approx(legacy[0].bytes));
      CHECK(l.reread_bytes < legacy[0].launch.reread_bytes);
      CHECK(l.reread_bytes > 0);
      // One block per SM (by its registers, ptxas's count from the table), its own reference.
      plan::PlanKernelFit fit;
      plan::plan_entry_time(hop[0], t, PlanEnd::FAST, &fit);
      CHECK(fit.registers == plan::plan_kernel_registers("attn_fwd_hopper_kernel", HD, 2, 90));
      CHECK(fit.registers > 0);
      CHECK(fit.occupancy.blocks_per_sm == 1);
      CHECK(std::string(fit.occupancy.limit) == "registers");
      // At its reference occupancy: the whole band's cap, not scaled down as a 1-block mma.sync kernel would be.
      const double waves = static_cast<double>(l.blocks) / 132;
      CHECK(fit.waves == doctest::Approx(waves));
      CHECK(plan::plan_entry_time(hop[0], t, PlanEnd::FAST).compute ==
            doctest::Approx(hop[0].flops / (989e12 * t.attn_hopper_fwd_eff.fast)));
    }
  }
  // Where it does not run: legacy's kernels (fa2's, which would run, are not modelled).
  auto kernel_of = [](const FwdCase& c) {
    const std::vector<device::PlanEntry> e = plan_forward(c);
    REQUIRE(e.size() == 1);
    return e[0].launch.kernel;
  };
  FwdCase c;
  CHECK(kernel_of(c) == "attn_fwd_hopper_kernel");
  for (const char* variant : {"legacy", "fa2"}) {
    FwdCase o = c;
    o.variant = variant;
    CHECK(kernel_of(o) == "attn_fwd_mma_kernel");
  }
  FwdCase o = c;
  o.sm = 80;  // A100
  CHECK(kernel_of(o) == "attn_fwd_mma_kernel");
  o = c;
  o.sm = 100;  // B200: sm_90a code does not run there
  CHECK(kernel_of(o) == "attn_fwd_mma_kernel");
  o = c;
  o.HD = 96;
  CHECK(kernel_of(o) == "attn_fwd_mma_kernel");
  o = c;
  o.HD = 128;
  o.smem_optin = 100352 - 1;  // one byte short of its 100,352
  CHECK(kernel_of(o) == "attn_fwd_mma_kernel");
  o.smem_optin = 100352;
  CHECK(kernel_of(o) == "attn_fwd_hopper_kernel");
  o = c;
  o.skew = 8;  // q's rows not 16-byte aligned
  CHECK(kernel_of(o) == "attn_fwd_mma_kernel");
  o = c;
  o.dt = DType::F32;  // CUDA cores: no tensor-core launch
  CHECK(kernel_of(o).empty());
  device::PlanDevice dev;
  CHECK_THROWS_AS(dev.set_attention_variant("fa3"), UsageError);
}

TEST_CASE("plan band: DTRAIN_ATTN_VARIANT=hopper in the GPT-2 budget: its forward, and the notes say what is priced") {
  const plan::BenchPlanOptions o =
      plan_options("configs/gpt2-124m.yaml", {"train_micro_batch_size_per_gpu=16", "data.seq_len=1024"});
  const plan::BenchPlanResult legacy = plan::bench_plan_run(o, "h100");
  struct EnvVariant {
    explicit EnvVariant(const char* v) { ::setenv("DTRAIN_ATTN_VARIANT", v, 1); }
    ~EnvVariant() { ::unsetenv("DTRAIN_ATTN_VARIANT"); }
  };
  auto has_note = [](const plan::BenchPlanResult& r, const std::string& text) {
    for (const std::string& n : r.notes)
      if (n.find(text) != std::string::npos) return true;
    return false;
  };
  CHECK_FALSE(legacy.attn_hopper_fwd);
  CHECK_FALSE(has_note(legacy, "DTRAIN_ATTN_VARIANT"));
  plan::BenchPlanResult hopper, fa2;
  {
    const EnvVariant env("hopper");
    hopper = plan::bench_plan_run(o, "h100");
  }
  {
    const EnvVariant env("fa2");
    fa2 = plan::bench_plan_run(o, "h100");
  }
  CHECK(hopper.attn_hopper_fwd);
  CHECK(has_note(hopper, "DTRAIN_ATTN_VARIANT=hopper: the attention forward is the sm_90a wgmma kernel"));
  CHECK(plan::bench_plan_format(hopper, false).find("forward on wgmma") != std::string::npos);
  CHECK(plan::bench_plan_format(hopper, true).find("\"attn_hopper_fwd\":true") != std::string::npos);
  const auto forward_row = [](const plan::BenchPlanResult& r) {
    for (const plan::PlanRow& w : r.rows)
      if (w.op == "attention_forward") return w;
    FAIL("no attention_forward row");
    return plan::PlanRow{};
  };
  // The forward's own occupancy; the same FLOPs; the backward as legacy's.
  CHECK(forward_row(hopper).occupancy.find("1 blocks/SM (registers") != std::string::npos);
  CHECK(forward_row(hopper).gflop == doctest::Approx(forward_row(legacy).gflop));
  CHECK(hopper.attn_gflop == doctest::Approx(legacy.attn_gflop));
  for (const plan::PlanRow& w : legacy.rows)
    if (w.op == "attention_backward")
      for (const plan::PlanRow& h : hopper.rows)
        if (h.op == w.op && h.kernel == w.kernel) CHECK(h.ms == doctest::Approx(w.ms));
  // fa2: legacy's kernels, said so.
  CHECK_FALSE(fa2.attn_hopper_fwd);
  CHECK(has_note(fa2, "fa2's 128-row forward and dQ tiles are not modelled"));
  CHECK(fa2.step_ms == doctest::Approx(legacy.step_ms));
}

// scripts/kernel_resources.py --plan-table, which writes lib/plan/plan_kernel_resources.inc
// from one nvcc build's ptxas reports: that build has only its own architectures, so it
// replaces their rows and keeps the other architectures' (a table regenerated from an
// 80;90 build once lost every sm 86/89/100/120 row). The report below is ptxas -v's format,
// one entry the plan models (attn_fwd_mma_kernel<__nv_bfloat16, 64, 2, 1> for sm_80).
TEST_CASE("kernel_resources.py --plan-table replaces the rows of the build's architectures, keeps the others'") {
  if (std::system("python3 --version > /dev/null 2>&1") != 0 ||
      std::system("c++filt --version > /dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: python3 or c++filt missing");
    return;
  }
  dtrain::test::TempDir d("plan_table");
  const std::string mangled =
      "_ZN6dtrain7kernels6detail53_GLOBAL__N__b1b141a0_20_attention_mma_fwd_cu_e4f0067319attn_fwd_mma_"
      "kernelI13__nv_bfloat16Li64ELi2ELi1EEEvPT_PfPKS5_S9_S9_NS1_3mma4ArgsE";
  dtrain::test::file_put(d.path / "attention_mma_fwd.cu.o", "");
  dtrain::test::file_put(d.path / "attention_mma_fwd.cu.o.ptxas",
                         "ptxas info    : Compiling entry function '" + mangled + "' for 'sm_80'\n" +
                             "ptxas info    : Function properties for " + mangled + "\n" +
                             "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n" +
                             "ptxas info    : Used 99 registers, used 1 barriers, 472 bytes cmem[0]\n");
  const auto table = d.path / "table.inc";
  dtrain::test::file_put(table,
                         "// {kernel, head dim padded, stages, sm, registers}\n"
                         "    {\"attn_bwd_dq_kernel\", 64, 2, 80, 111},\n"
                         "    {\"attn_fwd_mma_kernel\", 64, 2, 80, 128},\n"
                         "    {\"attn_fwd_mma_kernel\", 64, 2, 86, 120},\n");
  const std::string script = (dtrain::test::source_dir() / "scripts/kernel_resources.py").string();
  const std::string base = "python3 '" + script + "' --objects '" + d.path.string() + "' ";
  REQUIRE(std::system((base + "--plan-table '" + table.string() + "' > /dev/null").c_str()) == 0);
  const std::string out = dtrain::test::file_bytes(table);
  INFO(out);
  CHECK(out.find("{\"attn_fwd_mma_kernel\", 64, 2, 80, 99},") != std::string::npos);   // this build's
  CHECK(out.find("{\"attn_fwd_mma_kernel\", 64, 2, 86, 120},") != std::string::npos);  // another arch's, kept
  CHECK(out.find("80, 128}") == std::string::npos);                                    // replaced
  CHECK(out.find("attn_bwd_dq_kernel") == std::string::npos);                          // sm_80, gone from this build
  CHECK(std::system((base + "--check-plan-table '" + table.string() + "' > /dev/null").c_str()) == 0);
}
