// The launcher's run of a prepared job: run directory, lock, signals, spawner, supervise.
#include "launch/job_run.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/local_spawner.h"
#include "launch/run_dir.h"

#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <filesystem>

namespace dtrain::launch {

namespace {
// The signal that asked the launcher to stop (0 = none): SIGINT (Ctrl-C), SIGTERM (kill,
// a scheduler) or SIGHUP (the login session that started it closed).
std::atomic<int> g_interrupted{0};
extern "C" void on_stop_signal(int sig) { g_interrupted = sig; }
}  // namespace

int job_run(Job& job, const JobRunOptions& o) {
  namespace fs = std::filesystem;
  // Ranks resume from the run directory's latest checkpoint (that is how retry rounds
  // continue), so a new launch must not silently continue an old run. Checked before
  // touching the directory, and again under the lock (a run that ended a moment ago).
  auto refuse_checkpointed = [&] {
    if (!o.resume && job.spec.mode == "train" && fs::exists(fs::path(job.run_dir) / "checkpoints" / "latest"))
      DT_THROW(UsageError,
               "{} already holds a checkpointed run: continue it with 'dtrain resume {}', or start a new run with "
               "--output-dir DIR",
               job.run_dir, job.run_dir);
  };
  refuse_checkpointed();
  // Everything the launcher and its local agents and ranks create in the run directory
  // (logs, events, status, metrics) is as private as the directory itself.
  const mode_t mode = run_dir_mode_parse(job.cfg.training.run_dir_mode);
  ::umask(~mode & 0777);
  // One launcher per run directory for the job's whole life: a second launch or resume
  // would overwrite this one's checkpoints and interleave its logs. An existing directory
  // is adopted only under the lock, so a second one changes nothing there.
  std::string stale;
  RunDirLock lock = run_dir_create_locked(job.run_dir, mode, &stale);
  if (!stale.empty()) log_warn("{}", stale);
  refuse_checkpointed();
  // A save that a crash or a full disk interrupted leaves checkpoints/tmp-step<k>/: it
  // goes before anything is written here, as it may hold the space that needs.
  run_dir_remove_partial_checkpoints(job.run_dir);
  job_write_run_dir(job, o.resume);
  spawner_become_subreaper();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  SupervisorOptions opts;
  opts.spawner = node_spawner_for(job.cfg, o.launcher);
  opts.interrupted = &g_interrupted;
  opts.tee_all = o.tee_all;
  if (o.customize) o.customize(opts, job);
  // A resumed run's new config (and hostfile) replace the old ones only once the ranks
  // loaded the checkpoint with it: a failed `resume --set ...` leaves the run as it was.
  opts.on_started = [&job] {
    try {
      job_commit_run_dir(job);
    } catch (const Error& e) {
      log_error("could not record the new config in {}: {}", job.run_dir, e.what());
    }
  };
  const int rc = supervise(job, opts);
  // Every rank has ended: a save the last round could not finish (a full disk) leaves no
  // tmp-step<k>/ behind, also when no retry round is left to remove it.
  run_dir_remove_partial_checkpoints(job.run_dir);
  if (job.run_dir_pending) {
    // The new config never started: the run keeps its config.yaml, and the next resume
    // starts from that, not from a leftover.
    std::error_code ec;
    fs::remove(job.spec.config_path, ec);
    log_info("{}/config.yaml left unchanged: the job did not start with the new config", job.run_dir);
  }
  return rc;
}

}  // namespace dtrain::launch
