// Runs a prepared job (lib/launch/job_run.h, with the doctor's preflight), and the
// internal `dtrain agent` entry point.
#include "commands.h"

#include "launch/agent.h"
#include "launch/job_run.h"

namespace dtrain::cli {

int run_job(launch::Job& job, const JobOptions& cli, bool resume) {
  launch::JobRunOptions o;
  o.resume = resume;
  o.launcher = cli.launcher;
  o.tee_all = cli.tee_all;
  o.customize = [](launch::SupervisorOptions& opts, const launch::Job& j) { preflight_install(opts, j); };
  return launch::job_run(job, o);
}

int run_agent(const std::vector<std::string>& argv) { return launch::agent_main(argv); }

}  // namespace dtrain::cli
