// `dtrain launch` and `dtrain resume`: prepare the job, print the dry-run report or run it.
#include "bench_options.h"
#include "commands.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/dry_run.h"
#include "launch/job.h"
#include "launch/slurm.h"

#include <cstdio>
#include <filesystem>

namespace dtrain::cli {

namespace {

launch::JobRequest job_request(const JobOptions& o, const std::string& mode) {
  launch::JobRequest r;
  r.config_path = o.config;
  r.hostfile_path = o.hostfile;
  r.output_dir = o.output_dir;
  r.sets = o.sets;
  r.selection.include = o.include;
  r.selection.exclude = o.exclude;
  r.selection.num_nodes = o.num_nodes;
  r.selection.num_gpus = o.num_gpus;
  r.nproc_per_node = o.nproc_per_node;
  r.master_addr = o.master_addr;
  r.master_port = o.master_port;
  r.mode = mode;
  r.require_training = (mode == "train");
  r.dry_run = o.dry_run;
  if (o.launcher == "slurm") r.hosts = launch::slurm_hostfile(launch::slurm_allocation_from_env(launch::environ_map()));
  return r;
}

void print_dry_run(const launch::Job& job) {
  const auto& c = job.cfg;
  std::string model = !c.model.architecture && c.model.init_from.empty() ? std::string("(no model section)")
                      : c.model.init_from.empty()
                          ? fmt::format("{} d_model={} n_layer={} n_head={}", c.model.architecture.value_or("?"),
                                        c.model.d_model.value_or(0), c.model.n_layer.value_or(0),
                                        c.model.n_head.value_or(0))
                          : fmt::format("from {}", c.model.init_from);
  std::printf("config      %s\n", c.source.c_str());
  std::printf("model       %s\n", model.c_str());
  if (c.resolved_train_batch_size > 0)
    std::printf("batch       train_batch_size=%lld = micro %lld x accumulation %lld x world %lld\n",
                static_cast<long long>(c.resolved_train_batch_size), static_cast<long long>(c.resolved_micro_batch_size),
                static_cast<long long>(c.resolved_grad_accum_steps), static_cast<long long>(c.resolved_dp_world_size));
  std::printf("precision   %s, ZeRO stage %lld\n", c.bf16.enabled ? "bf16" : c.fp16.enabled ? "fp16" : "fp32",
              static_cast<long long>(c.zero.stage));
  std::printf("run dir     %s\n", job.run_dir.c_str());
  if (!job.incomplete.empty())
    std::printf("note        not a complete dtrain job, a real launch stops here: %s\n", job.incomplete.c_str());
  std::printf("\n");
  std::string report = launch::dry_run_report(job.plan, job.spec, launch::environ_map());
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

// cmd_run.cpp. Locks the run directory; a launch (resume = false) refuses one that holds
// a checkpointed run, a resume defers rewriting its config until the ranks started.
int run_job(launch::Job& job, const JobOptions& opts, bool resume);

int run_launch(const JobOptions& opts) {
  launch::Job job = launch::job_prepare(job_request(opts, "train"));
  for (const auto& w : job.warnings) log_warn("{}", w);
  if (opts.dry_run) {
    print_dry_run(job);
    return 0;
  }
  return run_job(job, opts, false);
}

int run_resume(const std::string& run_dir, const JobOptions& opts) {
  namespace fs = std::filesystem;
  JobOptions o = opts;
  fs::path dir(run_dir);
  if (o.config.empty()) {
    DT_ENFORCE(fs::exists(dir / "config.yaml"), UsageError,
               "{} has no config.yaml: is it a dtrain run directory? (pass --config to resume with another config)",
               run_dir);
    o.config = (dir / "config.yaml").string();
  }
  if (o.hostfile.empty() && fs::exists(dir / "hostfile")) o.hostfile = (dir / "hostfile").string();
  o.output_dir = run_dir;
  launch::Job job = launch::job_prepare(job_request(o, "train"));
  for (const auto& w : job.warnings) log_warn("{}", w);
  if (opts.dry_run) {
    print_dry_run(job);
    return 0;
  }
  return run_job(job, opts, true);
}

int run_bench(const BenchCliOptions& bench, const JobOptions& opts) {
  bench_options_resolve(bench);  // reject bad options here, before any node starts
  JobOptions o = opts;
  if (o.output_dir.empty()) o.output_dir = "runs/bench";
  launch::Job job = launch::job_prepare(job_request(o, "bench"));
  for (const auto& w : job.warnings) log_warn("{}", w);
  job.spec.rank_args = bench_options_argv(bench);
  if (opts.dry_run) {
    print_dry_run(job);
    return 0;
  }
  return run_job(job, opts, false);
}

}  // namespace dtrain::cli
