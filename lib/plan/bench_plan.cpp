// bench_plan_run: one training step of a config on a PlanDevice (the real model and ZeRO
// engine, nothing executed), each recorded launch timed by its roofline at both ends of the
// budget's bands on a GPU profile, grouped by kernel into the --plan report with the step's
// time and MFU band and the published anchor beside it.
#include "plan/bench_plan.h"

#include "plan/plan_gemm.h"
#include "core/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace dtrain::plan {

using device::PlanEntry;
using device::PlanKind;
using device::PlanUnit;
using train::model_flops_formula;
using train::model_flops_per_token;
using train::step_setup_from;
using train::step_shape_set;
using train::StepSetup;
using train::synthetic_batch;
using train::SyntheticBatch;

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
  if (kernel == "attn_fwd_hopper_kernel") return t.attn_hopper_fwd_ref_blocks;
  if (kernel == "attn_bwd_dkdv_kernel") return t.attn_dkdv_ref_blocks;
  DT_ENFORCE(kernel == "attn_bwd_dq_kernel", InternalError, "no reference occupancy for attention kernel {}", kernel);
  return t.attn_dq_ref_blocks;
}

// What plan_step says of the attention variant it priced (PlanDevice::attention_variant):
// nothing for legacy's kernels or a step without tensor-core attention (fp32).
std::vector<std::string> variant_notes(const std::string& variant, const std::vector<PlanEntry>& entries) {
  bool tensor = false, hopper = false;
  for (const PlanEntry& e : entries) {
    tensor = tensor || e.unit == PlanUnit::TENSOR_ATTN_FWD || e.unit == PlanUnit::TENSOR_ATTN_BWD;
    hopper = hopper || e.launch.kernel == "attn_fwd_hopper_kernel";
  }
  if (!tensor || variant == "legacy") return {};
  if (variant == "fa2")
    return {
        "DTRAIN_ATTN_VARIANT=fa2: the attention is priced as the legacy variant's kernels (fa2's 128-row "
        "forward and dQ tiles are not modelled)"};
  if (hopper)
    return {
        "DTRAIN_ATTN_VARIANT=hopper: the attention forward is the sm_90a wgmma kernel (its own launch: 288 "
        "threads, its shared memory and registers), priced at the mma.sync forward's measured band "
        "(attn_hopper_fwd_eff: no GPU has timed it yet); its backward, fa2's, is priced as the legacy variant's "
        "kernels"};
  return {
      "DTRAIN_ATTN_VARIANT=hopper: its forward does not run on this card or shape (it needs compute capability "
      "9.0, head dim 64 or 128, bf16/fp16), so fa2's kernels run, priced as the legacy variant's (fa2's "
      "128-row tiles are not modelled)"};
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
      const PlanBand& cap = e.unit == PlanUnit::TENSOR_ATTN_BWD           ? t.attn_bwd_eff
                            : e.launch.kernel == "attn_fwd_hopper_kernel" ? t.attn_hopper_fwd_eff
                                                                          : t.attn_fwd_eff;
      double eff = slow ? cap.slow : cap.fast;
      if (!e.launch.kernel.empty()) {
        const PlanKernelFit f = kernel_fit(e.launch, g);
        // The caps hold at the reference occupancy; below it the tensor pipes see fewer warps to
        // hide mma.sync and ldmatrix latency (assumed linear); above it no gain is assumed. (The
        // hopper forward's reference is its design's one block per SM.)
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

PlanStep plan_step(const StepSetup& s, size_t smem_optin, int sm) {
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
  dev.set_smem_optin(smem_optin);
  dev.set_compute_capability(sm);
  // The engine's fp32 source (a host model under mixed precision) only ever goes through
  // copy_h2d / copy_h2d_cast into the masters (and, at stage 3 under LoRA, the frozen
  // 16-bit shards): a model on a host stand-in, whose storage is fake too.
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
  const SyntheticBatch batch = synthetic_batch(s, 0);
  step.run(1, s.lr, batch.view(), timer);
  dev.record(true);
  step.run(2, s.lr, batch.view(), timer);
  dev.record(false);
  r.entries = dev.take();
  for (std::string& n : variant_notes(dev.attention_variant(), r.entries)) r.notes.push_back(std::move(n));
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

namespace {

// What the setup says of the run: its config, model, batch and what drove the step.
BenchPlanResult plan_result_of(const BenchPlanOptions& o, const StepSetup& s) {
  BenchPlanResult r;
  step_shape_set(r, o.config_path, s);
  r.driver = fmt::format(
      "the trainer's step: forward + backward per micro-batch, ZeRO engine update (stage {}, one rank); the step after "
      "a warm-up",
      s.zero.stage);
  r.recompute_layers = s.recompute_layers;
  r.notes = s.notes;
  return r;
}

// The step's seconds at each end of the bands, and the GEMMs' and attention's (mid-band).
struct StepSeconds {
  double slow = 0, fast = 0, gemm = 0, attn = 0;
  double mid() const { return (slow + fast) / 2; }
};

// Each entry timed at both ends of the bands and grouped by (op, kernel, unit) into r.rows,
// longest first, with the executed FLOPs and launches; the mid-band time terms summed per
// group name its bound.
StepSeconds price_rows(const std::vector<PlanEntry>& entries, BenchPlanResult& r) {
  struct Acc {
    PlanRow row;
    double compute = 0, memory = 0, floor = 0;
  };
  std::map<std::tuple<std::string, std::string, PlanUnit>, Acc> groups;
  StepSeconds t;
  for (const PlanEntry& e : entries) {
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
    r.attn_hopper_fwd = r.attn_hopper_fwd || e.launch.kernel == "attn_fwd_hopper_kernel";
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
    t.slow += ts.total();
    t.fast += tf.total();
    if (a.row.gemm) {
      t.gemm += mid;
      r.gemm_gflop += e.flops / 1e9;
    } else if (a.row.attn) {
      t.attn += mid;
      r.attn_gflop += e.flops / 1e9;
    }
    r.total_gflop += e.flops / 1e9;
    r.launches += e.launches;
  }
  const double mid_s = t.mid();
  for (auto& [key, a] : groups) {
    a.row.bound = a.floor > std::max(a.compute, a.memory) ? "launches" : a.compute >= a.memory ? "compute" : "memory";
    a.row.share = mid_s > 0 ? a.row.ms / (mid_s * 1e3) : 0.0;
    r.rows.push_back(a.row);
  }
  std::sort(r.rows.begin(), r.rows.end(), [](const PlanRow& a, const PlanRow& b) { return a.ms > b.ms; });
  return t;
}

// The step's times, its largest row outside GEMMs and attention, tokens/s and the MFU band.
void step_figures(BenchPlanResult& r, const StepSeconds& t, const StepSetup& s) {
  const double mid_s = t.mid();
  r.step_ms = mid_s * 1e3;
  r.step_ms_slow = t.slow * 1e3;
  r.step_ms_fast = t.fast * 1e3;
  r.gemm_ms = t.gemm * 1e3;
  r.attn_ms = t.attn * 1e3;
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
  r.mfu_low = t.slow > 0 ? step_flops / (t.slow * peak) : 0.0;
  r.mfu_high = t.fast > 0 ? step_flops / (t.fast * peak) : 0.0;
}

}  // namespace

BenchPlanResult bench_plan_run(const BenchPlanOptions& o, const std::string& gpu) {
  DT_ENFORCE(o.device == device::Kind::CUDA, UsageError,
             "bench train --plan budgets a step on the CUDA device; --device {} has no plan (drop --device or use "
             "--device cuda)",
             device::kind_name(o.device));
  const PlanGpu& g = plan_gpu(gpu);
  const StepSetup s = step_setup_from(o.config_path, o.sets, true);
  BenchPlanResult r = plan_result_of(o, s);
  r.table.gpu = g;
  const PlanStep step = plan_step(s, g.smem_optin, g.sm);
  r.notes.insert(r.notes.end(), step.notes.begin(), step.notes.end());
  r.params = step.params;
  r.trainable_params = step.trainable_params;
  step_figures(r, price_rows(step.entries, r), s);
  r.anchors.push_back(llmc_gpt2_124m(r.table));
  r.notes.push_back(
      "predicted, not measured: a model (see docs/gpu.md); each launch takes max(FLOPs / (peak x cap), bytes / "
      "(bandwidth x cap)) + the launch floor at both ends of each cap's band");
  return r;
}

}  // namespace dtrain::plan
