// Runs a prepared job under the supervisor, and the internal `dtrain agent` entry point.
#include "commands.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/agent.h"
#include "launch/job.h"
#include "launch/local_spawner.h"
#include "launch/slurm.h"
#include "launch/supervisor.h"

#include <atomic>
#include <csignal>

namespace dtrain::cli {

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }
}  // namespace

int run_job(launch::Job& job, const JobOptions& cli) {
  launch::job_write_run_dir(job);
  launch::spawner_become_subreaper();
  struct sigaction sa{};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  launch::SupervisorOptions opts;
  opts.spawner = cli.launcher == "slurm"
                     ? launch::node_spawner_slurm(launch::slurm_allocation_from_env(launch::environ_map()))
                     : launch::node_spawner_default(job.cfg);
  opts.interrupted = &g_interrupted;
  opts.tee_all = cli.tee_all;
  return launch::supervise(job, opts);
}

int run_agent(const std::vector<std::string>& argv) {
  ::signal(SIGPIPE, SIG_IGN);
  launch::spawner_become_subreaper();
  launch::AgentArgs args = launch::agent_args_parse(argv);
  return launch::agent_run(args, 0, launch::agent_timing_from_env());
}

}  // namespace dtrain::cli
