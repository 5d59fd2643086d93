// bench_plan_run: one training step of a config on a PlanDevice (the real model and ZeRO
// engine, nothing executed), each recorded launch timed by its roofline on the budget
// table, grouped by kernel into the --plan report.
#include "bench/bench_plan.h"

#include "core/check.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <tuple>

namespace dtrain::bench {

using device::PlanEntry;
using device::PlanKind;
using device::PlanUnit;

PlanTime plan_entry_time(const PlanEntry& e, const PlanBudgetTable& t) {
  double peak = 0;  // FLOP/s this entry's unit reaches
  switch (e.unit) {
    case PlanUnit::TENSOR_GEMM: peak = t.tensor_tflops * 1e12 * t.gemm_eff; break;
    case PlanUnit::TENSOR_ATTN_FWD: peak = t.tensor_tflops * 1e12 * t.attn_fwd_eff; break;
    case PlanUnit::TENSOR_ATTN_BWD: peak = t.tensor_tflops * 1e12 * t.attn_bwd_eff; break;
    case PlanUnit::CUDA_CORE: peak = t.fp32_tflops * 1e12 * t.cuda_core_eff; break;
    case PlanUnit::MEMORY:
    case PlanUnit::PCIE: break;
  }
  const double bandwidth = e.unit == PlanUnit::PCIE ? t.pcie_gbps * 1e9 * t.pcie_eff : t.hbm_tbps * 1e12 * t.hbm_eff;
  PlanTime r;
  r.compute = peak > 0 ? e.flops / peak : 0.0;
  r.memory = e.bytes / bandwidth;
  r.floor = static_cast<double>(e.launches) * t.launch_floor_us * 1e-6;
  return r;
}

PlanStep plan_step(const BenchSetup& s) {
  device::PlanDevice dev(device::Kind::CUDA);
  // The engine's fp32 source (a host model under mixed precision) only ever goes through
  // copy_h2d into the masters: a model on a host stand-in, whose storage is fake too.
  device::PlanDevice host(device::Kind::CPU);
  model::Model src(s.model, host, DType::F32);
  model::Model m(s.model, dev, s.dtype);
  if (s.lora) {
    src.lora_enable(*s.lora);
    m.lora_enable(*s.lora);
  }
  m.set_recompute(s.recompute);
  train::TrainStep step(m, &src, nullptr, s.zero, s.step_options());
  train::StepTimer timer;
  const BenchBatch batch = bench_batch(s, 0);
  step.run(1, s.lr, batch.view(), timer);
  dev.record(true);
  step.run(2, s.lr, batch.view(), timer);
  dev.record(false);
  PlanStep r;
  r.entries = dev.take();
  r.params = static_cast<int64_t>(m.num_params());
  r.trainable_params = static_cast<int64_t>(m.num_trainable_params());
  return r;
}

BenchPlanResult bench_plan_run(const BenchTrainOptions& o) {
  DT_ENFORCE(o.device == device::Kind::CUDA, UsageError,
             "bench train --plan budgets a step on the CUDA device; --device {} has no plan (drop --device or use "
             "--device cuda)",
             device::kind_name(o.device));
  const BenchSetup s = bench_setup_from(o.config_path, o.sets, true);
  BenchPlanResult r;
  r.config = o.config_path;
  r.arch = model::arch_name(s.model.arch);
  r.dtype = dtype_name(s.dtype);
  r.driver =
      "the trainer's step: forward + backward per micro-batch, ZeRO engine update (stage 0, one rank); the step after a warm-up";
  r.lora_rank = s.lora ? s.lora->rank : 0;
  r.n_layer = s.model.n_layer;
  r.d_model = s.model.d_model;
  r.micro_batch = s.micro_batch;
  r.seq_len = s.seq_len;
  r.grad_accum = s.grad_accum;
  r.recompute = s.recompute;
  r.notes = s.notes;
  const PlanStep step = plan_step(s);
  r.params = step.params;
  r.trainable_params = step.trainable_params;

  // Group by (op, kernel, unit); sum the time terms to name each group's bound.
  struct Acc {
    PlanRow row;
    double compute = 0, memory = 0, floor = 0;
  };
  std::map<std::tuple<std::string, std::string, PlanUnit>, Acc> groups;
  double total_s = 0, gemm_s = 0, attn_s = 0;
  for (const PlanEntry& e : step.entries) {
    const PlanTime t = plan_entry_time(e, r.table);
    Acc& a = groups[{e.op, e.kernel, e.unit}];
    a.row.op = e.op;
    a.row.kernel = e.kernel;
    a.row.unit = device::plan_unit_name(e.unit);
    a.row.gemm = e.kind == PlanKind::MATMUL;
    a.row.attn = e.unit == PlanUnit::TENSOR_ATTN_FWD || e.unit == PlanUnit::TENSOR_ATTN_BWD;
    a.row.launches += e.launches;
    a.row.gflop += e.flops / 1e9;
    a.row.gbytes += e.bytes / 1e9;
    a.row.ms += t.total() * 1e3;
    a.compute += t.compute;
    a.memory += t.memory;
    a.floor += t.floor;
    total_s += t.total();
    if (a.row.gemm) {
      gemm_s += t.total();
      r.gemm_gflop += e.flops / 1e9;
    } else if (a.row.attn) {
      attn_s += t.total();
      r.attn_gflop += e.flops / 1e9;
    }
    r.total_gflop += e.flops / 1e9;
    r.launches += e.launches;
  }
  for (auto& [key, a] : groups) {
    a.row.bound = a.floor > std::max(a.compute, a.memory) ? "launches" : a.compute >= a.memory ? "compute" : "memory";
    a.row.share = total_s > 0 ? a.row.ms / (total_s * 1e3) : 0.0;
    r.rows.push_back(a.row);
  }
  std::sort(r.rows.begin(), r.rows.end(), [](const PlanRow& a, const PlanRow& b) { return a.ms > b.ms; });
  r.step_ms = total_s * 1e3;
  r.gemm_ms = gemm_s * 1e3;
  r.attn_ms = attn_s * 1e3;
  r.other_ms = r.step_ms - r.gemm_ms - r.attn_ms;
  for (const PlanRow& row : r.rows)
    if (!row.gemm && !row.attn) {
      r.top_other = row.op + ": " + row.kernel;
      r.top_other_share = row.share;
      break;
    }
  const double tokens = static_cast<double>(s.grad_accum) * s.micro_batch * s.seq_len;
  r.tokens_per_s = total_s > 0 ? tokens / total_s : 0.0;
  r.flops_per_token = model_flops_per_token(s.model, r.params, s.seq_len, s.lora.has_value());
  r.flops_formula = model_flops_formula(r.params, r.n_layer, s.seq_len, r.d_model, s.lora.has_value());
  r.mfu = total_s > 0 ? r.flops_per_token * tokens / (total_s * r.table.tensor_tflops * 1e12) : 0.0;
  r.notes.push_back(
      "predicted, not measured: each launch takes max(FLOPs / (peak x cap), bytes / (bandwidth x cap)) "
      "+ the launch floor");
  return r;
}

std::string bench_plan_format(const BenchPlanResult& r, bool json) {
  const PlanBudgetTable& t = r.table;
  if (json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const PlanRow& w : r.rows)
      rows.push_back({{"op", w.op},
                      {"kernel", w.kernel},
                      {"unit", w.unit},
                      {"bound", w.bound},
                      {"gemm", w.gemm},
                      {"launches", w.launches},
                      {"gflop", w.gflop},
                      {"gbytes", w.gbytes},
                      {"ms", w.ms},
                      {"share", w.share}});
    nlohmann::json j{{"config", r.config},
                     {"plan", true},
                     {"gpu", t.gpu},
                     {"driver", r.driver},
                     {"arch", r.arch},
                     {"dtype", r.dtype},
                     {"params", r.params},
                     {"trainable_params", r.trainable_params},
                     {"lora_rank", r.lora_rank},
                     {"n_layer", r.n_layer},
                     {"d_model", r.d_model},
                     {"micro_batch", r.micro_batch},
                     {"seq_len", r.seq_len},
                     {"grad_accum", r.grad_accum},
                     {"recompute", r.recompute},
                     {"tokens_per_step", static_cast<int64_t>(r.micro_batch) * r.seq_len * r.grad_accum},
                     {"budget",
                      {{"tensor_tflops", t.tensor_tflops},
                       {"fp32_tflops", t.fp32_tflops},
                       {"hbm_tbps", t.hbm_tbps},
                       {"pcie_gbps", t.pcie_gbps},
                       {"gemm_eff", t.gemm_eff},
                       {"attn_fwd_eff", t.attn_fwd_eff},
                       {"attn_bwd_eff", t.attn_bwd_eff},
                       {"cuda_core_eff", t.cuda_core_eff},
                       {"hbm_eff", t.hbm_eff},
                       {"pcie_eff", t.pcie_eff},
                       {"launch_floor_us", t.launch_floor_us}}},
                     {"kernels", rows},
                     {"launches", r.launches},
                     {"gemm_ms", r.gemm_ms},
                     {"attn_ms", r.attn_ms},
                     {"other_ms", r.other_ms},
                     {"step_ms", r.step_ms},
                     {"tokens_per_s", r.tokens_per_s},
                     {"gemm_gflop", r.gemm_gflop},
                     {"attn_gflop", r.attn_gflop},
                     {"total_gflop", r.total_gflop},
                     {"flops_per_token", r.flops_per_token},
                     {"flops_formula", r.flops_formula},
                     {"mfu", r.mfu},
                     {"top_other", r.top_other},
                     {"top_other_share", r.top_other_share},
                     {"notes", r.notes}};
    return j.dump() + "\n";
  }
  std::string s;
  s += fmt::format("bench train --plan: {} on {} (predicted: nothing executes)\n", r.config, t.gpu);
  s += fmt::format("model        {} {:.2f}M params ({:.2f}M trainable{}), L={} d_model={}, {}{}\n", r.arch,
                   r.params / 1e6, r.trainable_params / 1e6, r.lora_rank ? fmt::format(", LoRA r={}", r.lora_rank) : "",
                   r.n_layer, r.d_model, r.dtype, r.recompute ? ", recompute" : "");
  s += fmt::format("batch        micro {} x seq {} x accum {} = {} tokens/step\n", r.micro_batch, r.seq_len,
                   r.grad_accum, static_cast<int64_t>(r.micro_batch) * r.seq_len * r.grad_accum);
  s += fmt::format("step         {}\n", r.driver);
  s += fmt::format(
      "budget       tensor {:.0f} TFLOP/s x{:.2f} (cuBLASLt), x{:.2f} / x{:.2f} (attention on mma.sync fwd / bwd); "
      "fp32 {:.0f} TFLOP/s x{:.2f}\n             HBM {:.2f} TB/s x{:.2f}; PCIe {:.0f} GB/s x{:.2f}; "
      "{:.0f} us per launch\n",
      t.tensor_tflops, t.gemm_eff, t.attn_fwd_eff, t.attn_bwd_eff, t.fp32_tflops, t.cuda_core_eff, t.hbm_tbps,
      t.hbm_eff, t.pcie_gbps, t.pcie_eff, t.launch_floor_us);
  size_t wop = 2, wk = 6, wu = 4;
  for (const PlanRow& w : r.rows) {
    wop = std::max(wop, w.op.size());
    wk = std::max(wk, w.kernel.size());
    wu = std::max(wu, w.unit.size());
  }
  s += "\n";
  s += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>8}  {:>6}  {:<{}}  {:<8}  {:>8}  {:>6}\n", "op", wop, "kernel", wk,
                   "launches", "GFLOP", "GB", "unit", wu, "bound", "time ms", "% step");
  for (const PlanRow& w : r.rows)
    s += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>8.1f}  {:>6.2f}  {:<{}}  {:<8}  {:>8.3f}  {:>5.1f}%\n", w.op, wop,
                     w.kernel, wk, w.launches, w.gflop, w.gbytes, w.unit, wu, w.bound, w.ms, 100.0 * w.share);
  s += "\n";
  auto pct = [&](double ms) { return r.step_ms > 0 ? 100.0 * ms / r.step_ms : 0.0; };
  s += fmt::format("GEMM         {:.2f} ms ({:.1f}%), {:.0f} GFLOP (cuBLASLt)\n", r.gemm_ms, pct(r.gemm_ms),
                   r.gemm_gflop);
  s += fmt::format("attention    {:.2f} ms ({:.1f}%), {:.0f} GFLOP (mma.sync on tensor cores)\n", r.attn_ms,
                   pct(r.attn_ms), r.attn_gflop);
  s += fmt::format("other        {:.2f} ms ({:.1f}%); largest: {} ({:.1f}%)\n", r.other_ms, pct(r.other_ms),
                   r.top_other, 100.0 * r.top_other_share);
  s += fmt::format("launches     {}\n", r.launches);
  s += fmt::format("step time    {:.2f} ms (predicted)\n", r.step_ms);
  s += fmt::format("tokens/s     {:.0f}\n", r.tokens_per_s);
  s += fmt::format("model FLOPs  {:.3f} GFLOP/token ({})\n", r.flops_per_token / 1e9, r.flops_formula);
  s += fmt::format("MFU          {:.1f}% of {:.0f} TFLOPS dense bf16 peak\n", 100.0 * r.mfu, t.tensor_tflops);
  for (const auto& n : r.notes) s += "note         " + n + "\n";
  return s;
}

}  // namespace dtrain::bench
