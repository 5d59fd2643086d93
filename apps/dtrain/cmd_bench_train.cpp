// `dtrain bench train --config FILE`: prints the one-device training throughput that
// lib/bench/bench_train measures (a table, or one JSON object with --json), or with --plan
// the step's predicted GPU budget (lib/plan/bench_plan: no GPU needed), and with --cluster
// the step's cluster plan on those clusters (lib/plan/plan_cluster). main.cpp registers the
// subcommand; DeviceError (exit code 8) for a timed GPU run without a CUDA build or a GPU.
#include "bench/bench_attention.h"
#include "plan/bench_plan.h"
#include "bench/bench_train.h"
#include "plan/plan_cluster.h"
#include "core/check.h"
#include "device/kind.h"
#include "train/step_setup.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::cli {

namespace {

// The --plan report, then each cluster's plan of the same step and their summary.
std::string plan_with_clusters(const plan::BenchPlanOptions& o, const std::string& gpu, const std::string& cluster) {
  const auto specs = plan::cluster_specs_parse(cluster);
  const plan::BenchPlanResult r = plan::bench_plan_run(o, gpu);
  const train::StepSetup s = train::step_setup_from(o.config_path, o.sets, true);
  const plan::ClusterCompute compute = plan::cluster_compute_of(r);
  std::string out = plan::bench_plan_format(r, false);
  std::vector<plan::ClusterPlan> plans;
  for (const auto& [nodes, gpus] : specs) {
    plans.push_back(plan::cluster_plan_of(s, compute, nodes, gpus));
    out +=
        fmt::format("\nstep plan on {} x {} (predicted):\n", nodes, gpus) + plan::plan_cluster_text(plans.back(), "  ");
  }
  return out + "\n" + plan::plan_cluster_summary(plans);
}

}  // namespace

int run_bench_train(const std::string& config_path, const std::vector<std::string>& sets, int steps, int warmup,
                    bool json, const std::string& device, bool plan, const std::string& gpu,
                    const std::string& cluster) {
  bench::BenchTrainOptions o;
  o.config_path = config_path;
  o.sets = sets;
  o.steps = steps;
  o.warmup = warmup;
  o.device = device::kind_parse(device, "--device");
  DT_ENFORCE(cluster.empty() || plan, UsageError, "--cluster {} plans a step: give it with --plan", cluster);
  DT_ENFORCE(cluster.empty() || !json, UsageError, "--cluster prints tables: drop --json (or --cluster)");
  const plan::BenchPlanOptions po{o.config_path, o.sets, o.device};
  const std::string out = !cluster.empty() ? plan_with_clusters(po, gpu, cluster)
                          : plan           ? plan::bench_plan_format(plan::bench_plan_run(po, gpu), json)
                                           : bench::bench_train_format(bench::bench_train_run(o), json);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

int run_bench_attention(const std::string& shape, const std::string& dtype, const std::string& device, int iters,
                        int warmup, bool json) {
  bench::BenchAttnOptions o;
  o.shape = bench::bench_attn_shape_parse(shape);
  DT_ENFORCE(dtype_parse(dtype, &o.dtype), UsageError, "--dtype {}: bf16, fp16 or fp32", dtype);
  o.device = device::kind_parse(device, "--device");
  o.iters = iters;
  o.warmup = warmup;
  const std::string out = bench::bench_attention_format(bench::bench_attention_run(o), json);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::cli
