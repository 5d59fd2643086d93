// `dtrain status RUN_DIR`: what a run is doing, read from its run directory only
// (launcher.json, events.jsonl, metrics.jsonl, checkpoints/latest, nodes.json), plus
// the writers for the two files the launcher keeps current for it.
#pragma once

#include "report/event.h"
#include "report/progress_record.h"
#include "report/resource_status.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::report {

// ----------------------------------------------------------------------------
// Files the launcher writes (schemas owned here)

/// <run_dir>/launcher.json: {"pid", "host", "job_id", "started_ms" (unix ms),
/// "pid_start" (the process start time in clock ticks from /proc/<pid>/stat, so a
/// reused pid is not mistaken for the launcher)}. Written atomically (tmp + rename)
/// for the calling process. IoError when the file cannot be written.
void status_write_launcher(const std::string& run_dir, const std::string& job_id);

/// One node's health as the launcher sees it.
struct NodeHealth {
  int node = 0;
  std::string host;
  double heartbeat_age_s = -1.0;  ///< seconds since its last heartbeat; < 0: none yet
  std::string state;              ///< "running", "done", "failed" or "starting"
  int first_rank = -1;            ///< its global ranks: first_rank .. first_rank + num_ranks - 1
  int num_ranks = 0;
};

/// <run_dir>/nodes.json: {"time_ms" (unix ms), "round", "nodes": [{"node", "host",
/// "heartbeat_age_s", "state"}]}, written atomically. Meant to be called about once a
/// second by the supervisor. IoError when the file cannot be written.
/// The events rank 0 of `dtrain run` appends to events.jsonl when its round starts, in
/// order: when the previous round has no final event (its rank 0 was killed), a
/// "failure" for it saying so; then "round_start" with time_ms, round (the rounds already
/// in events.jsonl, as round_history counts them: restarts by the platform count on), world_size,
/// started_by (the launcher whose environment placed the ranks), and this process's pid,
/// host and pid_start for liveness.
std::vector<Event> status_external_round_start(const std::string& run_dir, int world_size,
                                               const std::string& started_by);

/// straggler_factor / straggler_window: the run's fault_tolerance straggler rule, so
/// status applies the launcher's rule to metrics.jsonl (0 = not recorded).
void status_write_nodes(const std::string& run_dir, int round, const std::vector<NodeHealth>& nodes,
                        double straggler_factor = 0.0, int straggler_window = 0);

// ----------------------------------------------------------------------------
// Reading

enum class RunState {
  NOT_STARTED,  ///< no events yet and no live launcher
  RUNNING,      ///< the launcher process is alive
  FINISHED,     ///< last event "finished"
  FAILED,       ///< last event a failure and the launcher is gone
  INTERRUPTED,  ///< stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP (a failure marked "interrupted")
  LOST          ///< the launcher vanished without a final event (killed, node rebooted)
};
/// "not started", "running", "finished", "failed", "interrupted", "lost".
const char* run_state_name(RunState s);

struct RoundFailure {
  int round = 0;
  std::optional<int> node;   ///< the node blamed; none when no node started, or when interrupted
  bool interrupted = false;  ///< the launcher was stopped by a signal
  std::string why;
  int exit_code = 0;
  int64_t time_ms = 0;
  bool started = true;  ///< false: the round could not start (a "round_not_started" event), no node ran
  bool retry = false;   ///< the launcher said it starts another round
};

/// One change of an elastic job's membership (a "membership" event).
struct MembershipRecord {
  int round = 0;
  int64_t time_ms = 0;
  std::vector<std::string> hosts;  ///< the round's hosts ([] when it could not run)
  int world_size = 0;
  std::vector<std::string> changes;  ///< "left node3: failed the probe: ..." / "joined ..."
  std::string batch;                 ///< what happened to the batch
  std::string problem;               ///< not "": too few hosts to run
};

/// A rank flagged by the straggler rule over metrics.jsonl's latest records.
struct StragglerFlag {
  int rank = 0;
  std::string host;  ///< from nodes.json ("?" when unknown)
  double compute_ms = 0, median_ms = 0, ratio = 0;
  int records = 0;
};

struct RunStatus {
  std::string run_dir;
  RunState state = RunState::NOT_STARTED;
  // launcher.json
  bool have_launcher = false;
  int launcher_pid = 0;
  std::string launcher_host, job_id;
  int64_t started_ms = 0;
  bool launcher_alive = false;
  bool launcher_remote = false;  ///< on another host: liveness unknown from here
  // events.jsonl (counted by round_history, as `dtrain plot` counts them)
  int rounds = 0;              ///< rounds attempted: round_start and round_not_started events
  int rounds_not_started = 0;  ///< of those, rounds no node ran in (too few hosts, preflight refused)
  int restarts = 0;            ///< rounds started again after a failure (including those that could not start)
  int resumes = 0;             ///< rounds 0 of later launchers (dtrain resume)
  /// "" when dtrain launch ran the last round; else the launcher whose processes ran it
  /// under `dtrain run` ("torchrun", "srun", ...): its rank 0 (launcher_pid on
  /// launcher_host) wrote the events, and the platform restarts it, not dtrain resume.
  std::string started_by;
  std::string last_event;  ///< the last event's name ("failure", "round_start", ...)
  int64_t last_event_ms = 0;
  std::vector<RoundFailure> failures;
  // metrics.jsonl
  std::optional<int64_t> last_step;
  double last_loss = 0.0;
  double tokens_per_s = 0.0;
  NamedMetrics last_metrics;  ///< the last training record's named extra metrics (DPO's rewards/...)
  std::optional<int64_t> last_eval_step;
  double last_eval_loss = 0.0;
  // checkpoints
  std::string checkpoint;       ///< "step120", "" = none
  std::string checkpoint_note;  ///< why `latest` could not be used, if it exists
  // nodes.json
  bool have_nodes = false;
  int64_t nodes_time_ms = 0;
  int nodes_round = 0;
  std::vector<NodeHealth> nodes;
  // elastic membership history (events.jsonl) and stragglers (metrics.jsonl + nodes.json)
  std::vector<MembershipRecord> membership;
  int resizes = 0;                ///< rounds after one an elastic job ended at a checkpoint to regrow
  double straggler_factor = 0.0;  ///< the rule (nodes.json); 0 = unknown, no check
  int straggler_window = 0;
  std::vector<StragglerFlag> stragglers;
  // the resource monitor: every node's latest samples (resources/rank<R>.jsonl), its alerts
  // (events.jsonl; under dtrain run also the ranks' files)
  std::vector<NodeResources> resources;
  std::vector<ResourceAlertRecord> resource_alerts;
};

/// Reads the run directory (a checkpoint counts once checkpoints/latest names a directory
/// holding manifest.json, as train/checkpoint.h writes it). Missing files mean "nothing yet"; a last line without
/// its newline (a record being written right now) is skipped, as are broken metrics.jsonl lines (rank 0's file).
/// IoError when run_dir is not a directory, or when launcher.json or nodes.json is not one JSON object or a
/// complete events.jsonl line is not one (corrupt: the message names the file and line). UsageError when the
/// directory holds nothing a run writes (not a run directory).
/// checkpoint_problem, when given, says why a checkpoint directory is unusable ("" when
/// it is usable; train::checkpoint_problem): the checkpoint reported is then the one a
/// resume would load (latest, else the newest older one that passes), and none when none
/// passes, with the reasons in checkpoint_note.
using CheckpointProblem = std::function<std::string(const std::string& checkpoint_dir)>;
RunStatus status_read(const std::string& run_dir, const CheckpointProblem& checkpoint_problem = {});

/// The human-readable report (now_ms: the current unix time; tests pass a fixed one), e.g.
///     run        runs/tiny (job 20261122-001500-3fa9)
///     state      running: launcher pid 4242 on login1, started 12m04s ago
///     progress   step 140, loss 2.3141, 18.2k tokens/s; eval_loss 2.2010 at step 100
///     metrics    rewards/accuracies 0.9333, rewards/margins 1.2041 (step 140; only with named metrics)
///     checkpoint step120
///     restarts   1
///       round 0 failed 9m12s ago: node 1: rank 3 exited with code 137 [exit code 137]
///     nodes      round 1, as of 0.4 s ago
///       node0 n1 running last heartbeat 1.6 s ago
std::string status_format(const RunStatus& st, int64_t now_ms);

/// status_format(status_read(run_dir, now), now) with the current time.
std::string status_report(const std::string& run_dir, const CheckpointProblem& checkpoint_problem = {});

}  // namespace dtrain::report
