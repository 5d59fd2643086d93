// `dtrain launch` and `dtrain resume`: prepare the job, print the dry-run report or run it.
#include "bench_options.h"
#include "commands.h"

#include "plan/plan_cluster.h"
#include "core/check.h"
#include "core/input_file.h"
#include "core/log.h"
#include "config/train_config.h"
#include "launch/job_run.h"
#include "launch/run_dir_resume.h"
#include "device/device.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

namespace dtrain::cli {

launch::JobRequest job_request(const JobOptions& o, const std::string& mode) {
  launch::JobRequest r;
  r.config_path = o.config;
  r.hostfile_path = o.hostfile;
  r.output_dir = o.output_dir;
  r.sets = o.sets;
  r.selection.num_nodes = o.num_nodes;
  if (!o.nnodes.empty() && o.nnodes.find(':') == std::string::npos) {
    // "N": torchrun's fixed node count, without elastic membership: the first N hosts.
    if (o.nnodes.size() > 5 || o.nnodes.find_first_not_of("0123456789") != std::string::npos || std::stoi(o.nnodes) < 1)
      DT_THROW(UsageError, "--nnodes '{}': give MIN:MAX (e.g. 2:4) or N, with 1 <= MIN <= MAX", o.nnodes);
    const int n = std::stoi(o.nnodes);
    if (o.num_nodes != -1 && o.num_nodes != n)
      DT_THROW(UsageError, "--nnodes {} and --num-nodes {} disagree: give one of them", n, o.num_nodes);
    r.selection.num_nodes = n;
  } else if (!o.nnodes.empty()) {
    // "MIN:MAX": torchrun's elastic grammar, as two config keys (after the --set ones, so
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
  r.selection.num_gpus = o.num_gpus;
  r.nproc_per_node = o.nproc_per_node;
  r.master_addr = o.master_addr;
  r.master_port = o.master_port;
  r.mode = mode;
  r.require_training = (mode == "train");
  r.dry_run = o.dry_run;
  if (!o.plan_for.empty()) {
    r.plan_for = launch::plan_target_parse(o.plan_for);
    r.dry_run = true;
  }
  if (o.launcher == "slurm") launch::job_request_slurm_hosts(r);
  return r;
}

namespace {

// Ranks on this machine (all of them when every host is this one; else unknown: remote
// ranks check nothing here; none for a plan for another cluster) and its memory.
int ranks_here(const launch::Job& job) { return job.all_local && !job.plan_for ? job.plan.world_size : 0; }

// Each GPU's memory: the planned one (--plan-for), else where the ranks run here on GPUs
// this process sees (the smallest); 0 = unknown (remote ranks, or no GPU here).
double gpu_bytes(const launch::Job& job) {
  if (job.plan_for) return job.plan_for->gpu_bytes;
  if (!job.all_local || job.cfg.training.device != "cuda") return 0.0;
  return static_cast<double>(device::cuda_memory_bytes());
}

// Ranks per node of a plan for another cluster (the most any node has), for its per-node
// host total; 0 otherwise.
int ranks_per_node(const launch::Job& job) {
  if (!job.plan_for) return 0;
  size_t most = 0;
  for (const auto& n : job.plan.nodes) most = std::max(most, n.ranks.size());
  return static_cast<int>(most);
}

// The config the ranks here will train: activation_checkpointing left to the plan resolved
// as they will resolve it (against their GPU, or their share of this machine's memory); for
// ranks elsewhere the capacity is unknown here and each decides on its own node.
config::TrainConfig planned_config(const launch::Job& job, train::RecomputeChoice* choice = nullptr) {
  double capacity = 0;
  if (job.cfg.training.device == "cuda") capacity = gpu_bytes(job);
  else if (ranks_here(job) > 0) capacity = config::config_host_memory_bytes() / ranks_here(job);
  return train::recompute_resolve(job.cfg, job.plan.world_size, capacity, choice);
}

// The step-time prediction beside the memory plan (plan/plan_cluster.h): the job's nodes and
// GPUs per node (the most any node has), priced on an H100 SXM, or an H200 for a --plan-for
// GPU of 120 GB or more.
std::string cluster_plan(const launch::Job& job, const config::TrainConfig& cfg) {
  size_t most = 0;
  for (const auto& n : job.plan.nodes) most = std::max(most, n.ranks.size());
  const std::string gpu = job.plan_for && job.plan_for->gpu_bytes >= 120e9 ? "h200" : "h100";
  return plan::cluster_plan_report(cfg, static_cast<int>(job.plan.nodes.size()), static_cast<int>(most), gpu);
}

void print_dry_run(const launch::Job& job, bool training = false) {
  std::string text = launch::job_dry_run_text(job);
  // A config that cannot train yet (batch keys left to "auto") has no plan to print. One
  // with reasons to fail is printed when the plan can be made (the model's config.json is
  // here) and left out when not: the reasons say why.
  if (training && job.incomplete.empty()) {
    try {
      train::RecomputeChoice choice;
      const config::TrainConfig cfg = planned_config(job, &choice);
      text += fmt::format("\nactivation checkpointing: {}{}\n", choice.why, choice.planned ? " (the memory plan)" : "");
      text += train::memory_plan_text(train::memory_plan(cfg, job.plan.world_size), ranks_here(job),
                                      config::config_host_memory_bytes(), gpu_bytes(job), ranks_per_node(job));
      if (cfg.training.device == "cuda") text += "\n" + cluster_plan(job, cfg);
    } catch (const Error&) {
      if (job.blockers.empty()) throw;
    }
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// A job whose ranks on this machine cannot hold their share, or whose model.init_from
// holds a weight file no rank could read (a FIFO would block each rank's open for ever
// while its heartbeat kept it "alive"), is refused before any starts. The plan reads
// init_from's config.json here already, so its weight files are looked at here too.
// A dry run of a job that would fail on this machine (an input missing, no GPU here) says
// so in its exit code, naming each reason, after the report; one planned for another
// cluster (--plan-for) names what would fail there.
void dry_run_verdict(const launch::Job& job) {
  if (job.blockers.empty()) return;
  std::string list;
  for (size_t i = 0; i < job.blockers.size(); ++i) list += fmt::format("\n  {}. {}", i + 1, job.blockers[i]);
  if (job.plan_for)
    DT_THROW(ConfigError, "--plan-for {}: a launch of this job on {} would fail ({} reason{}):{}", job.plan_for->spec,
             job.plan_for->describe(), job.blockers.size(), job.blockers.size() == 1 ? "" : "s", list);
  DT_THROW(ConfigError, "--dry-run: a launch of this job would fail on this machine ({} reason{}):{}",
           job.blockers.size(), job.blockers.size() == 1 ? "" : "s", list);
}

// --plan-for: the model's shape comes from init_from's config.json, which must be here; its
// weights need not be (a note: the cluster's copy must hold them), but weights that are
// here are checked as for a launch. A GPU rank that does not fit the planned GPU is a
// blocker, named after the report (exit 2), as is a weight file here no rank could read.
void plan_for_check(launch::Job& job) {
  if (!job.incomplete.empty()) return;
  const std::string& dir = job.cfg.model.init_from;
  if (!dir.empty()) {
    if (!input_present((std::filesystem::path(dir) / "config.json").string(), "model config"))
      DT_THROW(ConfigError,
               "{}: --plan-for {} reads the model's shape from model.init_from's config.json, but '{}' holds none "
               "here: put the model's config.json (no weights needed) in a directory and give it as "
               "model.init_from (--set model.init_from=DIR)",
               job.cfg.source, job.plan_for->spec, dir);
    if (!train::model_weights_present(dir)) {
      job.elsewhere.push_back(
          fmt::format("{}: model.init_from '{}' holds no weights here (the plan reads its "
                      "config.json): the nodes' copy must hold them",
                      job.cfg.source, dir));
    } else {
      try {
        train::model_files_check(dir);
      } catch (const Error& e) {
        job.blockers.push_back(e.what());
      }
    }
  }
  try {
    train::memory_plan_check(train::memory_plan(planned_config(job), job.plan.world_size), 0, 0, job.cfg.source,
                             gpu_bytes(job));
  } catch (const ConfigError& e) {
    job.blockers.push_back(e.what());
  }
}

void memory_check(launch::Job& job, bool dry_run) {
  if (job.plan_for) return plan_for_check(job);
  // A dry run that already found why the launch would fail (init_from missing) reports that.
  if (!job.incomplete.empty() || !job.blockers.empty()) return;
  train::memory_plan_check(train::memory_plan(planned_config(job), job.plan.world_size), ranks_here(job),
                           config::config_host_memory_bytes(), job.cfg.source, gpu_bytes(job));
  if (job.cfg.model.init_from.empty()) return;
  if (!dry_run) return train::model_files_check(job.cfg.model.init_from);
  // A dry run names missing or unreadable weights after its report, as its other reasons.
  try {
    train::model_files_check(job.cfg.model.init_from);
  } catch (const Error& e) {
    job.blockers.push_back(fmt::format("{}: model.init_from: {}", job.cfg.source, e.what()));
  }
}

}  // namespace

// cmd_run.cpp. Locks the run directory; a launch (resume = false) refuses one that holds
// a checkpointed run, a resume defers rewriting its config until the ranks started.
int run_job(launch::Job& job, const JobOptions& opts, bool resume);

namespace {

// A training job, launched or resumed: its dry-run report, or the job run.
int run_train_job(const JobOptions& opts, bool resume) {
  launch::Job job = launch::job_prepare(job_request(opts, "train"));
  for (const auto& w : job.warnings) log_warn("{}", w);
  memory_check(job, opts.dry_run);
  if (opts.dry_run || job.plan_for) {
    print_dry_run(job, true);
    dry_run_verdict(job);
    return 0;
  }
  return run_job(job, opts, resume);
}

}  // namespace

int run_launch(const JobOptions& opts) { return run_train_job(opts, false); }

// The run directory's conventions (its config.yaml, hostfile and the sets its saved
// config needs) are launch::run_dir_resume_inputs'.
int run_resume(const std::string& run_dir, const JobOptions& opts) {
  const launch::ResumeInputs in = launch::run_dir_resume_inputs(
      {.run_dir = run_dir, .config = opts.config, .hostfile = opts.hostfile, .sets = opts.sets});
  JobOptions o = opts;
  o.config = in.config;
  o.hostfile = in.hostfile;
  o.output_dir = run_dir;
  o.sets = in.sets;
  return run_train_job(o, true);
}

int run_bench(const BenchCliOptions& bench, const JobOptions& opts) {
  const auto b = bench_options_resolve(bench);  // bad options fail here, before any node starts
  JobOptions o = opts;
  if (o.output_dir.empty()) o.output_dir = "runs/bench";
  launch::Job job = launch::job_prepare(job_request(o, "bench"));
  launch::job_check_bench(job, bench.json, bench.backend, bench.max_bytes, b.max_bytes);
  for (const auto& w : job.warnings) log_warn("{}", w);
  job.spec.rank_args = bench_options_argv(bench);
  if (opts.dry_run) {
    print_dry_run(job);
    return 0;
  }
  return run_job(job, opts, false);
}

}  // namespace dtrain::cli
