// A job ready to launch: the loaded config, the selected hosts, the rank placement, the
// run directory and the launch spec every node command is built from. Shared by
// `dtrain launch`, `dtrain resume` and `dtrain bench`.
#pragma once

#include "config/host_filter.h"
#include "config/hostfile.h"
#include "config/train_config.h"
#include "launch/node_command.h"
#include "launch/placement.h"
#include "launch/plan_target.h"

#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

struct JobRequest {
  std::string config_path;                // "" = the embedded default job
  std::string hostfile_path;              // "" = localhost
  std::optional<config::Hostfile> hosts;  // given hosts (Slurm allocation) instead of a hostfile
  std::string output_dir;                 // "" = training.output_dir
  std::vector<std::string> sets;          // --set key.path=value
  config::HostSelection selection;        // --include/--exclude/--num-nodes/--num-gpus
  int nproc_per_node = -1;                // localhost slots without a hostfile (-1 = GPUs or 1)
  std::string master_addr;                // "" = cluster.rendezvous.address
  int master_port = -1;                   // -1 = cluster.rendezvous.port
  std::string mode = "train";             // "train" | "bench"
  bool require_training = true;           // check the config describes a runnable job
  bool dry_run = false;                   // plan only: an incomplete job is reported, not refused
  // --plan-for (a dry run): the job is planned for that cluster, not this machine's; what
  // this machine lacks (the model's weights, tokenizer, data) is a note, not a blocker.
  std::optional<PlanTarget> plan_for;
};

struct Job {
  config::TrainConfig cfg;
  std::vector<std::string> warnings;  // config warnings, for the caller to print
  config::Hostfile hosts;             // after selection
  Plan plan;
  LaunchSpec spec;
  std::string run_dir;     // absolute
  bool all_local = true;   // every host is this machine
  std::string incomplete;  // dry run: why this config could not train ("" = it can)
  // Dry run: each reason a launch of this complete job would fail on this machine (a
  // missing input, no GPU here); the dry run prints them and exits 2.
  std::vector<std::string> blockers;
  std::vector<std::string> data_lines;  // how data.format was told when not given
  // --plan-for: each input this machine does not hold, which the planned cluster must (the
  // dry run prints them as notes; they change nothing in its exit code).
  std::vector<std::string> elsewhere;
  std::optional<PlanTarget> plan_for;
  bool run_dir_pending = false;  // config.pending.yaml awaits job_commit_run_dir
};

/// Loads and validates everything; creates nothing on disk. ConfigError/IoError on bad
/// input. The plan's master_port is the configured one (0 is resolved when the
/// rendezvous server binds: job_set_port).
Job job_prepare(const JobRequest& req);

/// Sets the rendezvous port once the server is bound.
void job_set_port(Job& job, int port);

/// Creates the run directory with training.run_dir_mode and writes config.yaml (the
/// resolved config) and hostfile into it (files without x bits), so `dtrain resume
/// RUN_DIR` can start the same job again. With defer (resume), the ranks get the config
/// as config.pending.yaml and config.yaml and hostfile stay as they are until
/// job_commit_run_dir: a resume that fails to start (a --set that does not fit the
/// checkpoint) leaves the run as it was.
void job_write_run_dir(Job& job, bool defer = false);

/// Makes a deferred config the run's own, once its first round started: the old
/// config.yaml becomes config.prev.yaml (when the config changed), config.pending.yaml
/// becomes config.yaml, hostfile is rewritten, and later rounds read config.yaml.
/// Nothing to do when nothing is pending. IoError when a file cannot be written.
void job_commit_run_dir(Job& job);

/// "20261122-001500-3fa9": a sortable, unique-enough job id.
std::string job_id_generate();

/// The address of this machine that `remote_host` would be reached from (no packet is
/// sent: a UDP socket is connected and asked for its local address), over IPv4 when
/// remote_host has an IPv4 address, else over IPv6: 127.0.0.1 (::1) for a loopback host, this node's own address when remote_host
/// is one of its addresses, and the first non-loopback IPv4 address when remote_host
/// cannot be resolved. IPv6 results are bare, link-local ones with their zone (fe80::1%eth0).
std::string local_address_towards(const std::string& remote_host);

/// Absolute path of the running executable (/proc/self/exe).
std::string self_exe_path();

/// `p` with a leading "~/" replaced by `home` ("" or no "~/": p unchanged).
std::string path_expand_home(const std::string& p, const std::string& home);

}  // namespace dtrain::launch
