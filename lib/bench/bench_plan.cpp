// bench_plan_run: one training step of a config on a PlanDevice (the real model and ZeRO
// engine, nothing executed), each recorded launch timed by its roofline at both ends of the
// budget's bands on a GPU profile, grouped by kernel into the --plan report with the step's
// time and MFU band and the published anchor beside it.
#include "bench/bench_plan.h"

#include "bench/plan_gemm.h"
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

namespace {

// The attention kernel's variant on this card (kernels/attention_mma.cu's with_stages: two
// stages where they fit the opt-in shared memory, else the one-stage variant where it was
// built), its registers and resident blocks.
PlanKernelFit kernel_fit(const device::PlanLaunch& l, const PlanGpu& g) {
  PlanKernelFit f;
  if (l.smem_two_stages <= g.smem_optin) {
    f.stages = 2;
  } else if (l.one_stage_built && l.smem_one_stage <= g.smem_optin) {
    f.stages = 1;
  } else {
    DT_THROW(
        UsageError,
        "{} at padded head dim {} needs {} bytes of shared memory per block; the {} allows {}: the kernel refuses this shape there",
        l.kernel, l.hdp, l.smem_one_stage, g.label, g.smem_optin);
  }
  f.registers = l.registers ? l.registers : plan_kernel_registers(l.kernel, l.hdp, f.stages, g.sm);
  f.occupancy = blocks_per_sm(g, f.registers, l.threads, f.stages == 2 ? l.smem_two_stages : l.smem_one_stage);
  DT_ENFORCE(f.occupancy.blocks_per_sm > 0, InternalError, "{}: no block fits an SM", l.kernel);
  f.waves = static_cast<double>(l.blocks) / (static_cast<double>(g.sms) * f.occupancy.blocks_per_sm);
  return f;
}

int reference_blocks(const std::string& kernel, const PlanBudgetTable& t) {
  if (kernel == "attn_fwd_mma_kernel") return t.attn_fwd_ref_blocks;
  if (kernel == "attn_bwd_dkdv_kernel") return t.attn_dkdv_ref_blocks;
  return t.attn_dq_ref_blocks;
}

}  // namespace

PlanTime plan_entry_time(const PlanEntry& e, const PlanBudgetTable& t, PlanEnd end, PlanKernelFit* fit) {
  const bool slow = end == PlanEnd::SLOW;
  const PlanGpu& g = t.gpu;
  double peak = 0, bytes = e.bytes;  // FLOP/s this entry's unit reaches; bytes it moves through HBM
  switch (e.unit) {
    case PlanUnit::TENSOR_GEMM: {
      const GemmEfficiency ge = gemm_efficiency(e.matmul.m, e.matmul.n, e.matmul.k, e.matmul.batch);
      peak = g.tensor_tflops * 1e12 * (slow ? ge.low : ge.high);
      break;
    }
    case PlanUnit::TENSOR_ATTN_FWD:
    case PlanUnit::TENSOR_ATTN_BWD: {
      const PlanBand& cap = e.unit == PlanUnit::TENSOR_ATTN_FWD ? t.attn_fwd_eff : t.attn_bwd_eff;
      double eff = slow ? cap.slow : cap.fast;
      if (!e.launch.kernel.empty()) {
        const PlanKernelFit f = kernel_fit(e.launch, g);
        // The caps hold at the reference occupancy; below it the tensor pipes see fewer warps to
        // hide mma.sync and ldmatrix latency (assumed linear); above it no gain is assumed.
        eff *= std::min(1.0, static_cast<double>(f.occupancy.blocks_per_sm) / reference_blocks(e.launch.kernel, t));
        if (slow) {
          eff *= wave_efficiency(e.launch.blocks, static_cast<int64_t>(g.sms) * f.occupancy.blocks_per_sm);
          bytes += e.launch.reread_bytes;
        }
        if (fit) *fit = f;
      }
      peak = g.tensor_tflops * 1e12 * eff;
      break;
    }
    case PlanUnit::CUDA_CORE: peak = g.fp32_tflops * 1e12 * t.cuda_core_eff; break;
    case PlanUnit::MEMORY:
    case PlanUnit::PCIE: break;
  }
  const double bandwidth = e.unit == PlanUnit::PCIE ? g.pcie_gbps * 1e9 * t.pcie_eff
                                                    : g.hbm_tbps * 1e12 * (slow ? t.hbm_eff.slow : t.hbm_eff.fast);
  PlanTime r;
  r.compute = peak > 0 ? e.flops / peak : 0.0;
  r.memory = bytes / bandwidth;
  r.floor = static_cast<double>(e.launches) * t.launch_floor_us * 1e-6;
  return r;
}

PlanStep plan_step(const BenchSetup& s) {
  PlanStep r;
  // ZeRO-Offload's update runs on the host: AdamW over host buffers the size of the model and
  // the copies both ways. A PlanDevice has fake memory and no cost model for host work, so the
  // step is planned with the update on the GPU, and the plan says so (dtrain bench train
  // measures the offloaded step on a GPU).
  train::ZeroOptions zero = s.zero;
  if (zero.offload_optimizer || zero.offload_param) {
    zero.offload_optimizer = zero.offload_param = false;
    r.notes.push_back(
        "ZeRO-Offload not planned: the step is planned with the optimizer and parameters on the GPU; the host "
        "AdamW and the PCIe copies of offload_optimizer/offload_param are not in this budget (dtrain bench train "
        "measures them on a GPU)");
  }
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
  m.set_recompute_layers(s.recompute_layers);
  train::TrainStep step(m, &src, nullptr, zero, s.step_options());
  train::StepTimer timer;
  const BenchBatch batch = bench_batch(s, 0);
  step.run(1, s.lr, batch.view(), timer);
  dev.record(true);
  step.run(2, s.lr, batch.view(), timer);
  dev.record(false);
  r.entries = dev.take();
  r.params = static_cast<int64_t>(m.num_params());
  r.trainable_params = static_cast<int64_t>(m.num_trainable_params());
  return r;
}

namespace {

// llm.c's published GPT-2 124M training rate on an H100 (karpathy/llm.c, about 460K tokens/s
// per GPU at T 1024, the figure issue 29 quotes), at this budget's model FLOPs: 6N + 12 L T d
// with N = 124,475,904 (vocabulary padded to 50304, as llm.c and this repo's config).
PlanAnchor llmc_gpt2_124m(const PlanBudgetTable& t) {
  PlanAnchor a;
  a.what = "llm.c GPT-2 124M (T 1024) on one H100";
  a.tokens_per_s = 460e3;
  const double flops_per_token = 6.0 * 124475904 + 12.0 * 12 * 1024 * 768;
  a.mfu = a.tokens_per_s * flops_per_token / (t.gpu.tensor_tflops * 1e12);
  a.source = "karpathy/llm.c's published rate, as issue 29 quotes it";
  return a;
}

}  // namespace

BenchPlanResult bench_plan_run(const BenchTrainOptions& o, const std::string& gpu) {
  DT_ENFORCE(o.device == device::Kind::CUDA, UsageError,
             "bench train --plan budgets a step on the CUDA device; --device {} has no plan (drop --device or use "
             "--device cuda)",
             device::kind_name(o.device));
  BenchPlanResult r;
  r.table.gpu = plan_gpu(gpu);
  const BenchSetup s = bench_setup_from(o.config_path, o.sets, true);
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
  r.recompute_layers = s.recompute_layers;
  r.notes = s.notes;
  const PlanStep step = plan_step(s);
  r.notes.insert(r.notes.end(), step.notes.begin(), step.notes.end());
  r.params = step.params;
  r.trainable_params = step.trainable_params;

  // Group by (op, kernel, unit); sum the mid-band time terms to name each group's bound.
  struct Acc {
    PlanRow row;
    double compute = 0, memory = 0, floor = 0;
  };
  std::map<std::tuple<std::string, std::string, PlanUnit>, Acc> groups;
  double slow_s = 0, fast_s = 0, gemm_s = 0, attn_s = 0;
  for (const PlanEntry& e : step.entries) {
    PlanKernelFit fit;
    const PlanTime ts = plan_entry_time(e, r.table, PlanEnd::SLOW, &fit);
    const PlanTime tf = plan_entry_time(e, r.table, PlanEnd::FAST);
    const double mid = (ts.total() + tf.total()) / 2;
    Acc& a = groups[{e.op, e.kernel, e.unit}];
    a.row.op = e.op;
    a.row.kernel = e.kernel;
    a.row.unit = device::plan_unit_name(e.unit);
    a.row.gemm = e.kind == PlanKind::MATMUL;
    a.row.attn = e.unit == PlanUnit::TENSOR_ATTN_FWD || e.unit == PlanUnit::TENSOR_ATTN_BWD;
    a.row.launches += e.launches;
    a.row.gflop += e.flops / 1e9;
    a.row.gbytes += e.bytes / 1e9;
    a.row.ms_slow += ts.total() * 1e3;
    a.row.ms_fast += tf.total() * 1e3;
    a.row.ms += mid * 1e3;
    if (fit.stages)
      a.row.occupancy =
          fmt::format("{} blocks/SM ({}{}), {:.2f} waves", fit.occupancy.blocks_per_sm, fit.occupancy.limit,
                      fit.registers ? fmt::format(", {} regs", fit.registers) : ", no register data", fit.waves);
    a.compute += (ts.compute + tf.compute) / 2;
    a.memory += (ts.memory + tf.memory) / 2;
    a.floor += (ts.floor + tf.floor) / 2;
    slow_s += ts.total();
    fast_s += tf.total();
    if (a.row.gemm) {
      gemm_s += mid;
      r.gemm_gflop += e.flops / 1e9;
    } else if (a.row.attn) {
      attn_s += mid;
      r.attn_gflop += e.flops / 1e9;
    }
    r.total_gflop += e.flops / 1e9;
    r.launches += e.launches;
  }
  const double mid_s = (slow_s + fast_s) / 2;
  for (auto& [key, a] : groups) {
    a.row.bound = a.floor > std::max(a.compute, a.memory) ? "launches" : a.compute >= a.memory ? "compute" : "memory";
    a.row.share = mid_s > 0 ? a.row.ms / (mid_s * 1e3) : 0.0;
    r.rows.push_back(a.row);
  }
  std::sort(r.rows.begin(), r.rows.end(), [](const PlanRow& a, const PlanRow& b) { return a.ms > b.ms; });
  r.step_ms = mid_s * 1e3;
  r.step_ms_slow = slow_s * 1e3;
  r.step_ms_fast = fast_s * 1e3;
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
  r.tokens_per_s = mid_s > 0 ? tokens / mid_s : 0.0;
  r.flops_per_token = model_flops_per_token(s.model, r.params, s.seq_len, s.lora.has_value());
  r.flops_formula = model_flops_formula(r.params, r.n_layer, s.seq_len, r.d_model, s.lora.has_value());
  const double step_flops = r.flops_per_token * tokens, peak = r.table.gpu.tensor_tflops * 1e12;
  r.mfu = mid_s > 0 ? step_flops / (mid_s * peak) : 0.0;
  r.mfu_low = slow_s > 0 ? step_flops / (slow_s * peak) : 0.0;
  r.mfu_high = fast_s > 0 ? step_flops / (fast_s * peak) : 0.0;
  r.anchors.push_back(llmc_gpt2_124m(r.table));
  r.notes.push_back(
      "predicted, not measured: a model (see docs/gpu.md); each launch takes max(FLOPs / (peak x cap), bytes / "
      "(bandwidth x cap)) + the launch floor at both ends of each cap's band");
  return r;
}

std::string bench_plan_format(const BenchPlanResult& r, bool json) {
  const PlanBudgetTable& t = r.table;
  const PlanGpu& g = t.gpu;
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
                      {"ms_slow", w.ms_slow},
                      {"ms_fast", w.ms_fast},
                      {"share", w.share},
                      {"occupancy", w.occupancy}});
    nlohmann::json anchors = nlohmann::json::array();
    for (const PlanAnchor& a : r.anchors)
      anchors.push_back({{"what", a.what}, {"tokens_per_s", a.tokens_per_s}, {"mfu", a.mfu}, {"source", a.source}});
    nlohmann::json j{
        {"config", r.config},
        {"plan", true},
        {"gpu", g.label},
        {"gpu_profile", g.name},
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
        {"recompute", r.recompute_layers > 0},
        {"recompute_layers", r.recompute_layers},
        {"tokens_per_step", static_cast<int64_t>(r.micro_batch) * r.seq_len * r.grad_accum},
        {"budget",
         {{"tensor_tflops", g.tensor_tflops},
          {"fp32_tflops", g.fp32_tflops},
          {"hbm_tbps", g.hbm_tbps},
          {"pcie_gbps", g.pcie_gbps},
          {"sms", g.sms},
          {"gemm_eff", "shape-dependent (lib/bench/plan_gemm.h)"},
          {"attn_fwd_eff", {t.attn_fwd_eff.slow, t.attn_fwd_eff.fast}},
          {"attn_bwd_eff", {t.attn_bwd_eff.slow, t.attn_bwd_eff.fast}},
          {"attn_ref_blocks_per_sm",
           {{"fwd", t.attn_fwd_ref_blocks}, {"dkdv", t.attn_dkdv_ref_blocks}, {"dq", t.attn_dq_ref_blocks}}},
          {"cuda_core_eff", t.cuda_core_eff},
          {"hbm_eff", {t.hbm_eff.slow, t.hbm_eff.fast}},
          {"pcie_eff", t.pcie_eff},
          {"launch_floor_us", t.launch_floor_us}}},
        {"kernels", rows},
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
        {"total_gflop", r.total_gflop},
        {"flops_per_token", r.flops_per_token},
        {"flops_formula", r.flops_formula},
        {"mfu", r.mfu},
        {"mfu_low", r.mfu_low},
        {"mfu_high", r.mfu_high},
        {"anchors", anchors},
        {"top_other", r.top_other},
        {"top_other_share", r.top_other_share},
        {"notes", r.notes}};
    return j.dump() + "\n";
  }
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
  size_t wop = 2, wk = 6, wu = 4;
  for (const PlanRow& w : r.rows) {
    wop = std::max(wop, w.op.size());
    wk = std::max(wk, w.kernel.size());
    wu = std::max(wu, w.unit.size());
  }
  s += "\n";
  s += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>8}  {:>6}  {:<{}}  {:<8}  {:>15}  {:>6}  {}\n", "op", wop, "kernel", wk,
                   "launches", "GFLOP", "GB", "unit", wu, "bound", "time ms", "% step", "occupancy");
  for (const PlanRow& w : r.rows)
    s += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>8.1f}  {:>6.2f}  {:<{}}  {:<8}  {:>7.3f}-{:<7.3f}  {:>5.1f}%  {}\n",
                     w.op, wop, w.kernel, wk, w.launches, w.gflop, w.gbytes, w.unit, wu, w.bound, w.ms_fast, w.ms_slow,
                     100.0 * w.share, w.occupancy);
  s += "\n";
  auto pct = [&](double ms) { return r.step_ms > 0 ? 100.0 * ms / r.step_ms : 0.0; };
  s += fmt::format("GEMM         {:.2f} ms ({:.1f}%), {:.0f} GFLOP (cuBLASLt)\n", r.gemm_ms, pct(r.gemm_ms),
                   r.gemm_gflop);
  s += fmt::format("attention    {:.2f} ms ({:.1f}%), {:.0f} GFLOP (mma.sync on tensor cores)\n", r.attn_ms,
                   pct(r.attn_ms), r.attn_gflop);
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
                   100.0 * r.mfu_low, 100.0 * r.mfu_high, g.tensor_tflops, 100.0 * r.mfu);
  for (const PlanAnchor& a : r.anchors)
    s += fmt::format("anchor       {}: {:.0f}K tokens/s = {:.1f}% MFU by this formula ({})\n", a.what,
                     a.tokens_per_s / 1e3, 100.0 * a.mfu, a.source);
  for (const auto& n : r.notes) s += "note         " + n + "\n";
  return s;
}

}  // namespace dtrain::bench
