// The per-rank memory plan (memory_plan.h): DeepSpeed's ZeRO formulas over the model's
// own buffer layout, the same ones ZeroEngine::memory() reports as its theory.
#include "train/memory_plan.h"

#include "core/check.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/model_factory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dtrain::train {

namespace {

double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

// Bytes as GiB, or MiB below one GiB.
std::string bytes(double b) {
  return b >= 1024.0 * 1024.0 * 1024.0 ? fmt::format("{:.2f} GiB", gib(b)) : fmt::format("{:.1f} MiB", b / 1048576.0);
}

// A parameter count as 1.54B or 0.14M.
std::string count(double n) { return n >= 1e9 ? fmt::format("{:.2f}B", n / 1e9) : fmt::format("{:.2f}M", n / 1e6); }

}  // namespace

MemoryPlan memory_plan(const config::TrainConfig& cfg, int world) {
  MemoryPlan p;
  p.world = std::max(1, world);
  p.stage = cfg.zero.stage;
  p.cuda = cfg.training.device == "cuda";
  p.mixed = cfg.bf16.enabled || cfg.fp16.enabled;
  p.lora = cfg.lora.enabled();
  p.deferred = p.stage == 3 || p.cuda;
  const model::ModelConfig mc = model_config_from(cfg);
  for (const auto& b : model::layout_build(mc)) {
    p.params += static_cast<double>(b.size);
    p.largest_buffer = std::max(p.largest_buffer, static_cast<double>(b.size));
  }
  p.trainable = p.params;
  if (p.lora) {
    // The adapters' size from the layouts lora_enable builds (no adapter is allocated or
    // initialised: an 8B model's are 40M values).
    const model::LoraConfig lc = lora_config_from(cfg, mc);
    lc.validate(mc);
    p.trainable = 0;
    for (const auto& b : model::lora_layout_build(mc, lc)) p.trainable += static_cast<double>(b.size);
  }
  // Under LoRA the base is frozen and the adapters are extra parameters; otherwise every
  // parameter trains.
  const double W = p.world, Phi = p.params, Psi = p.trainable, frozen = p.lora ? Phi : 0.0,
               held = p.lora ? Phi + Psi : Phi;
  const double c = p.cuda && p.mixed ? 2 : 4;  // bytes of the compute copy (the CPU computes in fp32)
  const double K = p.mixed ? 12 : 8;           // fp32 master (mixed only) + AdamW m and v
  const int st = p.stage;
  if (st < 3) {
    p.param_bytes = c * held;
  } else {
    // The frozen buffers' shards in the compute dtype, the trainable ones' fp32 master
    // shard where it is the parameter (fp32), and the two layers gathered at a time (the
    // one computing, the one prefetched).
    p.param_bytes = c * frozen / W + (p.mixed ? 0 : 4 * Psi / W) + 2 * c * p.largest_buffer;
  }
  p.grad_bytes = 4 * (st >= 2 ? Psi / W : Psi);
  p.optim_bytes = K * (st == 0 ? Psi : Psi / W);
  // ZeRO-Offload (GPU ranks; a CPU rank's state is in host memory already): the fp32
  // master, m, v and gradient shard (16 Psi / W), their landing buffer at stages 2-3
  // (4 Psi / W) and the 16-bit copy the update sends back (2 Psi / W) go to the host; the
  // device keeps its compute copy (at stage 3 the shards, unless offload_param moves them
  // too) and stage 1's full gradient.
  if (p.cuda && cfg.zero.offload_optimizer_device == "cpu" && st >= 1) {
    p.offload_optimizer = true;
    p.offload_param = st == 3 && cfg.zero.offload_param_device == "cpu";
    const double opt_host = (16 + (st >= 2 ? 4 : 0) + (p.mixed ? 2 : 0)) * Psi / W;
    p.offload_bytes = opt_host;
    if (cfg.zero.offload_optimizer_pin_memory) p.pinned_bytes += opt_host;
    if (st == 3) {
      p.param_bytes = (p.offload_param ? 0 : c * held / W) + 2 * c * p.largest_buffer;
      if (p.offload_param) {
        p.offload_bytes += c * frozen / W;
        if (cfg.zero.offload_param_pin_memory) p.pinned_bytes += c * frozen / W;
      }
    }
    p.grad_bytes = st == 1 ? 4 * Psi : 0;
    p.optim_bytes = 0;
  }
  // The CPU's bf16/fp16 keeps exact fp32 masters of the frozen buffers too.
  if (p.mixed && !p.cuda && st < 3) p.optim_bytes += 4 * (st == 0 ? frozen : frozen / W);
  const double T = cfg.data.seq_len ? static_cast<double>(*cfg.data.seq_len) : static_cast<double>(mc.max_seq_len);
  // A preference micro-batch of n pairs runs 2n rows (chosen and rejected).
  const double rows = cfg.training.stage == "dpo" ? 2.0 : 1.0;
  const double N = rows * static_cast<double>(std::max<int64_t>(1, cfg.resolved_micro_batch_size)) * T;
  const double g = static_cast<double>(std::max<int64_t>(1, cfg.resolved_grad_accum_steps));
  const double es = p.cuda && p.mixed ? 2 : 4, L = mc.n_layer, C = mc.d_model, F = mc.d_ff, V = mc.vocab_size;
  // Per layer the residual, two norms, the attention output and the MLP's hidden values,
  // then the logits; with recomputation only each layer's input plus one layer's worth.
  const double layer = 4 * C + 2 * F;
  p.activation_bytes = N * es * ((cfg.activation_checkpointing.enabled ? L * C + layer : L * layer) + V);
  p.batch_bytes = g * N * 2 * sizeof(int32_t);
  // One buffer's fp32 values at a time (and on a GPU its compute-dtype staging copy too).
  if (p.deferred) p.build_peak_bytes = (p.cuda ? 4 + c : 4) * p.largest_buffer;
  return p;
}

std::string memory_plan_text(const MemoryPlan& p, int ranks_here, double memory_bytes, double gpu_bytes,
                             int ranks_per_node) {
  std::string s =
      fmt::format("memory per rank (ZeRO stage {}, {} rank(s), {} parameters, {} trainable{}, {} on the {}):\n",
                  p.stage, p.world, count(p.params), count(p.trainable), p.lora ? " (LoRA)" : "",
                  p.mixed ? "mixed precision" : "fp32", p.cuda ? "GPU" : "CPU");
  const std::string state = fmt::format("params {}, grads {}, optimizer {}, activations {}", bytes(p.param_bytes),
                                        bytes(p.grad_bytes), bytes(p.optim_bytes), bytes(p.activation_bytes));
  if (p.cuda) {
    s += fmt::format("  device {}: {}{}\n", bytes(p.device_bytes()), state,
                     gpu_bytes > 0 ? fmt::format(" (of {} per GPU: {})", bytes(gpu_bytes),
                                                 p.device_bytes() > gpu_bytes ? "does NOT fit" : "fits")
                                   : "");
    if (p.offload_optimizer)
      s += fmt::format("  host   {}: offloaded {} ({}{}; {} pinned), building {}, token ids {}\n",
                       bytes(p.host_bytes()), bytes(p.offload_bytes), "optimizer state and gradient shards",
                       p.offload_param ? " + parameter shards" : "", bytes(p.pinned_bytes), bytes(p.build_peak_bytes),
                       bytes(p.batch_bytes));
    else
      s += fmt::format(
          "  host   {}: building {} (one layer's values at a time: no host copy of the model), token ids {}\n",
          bytes(p.host_bytes()), bytes(p.build_peak_bytes), bytes(p.batch_bytes));
  } else {
    s += fmt::format("  host   {}: {}, token ids {}{}\n", bytes(p.host_bytes()), state, bytes(p.batch_bytes),
                     p.deferred ? fmt::format(", building {} (one layer's fp32 values at a time: the model is never "
                                              "whole on a rank)",
                                              bytes(p.build_peak_bytes))
                                : "");
  }
  if (ranks_here > 0 && memory_bytes > 0)
    s += fmt::format("  this machine: {} rank(s) x {} = {} of host memory, of {}\n", ranks_here, bytes(p.host_bytes()),
                     bytes(ranks_here * p.host_bytes()), bytes(memory_bytes));
  if (ranks_per_node > 0)
    s += fmt::format("  per node: {} rank(s) x {} = {} of host memory (the planned nodes' own is not known here)\n",
                     ranks_per_node, bytes(p.host_bytes()), bytes(ranks_per_node * p.host_bytes()));
  s += "  (a plan from DeepSpeed's ZeRO formulas and the model's layout, not a measurement; allocator slack, "
       "communication buffers and the CUDA context are not counted)\n";
  return s;
}

void memory_plan_check(const MemoryPlan& p, int ranks_here, double memory_bytes, const std::string& source,
                       double gpu_bytes) {
  if (p.cuda && gpu_bytes > 0 && p.device_bytes() > gpu_bytes) {
    std::string hint;
    if (p.stage < 3) hint = "raise zero_optimization.stage (3 shards the parameters too), ";
    if (!p.offload_optimizer) hint += "offload the optimizer (zero_optimization.offload_optimizer.device: cpu), ";
    else if (p.stage == 3 && !p.offload_param) hint += "offload the parameters (offload_param.device: cpu), ";
    hint += "run on more GPUs, use LoRA or activation checkpointing, or a smaller micro-batch";
    DT_THROW(ConfigError,
             "{}: a GPU rank needs {} of device memory (params {}, grads {}, optimizer {}, activations {}: ZeRO stage "
             "{}{}, {} parameters, {} trainable; see --dry-run) but each GPU here has {}: {}",
             source, bytes(p.device_bytes()), bytes(p.param_bytes), bytes(p.grad_bytes), bytes(p.optim_bytes),
             bytes(p.activation_bytes), p.stage, p.offload_optimizer ? " with offload" : "", count(p.params),
             count(p.trainable), bytes(gpu_bytes), hint);
  }
  if (ranks_here <= 0 || memory_bytes <= 0) return;
  const double need = ranks_here * p.host_bytes();
  if (need <= memory_bytes) return;
  std::string hint;
  if (p.offload_optimizer)
    hint = fmt::format("offloading puts {} per rank in host memory: turn offload off where the GPUs can hold it, ",
                       bytes(p.offload_bytes));
  if (p.stage < 3) hint += "raise zero_optimization.stage (3 shards the parameters too), ";
  hint += "run fewer ranks per machine or on more machines, use LoRA, or choose a smaller model";
  DT_THROW(ConfigError,
           "{}: the job needs {} of host memory on this machine ({} rank(s) x {}: ZeRO stage {}, {} parameters, {} "
           "trainable; see --dry-run) but it has {}: {}",
           source, bytes(need), ranks_here, bytes(p.host_bytes()), p.stage, count(p.params), count(p.trainable),
           bytes(memory_bytes), hint);
}

}  // namespace dtrain::train
