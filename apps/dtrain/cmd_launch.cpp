// `dtrain launch` and `dtrain resume`: prepare the job, print the dry-run report or run it.
#include "bench_options.h"
#include "commands.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/dry_run.h"
#include "launch/rank_device.h"
#include "launch/job.h"
#include "launch/local_spawner.h"
#include "launch/slurm.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

namespace dtrain::cli {

launch::JobRequest job_request(const JobOptions& o, const std::string& mode) {
  launch::JobRequest r;
  r.config_path = o.config;
  r.hostfile_path = o.hostfile;
  r.output_dir = o.output_dir;
  r.sets = o.sets;
  if (!o.nnodes.empty()) {
    // "MIN:MAX" or "N": torchrun's grammar, as two config keys (after the --set ones, so
    // the flag wins, and recorded in the run's config.yaml for resume).
    const size_t colon = o.nnodes.find(':');
    const std::string lo = o.nnodes.substr(0, colon), hi = colon == std::string::npos ? lo : o.nnodes.substr(colon + 1);
    auto number = [&](const std::string& t) {
      if (t.empty() || t.size() > 5 || t.find_first_not_of("0123456789") != std::string::npos || std::stoi(t) < 1)
        DT_THROW(UsageError, "--nnodes '{}': give MIN:MAX (e.g. 2:4) or N, with 1 <= MIN <= MAX", o.nnodes);
      return std::stoi(t);
    };
    const int mn = number(lo), mx = number(hi);
    if (mn > mx) DT_THROW(UsageError, "--nnodes '{}': MIN {} is above MAX {}", o.nnodes, mn, mx);
    r.sets.push_back(fmt::format("elastic.min_nodes={}", mn));
    r.sets.push_back(fmt::format("elastic.max_nodes={}", mx));
  }
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

namespace {

void print_dry_run(const launch::Job& job) {
  const auto& c = job.cfg;
  std::string model =
      !c.model.architecture && c.model.init_from.empty() ? std::string("(no model section)")
      : c.model.init_from.empty()
          ? fmt::format("{} d_model={} n_layer={} n_head={}", c.model.architecture.value_or("?"),
                        c.model.d_model.value_or(0), c.model.n_layer.value_or(0), c.model.n_head.value_or(0))
          : fmt::format("from {}", c.model.init_from);
  std::printf("config      %s\n", c.source.c_str());
  std::printf("model       %s\n", model.c_str());
  if (c.resolved_train_batch_size > 0)
    std::printf("batch       train_batch_size=%lld = micro %lld x accumulation %lld x world %lld\n",
                static_cast<long long>(c.resolved_train_batch_size),
                static_cast<long long>(c.resolved_micro_batch_size),
                static_cast<long long>(c.resolved_grad_accum_steps), static_cast<long long>(c.resolved_dp_world_size));
  std::printf("precision   %s, ZeRO stage %lld\n",
              c.bf16.enabled   ? "bf16"
              : c.fp16.enabled ? "fp16"
                               : "fp32",
              static_cast<long long>(c.zero.stage));
  if (job.spec.mode == "train")
    for (const std::string& line : launch::rank_device_plan_lines(job.plan, c.training.device))
      std::printf("device      %s\n", line.c_str());
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

namespace {

// What can be checked once before the ranks start, so that a permanent mistake exits 2 at
// once instead of failing every rank of every retry round: --json must name a file whose
// directory exists (checked where rank 0, which writes it, runs on this machine), and the
// buffers of the ranks on this machine (two of -e bytes each) must fit in its memory when
// they are host memory (gloo).
void bench_check_job(const BenchCliOptions& bench, const dtrain::bench::BenchOptions& b, const launch::Job& job) {
  namespace fs = std::filesystem;
  if (!bench.json.empty() && !job.hosts.hosts.empty() && launch::host_is_local(job.hosts.hosts.front().host)) {
    const fs::path p =
        fs::path(bench.json).is_absolute() ? fs::path(bench.json) : fs::path(job.spec.workdir) / bench.json;
    std::error_code ec;
    DT_ENFORCE(!fs::is_directory(p, ec), UsageError,
               "--json {}: is a directory; give a file name to write the results to, e.g. {}/bench.json", bench.json,
               bench.json);
    const fs::path parent = p.parent_path();
    DT_ENFORCE(parent.empty() || fs::is_directory(parent, ec), UsageError,
               "--json {}: the directory {} does not exist; create it or give another path", bench.json,
               parent.string());
  }
  bool host_buffers = bench.backend == "gloo";
#ifndef DTRAIN_HAVE_CUDA
  host_buffers = true;  // gloo is the only backend
#endif
  if (!host_buffers) return;
  int local_ranks = 0;
  for (const auto& h : job.hosts.hosts)
    if (launch::host_is_local(h.host)) local_ranks += h.slots;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (local_ranks == 0 || pages <= 0 || page <= 0) return;
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  const double need = 2.0 * static_cast<double>(b.max_bytes) * local_ranks;
  DT_ENFORCE(need <= memory, UsageError,
             "-e/--maxbytes {}: {} ranks on this machine would allocate 2 x {} bytes each ({:.1f} GiB), more than its "
             "{:.1f} GiB of memory; give a smaller -e",
             bench.max_bytes, local_ranks, b.max_bytes, need / (1u << 30), memory / (1u << 30));
}

}  // namespace

int run_bench(const BenchCliOptions& bench, const JobOptions& opts) {
  const auto b = bench_options_resolve(bench);  // bad options fail here, before any node starts
  JobOptions o = opts;
  if (o.output_dir.empty()) o.output_dir = "runs/bench";
  launch::Job job = launch::job_prepare(job_request(o, "bench"));
  bench_check_job(bench, b, job);
  for (const auto& w : job.warnings) log_warn("{}", w);
  job.spec.rank_args = bench_options_argv(bench);
  if (opts.dry_run) {
    print_dry_run(job);
    return 0;
  }
  return run_job(job, opts, false);
}

}  // namespace dtrain::cli
