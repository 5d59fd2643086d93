// The elastic membership probe over the doctor's quick preflight: a host may run ranks
// when it passes the same checks as the preflight before a round (SSH with the job's
// options, the launcher's dtrain build, slots vs GPUs/CPUs, the shared writable run
// directory with doctor.min_free_gb free), not only `dtrain --version`.
#pragma once

#include "launch/host_probe.h"
#include "launch/job.h"
#include "launch/node_spawner.h"

#include <memory>
#include <string>

namespace dtrain::doctor {

/// A launch::HostProbe that runs preflight_nodes for one host (its hostfile slots as the
/// node's ranks) through `spawner`, against a copy of `job` taken now (config, run
/// directory, dtrain path). Each probe is bounded by the smaller of doctor.timeout and
/// elastic.probe_timeout (after the SSH connect). A failed probe's why is the
/// preflight's message (check named, what to do). expected_build_id "" = this
/// process's own build (the launcher's); a test sets the dtrain binary's.
///
///     opts.probe_factory = [sp](const launch::Job& j) { return doctor::host_probe_doctor(j, sp); };
std::unique_ptr<launch::HostProbe> host_probe_doctor(const launch::Job& job, launch::NodeSpawner spawner,
                                                     const std::string& expected_build_id = "");

}  // namespace dtrain::doctor
