// bench train --plan: the budget of GPT-2 124M at B=16 T=1024 comes out of the real
// model on the plan device without a GPU or model-sized memory, its GEMM FLOPs are
// exactly 3 x 2 x tokens x linear weights, the figures add up, the MFU band holds the mid
// figure, LoRA drops the frozen weights' gradient GEMMs, and the roofline of one entry is the
// table's at both ends; every ZeRO-Offload recipe in examples/ plans, full and with LoRA.
// Runs in every build (nothing executes).
#include "core/error.h"
#include "plan/bench_plan.h"
#include "plan/plan_gemm.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <cmath>
#include <filesystem>
#include <string>

using namespace dtrain;

namespace {

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

plan::BenchPlanOptions gpt2_124m(std::vector<std::string> sets = {}) {
  plan::BenchPlanOptions o;
  o.config_path = "configs/gpt2-124m.yaml";
  o.sets = {"train_micro_batch_size_per_gpu=16"};
  o.sets.insert(o.sets.end(), sets.begin(), sets.end());  // later --set wins
  return o;
}

}  // namespace

TEST_CASE("bench plan: GPT-2 124M at B=16 T=1024, exact GEMM FLOPs, consistent totals, no model-sized memory") {
  const long rss0 = max_rss_kib();
  const plan::BenchPlanResult r = plan::bench_plan_run(gpt2_124m());
  // Real memory for this step would be gigabytes (2.2 GB of weights, gradients and AdamW
  // state alone); the plan device hands out fake addresses.
  CHECK(max_rss_kib() - rss0 < 256 * 1024);
  CHECK(r.params == 124475904);
  CHECK(r.micro_batch == 16);
  CHECK(r.seq_len == 1024);
  CHECK(r.dtype == "bfloat16");
  // Every linear runs once forward and twice backward (dX, dW): 6 x tokens x weights.
  const double C = 768, L = 12, V = 50304, tokens = 16.0 * 1024;
  const double linear_weights =
      L * 12 * C * C + V * C;  // c_attn 3C^2, attn c_proj C^2, c_fc and mlp c_proj 4C^2 each; lm head
  CHECK(r.gemm_gflop * 1e9 == doctest::Approx(6 * tokens * linear_weights).epsilon(1e-9));
  double ms = 0, share = 0;
  int64_t launches = 0;
  bool gemm_row = false, attention_row = false;
  for (const auto& w : r.rows) {
    ms += w.ms;
    share += w.share;
    launches += w.launches;
    gemm_row = gemm_row || w.gemm;
    attention_row = attention_row || w.op == "attention_backward";
    CHECK(w.ms > 0);
  }
  CHECK(gemm_row);
  CHECK(attention_row);
  CHECK(ms == doctest::Approx(r.step_ms));
  CHECK(share == doctest::Approx(1.0));
  CHECK(launches == r.launches);
  CHECK(r.gemm_ms + r.attn_ms + r.other_ms == doctest::Approx(r.step_ms));
  CHECK(r.attn_ms > 0);  // bf16 attention runs on tensor cores
  CHECK(r.tokens_per_s == doctest::Approx(tokens / (r.step_ms / 1e3)));
  CHECK(r.mfu == doctest::Approx(r.flops_per_token * tokens / (r.step_ms / 1e3 * 989e12)));
  CHECK(r.flops_per_token == doctest::Approx(6.0 * 124475904 + 12.0 * 12 * 1024 * 768));
  CHECK_FALSE(r.top_other.empty());
  CHECK(r.top_other_share > 0);
  // The budget is the sum of rooflines, so even its fast end cannot beat the GEMMs at the best
  // efficiency of the published table.
  const double best = plan::gemm_efficiency(1 << 14, 1 << 14, 1 << 14).high;
  CHECK(r.step_ms_fast > r.gemm_gflop * 1e9 / (989e12 * best) * 1e3);
  CHECK(r.mfu_low <= r.mfu);
  CHECK(r.mfu <= r.mfu_high);

  const std::string table = plan::bench_plan_format(r, false);
  CHECK(table.find("cublasLtMatmul BGRADB bf16->f32") != std::string::npos);
  CHECK(table.find("MFU") != std::string::npos);
  CHECK(table.find("predicted") != std::string::npos);
  const auto j = nlohmann::json::parse(plan::bench_plan_format(r, true));
  CHECK(j["plan"] == true);
  CHECK(j["kernels"].size() == r.rows.size());
  CHECK(j["step_ms"].get<double>() == doctest::Approx(r.step_ms));
  CHECK(j["mfu_low"].get<double>() == doctest::Approx(r.mfu_low));
  CHECK(j["mfu_high"].get<double>() == doctest::Approx(r.mfu_high));
  CHECK(j["gpu_profile"] == "h100");
  CHECK(j["tokens_per_step"] == 16 * 1024);
}

TEST_CASE("bench plan: LoRA plans no gradient GEMM for the frozen weights") {
  const plan::BenchPlanResult r =
      plan::bench_plan_run(gpt2_124m({"lora.r=8", "data.seq_len=128", "train_micro_batch_size_per_gpu=2"}));
  CHECK(r.lora_rank == 8);
  CHECK(r.trainable_params < r.params / 100);
  for (const auto& w : r.rows) CHECK(w.kernel.find("BGRADB") == std::string::npos);
  // Base linears: forward and dX only (4 x tokens x weights), plus the small adapters.
  const double C = 768, L = 12, V = 50304, tokens = 2.0 * 128;
  const double base = 4 * tokens * (L * 12 * C * C + V * C);
  CHECK(r.gemm_gflop * 1e9 > base);
  CHECK(r.gemm_gflop * 1e9 < 1.05 * base);
  CHECK(r.flops_formula.rfind("4N", 0) == 0);
}

TEST_CASE("bench plan: the roofline of one entry at both ends of the band, and --device cpu has no plan") {
  plan::PlanBudgetTable t;
  device::PlanEntry e;
  e.unit = device::PlanUnit::TENSOR_GEMM;
  e.kind = device::PlanKind::MATMUL;
  e.matmul.m = 2304;  // GPT-2's c_attn forward as cuBLASLt sees it
  e.matmul.n = 16384;
  e.matmul.k = 768;
  e.flops = 2e12;
  e.bytes = 1e9;
  e.launches = 1;
  const plan::GemmEfficiency ge = plan::gemm_efficiency(2304, 16384, 768);
  plan::PlanTime pt = plan::plan_entry_time(e, t, plan::PlanEnd::SLOW);
  CHECK(pt.compute == doctest::Approx(2e12 / (989e12 * ge.low)));
  CHECK(pt.memory == doctest::Approx(1e9 / (3.35e12 * t.hbm_eff.slow)));
  CHECK(pt.total() == doctest::Approx(pt.compute + 2e-6));
  pt = plan::plan_entry_time(e, t, plan::PlanEnd::FAST);
  CHECK(pt.compute == doctest::Approx(2e12 / (989e12 * ge.high)));
  CHECK(pt.memory == doctest::Approx(1e9 / (3.35e12 * t.hbm_eff.fast)));
  e.unit = device::PlanUnit::MEMORY;  // bytes only: the FLOPs do not count
  pt = plan::plan_entry_time(e, t, plan::PlanEnd::SLOW);
  CHECK(pt.compute == 0.0);
  CHECK(pt.total() == doctest::Approx(pt.memory + 2e-6));
  e.unit = device::PlanUnit::TENSOR_ATTN_BWD;  // its own cap, not the forward's (no launch geometry: no occupancy)
  REQUIRE(t.attn_bwd_eff.slow != t.attn_fwd_eff.slow);
  CHECK(plan::plan_entry_time(e, t, plan::PlanEnd::SLOW).compute ==
        doctest::Approx(2e12 / (989e12 * t.attn_bwd_eff.slow)));
  CHECK(plan::plan_entry_time(e, t, plan::PlanEnd::FAST).compute ==
        doctest::Approx(2e12 / (989e12 * t.attn_bwd_eff.fast)));

  plan::BenchPlanOptions o = gpt2_124m();
  o.device = device::Kind::CPU;
  CHECK_THROWS_AS(plan::bench_plan_run(o), UsageError);
}

TEST_CASE("bench plan: ZeRO-Offload is planned with the update on the GPU and said so, without model-sized memory") {
  // The offloaded update's host buffers would be real memory (and its fake-storage source
  // crashed the plan before): the plan leaves ZeRO-Offload out and notes it.
  const long rss0 = max_rss_kib();
  const plan::BenchPlanResult r =
      plan::bench_plan_run(gpt2_124m({"zero_optimization.offload_optimizer.device=cpu", "zero_optimization.stage=2",
                                      "data.seq_len=128", "train_micro_batch_size_per_gpu=2"}));
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("ZeRO-Offload not planned") != std::string::npos;
  CHECK(noted);
  CHECK(r.launches > 0);
  for (const auto& w : r.rows) CHECK(w.op.find("offload") == std::string::npos);
  CHECK(max_rss_kib() - rss0 < 200 * 1024);  // 124M parameters' host state would be ~2.7 GB
}

TEST_CASE("bench plan: every ZeRO-Offload recipe in examples/ plans, full and with LoRA, with sane figures") {
  // A LoRA base at stage 3 is frozen and sharded: its 16-bit shards start from the fp32
  // source, a host stand-in with fake storage on the plan device. That conversion read the
  // fake storage (a segfault in ZeroOffload::device_from_host) before it went through the
  // device's own copy (Runtime::copy_h2d_cast).
  int recipes = 0;
  for (const auto& e : std::filesystem::directory_iterator("examples")) {
    if (!e.is_directory()) continue;
    for (const auto& f : std::filesystem::directory_iterator(e.path())) {
      const std::string path = f.path().string();
      if (f.path().extension() != ".yaml" || path.find("_offload") == std::string::npos) continue;
      ++recipes;
      const std::string model_dir = "tests/data/hf_configs/" + e.path().filename().string();
      REQUIRE(std::filesystem::exists(model_dir + "/config.json"));
      plan::BenchPlanResult full;
      for (bool lora : {false, true}) {
        CAPTURE(path);
        CAPTURE(lora);
        plan::BenchPlanOptions o;
        o.config_path = path;
        o.sets = {"model.init_from=" + model_dir};
        if (lora) o.sets.push_back("lora.r=8");
        const long rss0 = max_rss_kib();
        const plan::BenchPlanResult r = plan::bench_plan_run(o);
        CHECK(max_rss_kib() - rss0 < 256 * 1024);  // an 8B model's state would be ~100 GB
        bool noted = false;
        for (const auto& n : r.notes) noted = noted || n.find("ZeRO-Offload not planned") != std::string::npos;
        CHECK(noted);
        CHECK(r.params > 6'000'000'000);
        CHECK(r.launches > 0);
        CHECK(r.gemm_gflop > 0);
        CHECK(r.attn_ms > 0);
        CHECK(r.step_ms_fast > 0);
        CHECK(r.step_ms_fast <= r.step_ms);
        CHECK(r.step_ms <= r.step_ms_slow);
        CHECK(r.mfu_low > 0);
        CHECK(r.mfu_high < 1);
        if (!lora) {
          CHECK(r.trainable_params == r.params);
          full = r;
          continue;
        }
        // The same base, frozen: the adapters train, and no frozen weight's gradient GEMM runs.
        CHECK(r.lora_rank == 8);
        CHECK(r.params == full.params);
        CHECK(r.trainable_params > 0);
        CHECK(r.trainable_params < r.params / 100);
        // Of the full step's GEMMs -- forward (twice: the recipes recompute), dX and dW, each
        // 2 x tokens x weights -- the frozen weights' dW is gone: 3 of 4, plus the adapters'.
        CHECK(r.gemm_gflop < 0.76 * full.gemm_gflop);
        CHECK(r.gemm_gflop > 0.74 * full.gemm_gflop);
      }
    }
  }
  CHECK(recipes >= 4);  // llama3.1-8b, qwen2.5-7b (stage 2), qwen3-8b full and DPO (stage 3)
}
