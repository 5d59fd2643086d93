// The cluster plan of a training config: the model's buffers as the ZeRO engine will see
// them (the model built on a PlanDevice: nothing allocated), one GPU's compute for the step
// from the --plan budget of its PlanDevice trace (or from its FLOPs when the plan refuses the
// shape), the config's ZeRO settings and links, and the dry run's section.
#include "plan/plan_cluster.h"

#include "core/check.h"
#include "core/dtype.h"
#include "device/plan_device.h"
#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::plan {

using train::model_flops_per_token;
using train::step_setup_of;
using train::StepSetup;

namespace {

// The update's kernels work on the trainable elements a rank owns: ZeRO 1-3 shard them.
bool update_op(const std::string& op) { return op == "adamw" || op == "norm_sq_accumulate"; }

}  // namespace

ClusterCompute cluster_compute_of(const BenchPlanResult& r) {
  ClusterCompute c;
  for (const PlanRow& row : r.rows) {
    PlanBand& to = update_op(row.op) ? c.optimizer_s : c.step_s;
    to.slow += row.ms_slow / 1e3;
    to.fast += row.ms_fast / 1e3;
  }
  c.source =
      fmt::format("the --plan budget of the trainer's step on one {} ({} launches)", r.table.gpu.label, r.launches);
  return c;
}

ClusterCompute cluster_compute_plan(const StepSetup& s, const std::string& gpu) {
  PlanBudgetTable t;
  t.gpu = plan_gpu(gpu);
  const PlanStep step = plan_step(s, t.gpu.smem_optin, t.gpu.sm);
  ClusterCompute c;
  int64_t launches = 0;
  for (const device::PlanEntry& e : step.entries) {
    launches += e.launches;
    PlanBand& to = update_op(e.op) ? c.optimizer_s : c.step_s;
    to.slow += plan_entry_time(e, t, PlanEnd::SLOW).total();
    to.fast += plan_entry_time(e, t, PlanEnd::FAST).total();
  }
  c.source = fmt::format("the --plan budget of the trainer's step on one {} ({} launches)", t.gpu.label, launches);
  for (const std::string& n : step.notes) c.source += "; " + n;
  return c;
}

ClusterCompute cluster_compute_flops(const StepSetup& s, int64_t params, int64_t trainable, const std::string& gpu) {
  PlanBudgetTable t;
  t.gpu = plan_gpu(gpu);
  const double tokens = static_cast<double>(s.micro_batch) * s.seq_len * s.grad_accum;
  const double flops = model_flops_per_token(s.model, params, s.seq_len, s.lora.has_value()) * tokens;
  const double peak = t.gpu.tensor_tflops * 1e12;
  constexpr double mfu_low = 0.35, mfu_high = 0.50;  // assumed: what a well-fed dense step reaches
  // The update streams about 34 bytes per trainable element: AdamW reads the fp32 master,
  // gradient and both moments and writes master, moments and the 16-bit copy; the norm reads
  // the gradient once more.
  const double update_bytes = 34.0 * static_cast<double>(trainable);
  ClusterCompute c;
  c.step_s = {flops / (peak * mfu_low), flops / (peak * mfu_high)};
  c.optimizer_s = {update_bytes / (t.gpu.hbm_tbps * 1e12 * t.hbm_eff.slow),
                   update_bytes / (t.gpu.hbm_tbps * 1e12 * t.hbm_eff.fast)};
  c.source = fmt::format("model FLOPs at {:.0f} to {:.0f}% MFU of one {} (no PlanDevice trace)", 100 * mfu_low,
                         100 * mfu_high, t.gpu.label);
  return c;
}

ClusterJob cluster_job_from(const StepSetup& s, const train::ZeroOptions& z, const ClusterCompute& compute, int nodes,
                            int gpus_per_node) {
  ClusterJob j;
  j.nodes = nodes;
  j.gpus_per_node = gpus_per_node;
  j.stage = z.stage;
  j.grad_accum = s.grad_accum;
  j.overlap_comm = z.overlap_comm;
  j.compute_bytes = static_cast<int>(dtype_size(z.compute_dtype));
  j.wire_bytes = static_cast<int>(dtype_size(z.grad_wire));
  j.reduce_bucket_size = static_cast<int64_t>(z.reduce_bucket_size);
  j.allgather_bucket_size = static_cast<int64_t>(z.allgather_bucket_size);
  j.prefetch_bucket_size = static_cast<int64_t>(z.prefetch_bucket_size);
  j.persistence_threshold = static_cast<int64_t>(z.param_persistence_threshold);
  j.max_live_parameters = static_cast<int64_t>(z.max_live_parameters);
  j.n_layer = s.model.n_layer;
  j.tied = s.model.tie_embeddings;
  // The engine's slots: base buffers, then the adapters (the only trainable ones under LoRA).
  device::PlanDevice dev(device::Kind::CUDA);
  model::Model m(s.model, dev, s.dtype);
  if (s.lora) m.lora_enable(*s.lora);
  for (const auto& pb : m.params())
    j.buffers.push_back({pb.layout.layer, static_cast<int64_t>(pb.size), !s.lora.has_value()});
  for (const auto& pb : m.lora_params()) j.buffers.push_back({pb.layout.layer, static_cast<int64_t>(pb.size), true});
  j.compute_s = compute.step_s;
  j.optimizer_s = compute.optimizer_s;
  // Backward is twice the forward's FLOPs; a recomputed layer runs its forward again there.
  const double r = s.model.n_layer > 0 ? static_cast<double>(s.recompute_layers) / s.model.n_layer : 0.0;
  j.backward_share = (2.0 + r) / (3.0 + r);
  j.tokens_per_gpu = static_cast<double>(s.micro_batch) * s.seq_len * s.grad_accum;
  return j;
}

ClusterLink cluster_link_from(const config::TrainConfig& cfg) {
  const config::LinkConfig& l = cfg.cluster.link;
  ClusterLink k;
  k.intra_gbytes = l.intra_node_gbytes;
  k.inter_gbits = l.inter_node_gbits;
  k.source = l == config::LinkConfig{} ? "cluster.link defaults: H100 SXM NVLink, NDR InfiniBand" : "cluster.link";
  return k;
}

ClusterPlan cluster_plan_of(const StepSetup& s, const ClusterCompute& compute, int nodes, int gpus_per_node) {
  ClusterPlan p = plan_cluster(cluster_job_from(s, train::zero_options_from(s.cfg), compute, nodes, gpus_per_node),
                               cluster_link_from(s.cfg));
  p.notes.push_back("compute: " + compute.source);
  p.notes.push_back(fmt::format(
      "per GPU and step: micro-batch {} x seq {} x accumulation {}{}", s.micro_batch, s.seq_len, s.grad_accum,
      s.recompute_layers ? fmt::format(", {} of {} layers recomputed", s.recompute_layers, s.model.n_layer)
                         : std::string()));
  p.notes.push_back("predicted, not measured: NCCL's ring model, the overlap rule and the sources in docs/cluster.md");
  return p;
}

std::string cluster_plan_report(const config::TrainConfig& cfg, int nodes, int gpus_per_node, const std::string& gpu) {
  StepSetup s = step_setup_of(cfg, true);
  // The launch's batch for its world size, where it was resolved (train_batch_size split).
  if (cfg.resolved_micro_batch_size > 0) s.micro_batch = static_cast<int>(cfg.resolved_micro_batch_size);
  if (cfg.resolved_grad_accum_steps > 0) s.grad_accum = static_cast<int>(cfg.resolved_grad_accum_steps);
  ClusterCompute compute;
  try {
    compute = cluster_compute_plan(s, gpu);
  } catch (const UsageError& e) {
    device::PlanDevice dev(device::Kind::CUDA);
    model::Model m(s.model, dev, s.dtype);
    if (s.lora) m.lora_enable(*s.lora);
    compute = cluster_compute_flops(s, static_cast<int64_t>(m.num_params()),
                                    static_cast<int64_t>(m.num_trainable_params()), gpu);
    compute.source += std::string("; the plan refused the step: ") + e.what();
  }
  return "step plan (predicted):\n" + plan_cluster_text(cluster_plan_of(s, compute, nodes, gpus_per_node), "  ");
}

}  // namespace dtrain::plan
