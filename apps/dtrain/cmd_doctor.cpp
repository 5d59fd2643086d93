// `dtrain doctor` (check every host of a hostfile: SSH, build, slots, driver, disk,
// shared run directory, clock, connectivity and per-link bandwidth), the hidden
// `dtrain doctor-node` it starts on each node, and the quick preflight hook for launches.
#include "commands.h"

#include "core/check.h"
#include "core/log.h"
#include "doctor/doctor.h"
#include "doctor/host_probe_doctor.h"
#include "doctor/node_probe.h"
#include "launch/job_run.h"

#include <csignal>
#include <cstdio>

namespace dtrain::cli {

int run_doctor(const JobOptions& opts, bool json, bool network) {
  ::signal(SIGPIPE, SIG_IGN);
  launch::JobRequest req = job_request(opts, "train");
  req.require_training = false;
  launch::Job job = launch::job_prepare(req);
  for (const auto& w : job.warnings) log_warn("{}", w);
  launch::NodeSpawner spawner = launch::job_node_spawner(job, opts.launcher);
  doctor::DoctorOptions o;
  o.network = network;
  doctor::Report rep = doctor::doctor_run(job, spawner, o);
  const std::string text = json ? doctor::report_json(rep).dump(2) + "\n" : doctor::report_table(rep);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return rep.ok() ? 0 : static_cast<int>(Exit::UNHEALTHY);
}

int run_doctor_node(const std::vector<std::string>& argv) {
  ::signal(SIGPIPE, SIG_IGN);
  return doctor::node_probe_main(doctor::node_probe_parse(argv), 0, stdout);
}

void preflight_install(launch::SupervisorOptions& opts, const launch::Job& job) {
  if (!job.cfg.doctor.preflight) return;
  opts.preflight = [spawner = opts.spawner](const launch::Job& job) {
    doctor::Report rep = doctor::preflight(job, spawner);
    for (const doctor::Finding& f : rep.findings)
      if (f.status == doctor::Status::WARN)
        log_warn("preflight: node {} ({}): {}: {}; {}", f.node, f.host, f.check, f.detail, f.advice);
    if (rep.ok())
      log_info("preflight: {} node(s) fit (SSH, dtrain build, slots, shared run directory, free space) in {:.1f} s",
               rep.nodes.size(), rep.seconds);
    return doctor::preflight_verdict(rep);
  };
  // An elastic job probes its hosts with the same checks (before every round, and the
  // hosts left out while a round runs): a host failing them is left out, not retried.
  opts.probe_factory = [spawner = opts.spawner](const launch::Job& job) {
    return doctor::host_probe_doctor(job, spawner);
  };
  opts.probe_is_preflight = true;
}

}  // namespace dtrain::cli
