// `dtrain doctor` and the preflight as a library: check every node of a prepared job in
// parallel through the job's own spawner (SSH with the configured key and host-key
// policy, local, or srun) by running the hidden `dtrain doctor-node` there, then judge
// the answers (analysis.h) and, for the full doctor, the network (net_probe.h).
#pragma once

#include "doctor/analysis.h"
#include "launch/job.h"
#include "launch/supervisor.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dtrain::doctor {

struct DoctorOptions {
  /// Run the collective connectivity check and the pairwise bandwidth table.
  bool network = true;
  /// Indices into job.plan.nodes to check; empty = every node.
  std::vector<int> nodes;
  /// Preflight: a clock off by more than doctor.max_clock_skew is a warning, not a failure.
  bool clock_is_warning = false;
  /// The build every node must run; "" = this process's own (the launcher's build_id()).
  /// Set it when the caller is not the dtrain binary itself (a test, another tool).
  std::string expected_build_id;
};

struct Report {
  std::string run_dir;
  Expectations expect;
  std::vector<NodeObservation> nodes;  ///< in the order checked
  std::vector<Finding> findings;       ///< node checks, then network checks
  bool network = false;                ///< the network phase ran
  NetworkSummary net;                  ///< node indices as in job.plan
  double seconds = 0;                  ///< wall time of the whole check

  /// True when no finding is a FAIL.
  bool ok() const;
  /// Nodes (job.plan indices) with at least one FAIL finding of their own.
  std::vector<int> failed_nodes() const;
};

/// The full doctor over `job`'s nodes: every check of analysis.h, each node in parallel,
/// every wait bounded by job.cfg.doctor.timeout (plus the bandwidth table's own budget).
/// Writes and removes RUN_DIR/.doctor/<session>/ (the nonces). Never throws for a bad
/// node: that is a finding; throws only when the launcher itself cannot run the checks
/// (e.g. the rendezvous store cannot bind).
Report doctor_run(const launch::Job& job, const launch::NodeSpawner& spawner, const DoctorOptions& opts = {});

/// The quick check before a launch round, and the health test of elastic membership:
/// SSH reachability, the same dtrain build as the launcher, slots vs visible GPUs/CPUs,
/// a shared and writable run directory with doctor.min_free_gb free, clock skew (a
/// warning only). No network phase; all nodes at once, so it takes about one SSH connect
/// plus a process start (well under a second per round on a LAN).
///
///     auto r = doctor::preflight(job, spawner);          // every node of job.plan
///     auto r = doctor::preflight(job, spawner, {2});     // only node 2 (e.g. a node that left)
///     if (!r.ok()) for (int k : r.failed_nodes()) ...;   // unhealthy: k indexes job.plan.nodes
///     log_error("{}", preflight_message(r));             // one line per failure, host and check named
Report preflight(const launch::Job& job, const launch::NodeSpawner& spawner, const std::vector<int>& nodes = {},
                 const std::string& expected_build_id = "");

/// The same quick check for nodes that are not (or no longer) in job.plan, e.g. a node
/// that left an elastic job and is probed before it rejoins: each NodePlan gives the host
/// and its slots (its ranks); findings carry its node_rank. Same config, run directory,
/// dtrain path and spawner as the job.
Report preflight_nodes(const launch::Job& job, const launch::NodeSpawner& spawner,
                       const std::vector<launch::NodePlan>& nodes, const std::string& expected_build_id = "");

/// The supervisor's form of a preflight report (launch::SupervisorOptions::preflight):
/// the first failing node and preflight_message; an empty verdict when ok.
launch::PreflightVerdict preflight_verdict(const Report& r);

/// The FAIL findings, one line each: "node 2 (root@10.0.0.3): build: <detail>; <advice>".
/// "" when the report is ok.
std::string preflight_message(const Report& r);

/// A table a person reads at a glance: one row per node and check column, the link
/// table with the slowest link and slow nodes marked, then every problem with what to do.
std::string report_table(const Report& r);

/// The same as JSON for scripts: {"ok", "run_dir", "launcher", "nodes": [...],
/// "links": [...], "slowest_link", "slow_nodes", "findings": [...]}.
nlohmann::json report_json(const Report& r);

}  // namespace dtrain::doctor
