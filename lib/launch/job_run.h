// Runs a prepared job from the launcher's side: the run directory made private and
// locked for the job's life, the launcher's signals turned into a clean stop, the node
// spawner that --launcher names, the supervisor, and what a stopped job leaves behind.
// `dtrain launch`, `dtrain resume` and `dtrain bench` end here (this is their one entry
// header: the job is prepared through job.h, which it includes), and `dtrain doctor`
// takes its spawner from here.
#pragma once

#include "launch/job.h"
#include "launch/supervisor.h"

#include <functional>
#include <string>

namespace dtrain::launch {

struct JobRunOptions {
  bool resume = false;           // `dtrain resume`: continue the run directory's checkpointed run
  std::string launcher = "ssh";  // "slurm": the agents start through srun (node_spawner_for)
  bool tee_all = false;          // every rank's stdout on the terminal, not only rank 0's
  /// Called on the supervisor's options before the job starts (the CLI installs lib/doctor's
  /// preflight and elastic host probe there).
  std::function<void(SupervisorOptions&, const Job&)> customize;
};

/// Runs `job` to its end and returns the process exit code (supervise's). Refuses
/// (UsageError) a new launch into a run directory that holds a checkpointed run; creates
/// the directory with training.run_dir_mode and sets the umask to match, takes its
/// launcher lock (RunDirLock), removes partial checkpoints, writes the run's config
/// (deferred for a resume until its first round starts), and stops every node on
/// SIGINT, SIGTERM or SIGHUP.
int job_run(Job& job, const JobRunOptions& o);

/// --launcher slurm: the request's hosts are the allocation's nodes (SLURM_JOB_NODELIST
/// and the task counts from the environment).
void job_request_slurm_hosts(JobRequest& r);

/// The --dry-run report: config, model, batch, precision, each node's device (train
/// mode), run directory, then each node's command and environment (dry_run_report).
std::string job_dry_run_text(const Job& job);

/// What `dtrain bench` can check once before the ranks start, so that a permanent mistake
/// exits 2 at once instead of failing every rank of every retry round: `json` (--json,
/// "" = none) must name a file whose directory exists (checked where rank 0, which writes
/// it, runs on this machine), and the buffers of the ranks on this machine (two of
/// max_bytes each) must fit in its memory when they are host memory (backend "gloo", or
/// any in a CPU-only build). max_bytes_arg: -e as given, for the message. UsageError.
void job_check_bench(const Job& job, const std::string& json, const std::string& backend,
                     const std::string& max_bytes_arg, size_t max_bytes);

/// The spawner --launcher names for `job` (node_spawner_for), with this process made
/// the subreaper of what the local spawns leave behind (spawner_become_subreaper).
NodeSpawner job_node_spawner(const Job& job, const std::string& launcher);

}  // namespace dtrain::launch
