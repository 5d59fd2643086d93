// The launcher's run of a prepared job: run directory, lock, signals, spawner, supervise.
#include "launch/job_run.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/dry_run.h"
#include "launch/local_spawner.h"
#include "launch/rank_device.h"
#include "launch/run_dir.h"
#include "launch/slurm.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

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
    std::error_code ec;  // the run directory's path was checked (a link loop is refused before)
    if (!o.resume && job.spec.mode == "train" && fs::exists(fs::path(job.run_dir) / "checkpoints" / "latest", ec))
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

// ---------------------------------------------------------------------------
// What the CLI's job commands ask before (or instead of) the run

void job_request_slurm_hosts(JobRequest& r) { r.hosts = slurm_hostfile(slurm_allocation_from_env(environ_map())); }

std::string job_dry_run_text(const Job& job) {
  const auto& c = job.cfg;
  std::string model =
      !c.model.architecture && c.model.init_from.empty() ? std::string("(no model section)")
      : c.model.init_from.empty()
          ? fmt::format("{} d_model={} n_layer={} n_head={}", c.model.architecture.value_or("?"),
                        c.model.d_model.value_or(0), c.model.n_layer.value_or(0), c.model.n_head.value_or(0))
          : fmt::format("from {}", c.model.init_from);
  std::string out = fmt::format("config      {}\n", c.source);
  out += fmt::format("model       {}\n", model);
  if (c.resolved_train_batch_size > 0)
    out += fmt::format(
        "batch       train_batch_size={} = micro {} x accumulation {} x world {}\n",
        static_cast<long long>(c.resolved_train_batch_size), static_cast<long long>(c.resolved_micro_batch_size),
        static_cast<long long>(c.resolved_grad_accum_steps), static_cast<long long>(c.resolved_dp_world_size));
  out += fmt::format("precision   {}, ZeRO stage {}\n",
                     c.bf16.enabled   ? "bf16"
                     : c.fp16.enabled ? "fp16"
                                      : "fp32",
                     static_cast<long long>(c.zero.stage));
  if (job.spec.mode == "train")
    for (const std::string& line : rank_device_plan_lines(job.plan, c.training.device))
      out += fmt::format("device      {}\n", line);
  out += fmt::format("run dir     {}\n", job.run_dir);
  for (const std::string& line : job.data_lines) out += fmt::format("data        {}\n", line);
  if (!job.incomplete.empty())
    out += fmt::format("note        not a complete dtrain job, a real launch stops here: {}\n", job.incomplete);
  if (job.plan_for)
    out +=
        fmt::format("plan for    {} (--plan-for {}), not this machine\n", job.plan_for->describe(), job.plan_for->spec);
  for (const std::string& e : job.elsewhere) out += fmt::format("not here    {}\n", e);
  for (const std::string& b : job.blockers) out += fmt::format("would fail  {}\n", b);
  out += "\n";
  // Placeholder hosts (--plan-for NxGxSIZE) have no command to show: the real hosts do.
  const bool placeholders = job.plan_for && job.plan_for->nodes > 0;
  out += dry_run_report(job.plan, job.spec, environ_map(), !placeholders);
  if (placeholders)
    out += fmt::format("({} for the cluster's hosts; --hostfile HOSTS --plan-for {} prints each node's command)\n",
                       job.plan.nodes.size() == 1 ? std::string("node1 stands")
                                                  : fmt::format("node1..node{} stand", job.plan.nodes.size()),
                       job.plan_for->spec.substr(job.plan_for->spec.find_last_of("xX") + 1));
  return out;
}

void job_check_bench(const Job& job, const std::string& json, const std::string& backend,
                     const std::string& max_bytes_arg, size_t max_bytes) {
  namespace fs = std::filesystem;
  if (!json.empty() && !job.hosts.hosts.empty() && host_is_local(job.hosts.hosts.front().host)) {
    const fs::path p = fs::path(json).is_absolute() ? fs::path(json) : fs::path(job.spec.workdir) / json;
    std::error_code ec;
    DT_ENFORCE(!fs::is_directory(p, ec), UsageError,
               "--json {}: is a directory; give a file name to write the results to, e.g. {}/bench.json", json, json);
    const fs::path parent = p.parent_path();
    DT_ENFORCE(parent.empty() || fs::is_directory(parent, ec), UsageError,
               "--json {}: the directory {} does not exist; create it or give another path", json, parent.string());
  }
  bool host_buffers = backend == "gloo";
#ifndef DTRAIN_HAVE_CUDA
  host_buffers = true;  // gloo is the only backend
#endif
  if (!host_buffers) return;
  int local_ranks = 0;
  for (const auto& h : job.hosts.hosts)
    if (host_is_local(h.host)) local_ranks += h.slots;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (local_ranks == 0 || pages <= 0 || page <= 0) return;
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  const double need = 2.0 * static_cast<double>(max_bytes) * local_ranks;
  DT_ENFORCE(need <= memory, UsageError,
             "-e/--maxbytes {}: {} ranks on this machine would allocate 2 x {} bytes each ({:.1f} GiB), more than its "
             "{:.1f} GiB of memory; give a smaller -e",
             max_bytes_arg, local_ranks, max_bytes, need / (1u << 30), memory / (1u << 30));
}

NodeSpawner job_node_spawner(const Job& job, const std::string& launcher) {
  spawner_become_subreaper();
  return node_spawner_for(job.cfg, launcher);
}

}  // namespace dtrain::launch
