// Probing a host before it takes part in a round of an elastic job: the interface the
// membership code asks ("may this host run ranks now?") and its cheap implementation (SSH
// with the job's options, `dtrain --version` printing this build's version). The CLI uses
// lib/doctor/host_probe_doctor.h (the preflight's checks) when doctor.preflight is on.
#pragma once

#include "config/hostfile.h"
#include "config/train_config.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::launch {

struct ProbeResult {
  bool ok = false;
  std::string why;  ///< when !ok: what failed on that host and what to do
};

/// Checks one host. Implementations bound their own time and never throw for a host
/// that is down or wrong (that is a failed ProbeResult); probe() is called from several
/// threads at once.
class HostProbe {
 public:
  virtual ~HostProbe() = default;
  virtual ProbeResult probe(const config::HostEntry& host) = 0;
};

/// The cheap probe: runs `<dtrain_path> --version` on the host (over SSH with cfg's
/// cluster.ssh options, or directly for this machine) and passes when it exits 0 within
/// `timeout` printing "dtrain <this build's version>".
std::unique_ptr<HostProbe> host_probe_version(const config::TrainConfig& cfg, const std::string& dtrain_path,
                                              std::chrono::milliseconds timeout);

/// probe() of every host in parallel; results in the order of `hosts`.
std::vector<ProbeResult> host_probe_all(HostProbe& probe, const std::vector<config::HostEntry>& hosts);

}  // namespace dtrain::launch
