// Runs a prepared job from the launcher's side: the run directory made private and
// locked for the job's life, the launcher's signals turned into a clean stop, the node
// spawner that --launcher names, the supervisor, and what a stopped job leaves behind.
// `dtrain launch`, `dtrain resume` and `dtrain bench` end here.
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

}  // namespace dtrain::launch
