// bench_plan_format: the --plan report of a BenchPlanResult, as a table (the setup and the
// budget's figures, one row per kernel group, the GEMM / attention / other split, step time,
// tokens/s, MFU band and anchors) or as one JSON object with the same figures.
#include "plan/bench_plan.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace dtrain::plan {

namespace {

// ----------------------------------------------------------------------------
// JSON

nlohmann::json rows_json(const std::vector<PlanRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const PlanRow& w : rows)
    j.push_back({{"op", w.op},
                 {"kernel", w.kernel},
                 {"unit", w.unit},
                 {"bound", w.bound},
                 {"gemm", w.gemm},
                 {"launches", w.launches},
                 {"gflop", w.gflop},
                 {"gbytes", w.gbytes},
                 {"ms", w.ms},
                 {"ms_slow", w.ms_slow},
                 {"ms_fast", w.ms_fast},
                 {"share", w.share},
                 {"occupancy", w.occupancy}});
  return j;
}

nlohmann::json budget_json(const PlanBudgetTable& t) {
  const PlanGpu& g = t.gpu;
  // (gemm_eff names the table's header where it was when this format was fixed; it is now
  // lib/plan/plan_gemm.h: the report's text is kept as it was.)
  return {{"tensor_tflops", g.tensor_tflops},
          {"fp32_tflops", g.fp32_tflops},
          {"hbm_tbps", g.hbm_tbps},
          {"pcie_gbps", g.pcie_gbps},
          {"sms", g.sms},
          {"gemm_eff", "shape-dependent (lib/plan/plan_gemm.h)"},
          {"attn_fwd_eff", {t.attn_fwd_eff.slow, t.attn_fwd_eff.fast}},
          {"attn_bwd_eff", {t.attn_bwd_eff.slow, t.attn_bwd_eff.fast}},
          {"attn_hopper_fwd_eff", {t.attn_hopper_fwd_eff.slow, t.attn_hopper_fwd_eff.fast}},
          {"attn_ref_blocks_per_sm",
           {{"fwd", t.attn_fwd_ref_blocks},
            {"dkdv", t.attn_dkdv_ref_blocks},
            {"dq", t.attn_dq_ref_blocks},
            {"hopper_fwd", t.attn_hopper_fwd_ref_blocks}}},
          {"cuda_core_eff", t.cuda_core_eff},
          {"hbm_eff", {t.hbm_eff.slow, t.hbm_eff.fast}},
          {"pcie_eff", t.pcie_eff},
          {"launch_floor_us", t.launch_floor_us}};
}

nlohmann::json plan_json(const BenchPlanResult& r) {
  nlohmann::json anchors = nlohmann::json::array();
  for (const PlanAnchor& a : r.anchors)
    anchors.push_back({{"what", a.what}, {"tokens_per_s", a.tokens_per_s}, {"mfu", a.mfu}, {"source", a.source}});
  const PlanGpu& g = r.table.gpu;
  nlohmann::json j = train::step_shape_json(r);
  j.update(nlohmann::json{{"plan", true},
                          {"gpu", g.label},
                          {"gpu_profile", g.name},
                          {"driver", r.driver},
                          {"recompute", r.recompute_layers > 0},
                          {"recompute_layers", r.recompute_layers},
                          {"budget", budget_json(r.table)},
                          {"kernels", rows_json(r.rows)},
                          {"launches", r.launches},
                          {"gemm_ms", r.gemm_ms},
                          {"attn_ms", r.attn_ms},
                          {"other_ms", r.other_ms},
                          {"step_ms", r.step_ms},
                          {"step_ms_slow", r.step_ms_slow},
                          {"step_ms_fast", r.step_ms_fast},
                          {"tokens_per_s", r.tokens_per_s},
                          {"gemm_gflop", r.gemm_gflop},
                          {"attn_gflop", r.attn_gflop},
                          {"attn_hopper_fwd", r.attn_hopper_fwd},
                          {"total_gflop", r.total_gflop},
                          {"flops_per_token", r.flops_per_token},
                          {"flops_formula", r.flops_formula},
                          {"mfu", r.mfu},
                          {"mfu_low", r.mfu_low},
                          {"mfu_high", r.mfu_high},
                          {"anchors", anchors},
                          {"top_other", r.top_other},
                          {"top_other_share", r.top_other_share},
                          {"notes", r.notes}});
  return j;
}

// ----------------------------------------------------------------------------
// Table

// What was planned: the model, the batch, the step and the budget's caps.
std::string setup_text(const BenchPlanResult& r) {
  const PlanBudgetTable& t = r.table;
  const PlanGpu& g = t.gpu;
  std::string s;
  s += fmt::format("bench train --plan: {} on {} (predicted: nothing executes)\n", r.config, g.label);
  s += fmt::format("model        {} {:.2f}M params ({:.2f}M trainable{}), L={} d_model={}, {}{}\n", r.arch,
                   r.params / 1e6, r.trainable_params / 1e6, r.lora_rank ? fmt::format(", LoRA r={}", r.lora_rank) : "",
                   r.n_layer, r.d_model, r.dtype,
                   r.recompute_layers == r.n_layer ? std::string(", recompute")
                   : r.recompute_layers > 0 ? fmt::format(", recompute {} of {} layers", r.recompute_layers, r.n_layer)
                                            : std::string());
  s += fmt::format("batch        micro {} x seq {} x accum {} = {} tokens/step\n", r.micro_batch, r.seq_len,
                   r.grad_accum, static_cast<int64_t>(r.micro_batch) * r.seq_len * r.grad_accum);
  s += fmt::format("step         {}\n", r.driver);
  s += fmt::format(
      "budget       {} SMs; tensor {:.0f} TFLOP/s: cuBLASLt x shape-dependent (published H100 cuBLAS rates), "
      "attention on mma.sync x{:.2f}-{:.2f} / x{:.2f}-{:.2f} fwd / bwd (measured, at {}/{}/{} blocks per SM); "
      "fp32 {:.0f} TFLOP/s x{:.2f}\n             HBM {:.2f} TB/s x{:.2f}-{:.2f}; PCIe {:.0f} GB/s x{:.2f}; "
      "{:.0f} us per launch\n",
      g.sms, g.tensor_tflops, t.attn_fwd_eff.slow, t.attn_fwd_eff.fast, t.attn_bwd_eff.slow, t.attn_bwd_eff.fast,
      t.attn_fwd_ref_blocks, t.attn_dkdv_ref_blocks, t.attn_dq_ref_blocks, g.fp32_tflops, t.cuda_core_eff, g.hbm_tbps,
      t.hbm_eff.slow, t.hbm_eff.fast, g.pcie_gbps, t.pcie_eff, t.launch_floor_us);
  if (r.attn_hopper_fwd)
    s += fmt::format(
        "             attention forward on wgmma (hopper) x{:.2f}-{:.2f} (not measured: mma.sync's), at {} "
        "block per SM\n",
        t.attn_hopper_fwd_eff.slow, t.attn_hopper_fwd_eff.fast, t.attn_hopper_fwd_ref_blocks);
  return s;
}

// One line per kernel group, the columns as wide as their longest entry.
std::string rows_text(const std::vector<PlanRow>& rows) {
  size_t wop = 2, wk = 6, wu = 4;
  for (const PlanRow& w : rows) {
    wop = std::max(wop, w.op.size());
    wk = std::max(wk, w.kernel.size());
    wu = std::max(wu, w.unit.size());
  }
  std::string s =
      fmt::format("{:<{}}  {:<{}}  {:>8}  {:>8}  {:>6}  {:<{}}  {:<8}  {:>15}  {:>6}  {}\n", "op", wop, "kernel", wk,
                  "launches", "GFLOP", "GB", "unit", wu, "bound", "time ms", "% step", "occupancy");
  for (const PlanRow& w : rows)
    s += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>8.1f}  {:>6.2f}  {:<{}}  {:<8}  {:>7.3f}-{:<7.3f}  {:>5.1f}%  {}\n",
                     w.op, wop, w.kernel, wk, w.launches, w.gflop, w.gbytes, w.unit, wu, w.bound, w.ms_fast, w.ms_slow,
                     100.0 * w.share, w.occupancy);
  return s;
}

// The step: GEMM / attention / other, launches, time, tokens/s, model FLOPs, MFU, the
// anchors and the notes.
std::string step_text(const BenchPlanResult& r) {
  auto pct = [&](double ms) { return r.step_ms > 0 ? 100.0 * ms / r.step_ms : 0.0; };
  std::string s;
  s += fmt::format("GEMM         {:.2f} ms ({:.1f}%), {:.0f} GFLOP (cuBLASLt)\n", r.gemm_ms, pct(r.gemm_ms),
                   r.gemm_gflop);
  s += fmt::format("attention    {:.2f} ms ({:.1f}%), {:.0f} GFLOP ({} on tensor cores)\n", r.attn_ms, pct(r.attn_ms),
                   r.attn_gflop, r.attn_hopper_fwd ? "forward on wgmma, backward on mma.sync" : "mma.sync");
  s += fmt::format("other        {:.2f} ms ({:.1f}%); largest: {} ({:.1f}%)\n", r.other_ms, pct(r.other_ms),
                   r.top_other, 100.0 * r.top_other_share);
  s += fmt::format("launches     {}\n", r.launches);
  s += fmt::format("step time    {:.2f} - {:.2f} ms (predicted band; mid {:.2f})\n", r.step_ms_fast, r.step_ms_slow,
                   r.step_ms);
  const double tokens = static_cast<double>(r.micro_batch) * r.seq_len * r.grad_accum;
  s += fmt::format("tokens/s     {:.0f} - {:.0f} (mid {:.0f})\n",
                   r.step_ms_slow > 0 ? tokens / (r.step_ms_slow / 1e3) : 0.0,
                   r.step_ms_fast > 0 ? tokens / (r.step_ms_fast / 1e3) : 0.0, r.tokens_per_s);
  s += fmt::format("model FLOPs  {:.3f} GFLOP/token ({})\n", r.flops_per_token / 1e9, r.flops_formula);
  s += fmt::format("MFU          {:.1f}% - {:.1f}% of {:.0f} TFLOPS dense bf16 peak (predicted band; mid {:.1f}%)\n",
                   100.0 * r.mfu_low, 100.0 * r.mfu_high, r.table.gpu.tensor_tflops, 100.0 * r.mfu);
  for (const PlanAnchor& a : r.anchors)
    s += fmt::format("anchor       {}: {:.0f}K tokens/s = {:.1f}% MFU by this formula ({})\n", a.what,
                     a.tokens_per_s / 1e3, 100.0 * a.mfu, a.source);
  for (const auto& n : r.notes) s += "note         " + n + "\n";
  return s;
}

}  // namespace

std::string bench_plan_format(const BenchPlanResult& r, bool json) {
  if (json) return plan_json(r).dump() + "\n";
  return setup_text(r) + "\n" + rows_text(r.rows) + "\n" + step_text(r);
}

}  // namespace dtrain::plan
