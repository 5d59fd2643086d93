// `dtrain run`: one process of a job whose processes someone else started (torchrun, a
// Kubernetes PyTorchJob or Indexed Job, srun, mpirun). This module reads the placement
// from that launcher's environment, reads the job token from where the platform put it,
// and keeps the job's fate shared without a dtrain launcher: rank 0 hosts the store and
// watches every rank's heartbeat; any failure sets the round's stop key, and every
// process that sees it (or loses the store) exits non-zero, so the platform's restart
// policy fires.
#pragma once

#include "rendezvous/store.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::rank {

struct RankContext;

// ----------------------------------------------------------------------------
// Placement from the environment

struct ExternalPlacement {
  std::string launcher;  // "torchrun", "srun", "Open MPI" or "PMI"
  std::string evidence;  // the variables read, "RANK=2 WORLD_SIZE=3 ...", for the log line
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1, node_rank = 0, nnodes = 1;
  std::string master_addr;  // "" = not given by the launcher
  int master_port = 0;      // 0 = not given by the launcher
  std::string run_id;       // the launcher's job / run id ("" = none): names the store's keys
};

/// The placement from `env`, trying torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; Kubeflow's PyTorchJob sets
/// the same; a Kubernetes Indexed Job's JOB_COMPLETION_INDEX stands for RANK when RANK is
/// not set), then Open MPI's (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE),
/// then Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES;
/// the master is the first host of SLURM_STEP_NODELIST or SLURM_JOB_NODELIST), then
/// PMI's (PMI_RANK, PMI_SIZE; MPI_LOCALRANKID / MPI_LOCALNRANKS where Hydra sets them).
/// MASTER_ADDR / MASTER_PORT, where set, win for every launcher. UsageError naming the
/// variable when one is malformed or out of range, or when none of these is set.
ExternalPlacement external_placement(const std::map<std::string, std::string>& env);

/// The node this process stands for under --nproc-per-node: the placement's rank and
/// world size (one process per node), or PET_NODE_RANK / PET_NNODES where set (Kubeflow's
/// operator sets them, and with spec.nprocPerNode its WORLD_SIZE counts processes).
/// UsageError when one is malformed or out of range.
ExternalPlacement external_node(const ExternalPlacement& p, const std::map<std::string, std::string>& env);

/// With --nproc-per-node N this process stands for a node: the placement's rank is the
/// node's index and world_size the node count. The environment of its local rank i:
/// torchrun's variables (RANK = node * N + i, WORLD_SIZE = nodes * N, LOCAL_RANK = i,
/// LOCAL_WORLD_SIZE = N, GROUP_RANK = node, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID)
/// over `base`, with the other launchers' rank variables removed so the child reads
/// these.
std::map<std::string, std::string> external_local_rank_env(const std::map<std::string, std::string>& base,
                                                           const ExternalPlacement& node, int nproc, int i,
                                                           const std::string& master_addr, int master_port);

/// "job/<id>" part of the store keys: run_id reduced to [A-Za-z0-9._-] (at most 64
/// characters), "dtrain-run" when empty.
std::string external_job_id(const std::string& run_id);

// ----------------------------------------------------------------------------
// The job token

/// The token from the file token_file (a mounted Secret; surrounding whitespace
/// trimmed) or from the environment variable token_env. Exactly one must be given and
/// hold at least 16 characters; ConfigError naming the key, the file or the variable
/// and what to do otherwise. `source` names the config for messages.
std::string external_token(const std::string& token_file, const std::string& token_env,
                           const std::map<std::string, std::string>& env, const std::string& source);

/// Warns (once, naming the file, its mode and the fix) when the token file at `path`
/// (`named` as the config says it) is readable by its group or every user. A warning and
/// not a refusal, unlike ssh's for a private key: Kubernetes mounts a Secret volume 0644
/// unless the manifest sets defaultMode, and there the file is seen only inside the pod.
void external_token_mode_check(const std::string& path, const std::string& named);

// ----------------------------------------------------------------------------
// The shared fate

/// The round's stop key: its value says why the job stops.
inline constexpr const char* kExternalStopKey = "stop";

/// What rank 0's watch concludes from the heartbeats it sees (server clock): the reason
/// to stop the job, or "" to go on. beats: rank -> (last beat value, its age); ranks
/// that have not beaten yet are absent. A rank whose last beat is kRankBeatExited is
/// done. Before join_deadline_passed, absent ranks are still joining.
std::string external_watch_verdict(const std::map<int, std::pair<std::string, std::chrono::milliseconds>>& beats,
                                   const std::map<int, std::string>& hosts, int world_size,
                                   std::chrono::milliseconds heartbeat_timeout, bool join_deadline_passed,
                                   std::chrono::milliseconds join_timeout);

// ----------------------------------------------------------------------------
// The store, hosted by rank 0 and joined by everyone

/// Rank 0's store on the address `master_addr` names where it is this host's, else on
/// every interface (a Kubernetes Service address, a name that resolves elsewhere).
/// CommError naming the port and what to do when it is in use.
std::unique_ptr<rendezvous::StoreServer> external_store_host(const std::string& master_addr, int port,
                                                             const std::string& token);

/// Whether a store that takes `token` (this job's) answers at host:port within 2 s: when
/// rank 0 cannot host the store because its port is in use, the holder may be another
/// process of this job (a second rank 0 on this host), which the join then names.
bool external_store_answers(const std::string& host, int port, const std::string& token);

/// Waits until the store at host:port answers (its name may not resolve yet: a pod's DNS
/// record appears when the pod starts; rank 0 may start last) and authenticates with
/// `token`, for at most `timeout`. CommError naming the store and
/// cluster.rendezvous.join_timeout otherwise; a refused token fails at once.
void external_store_wait(const std::string& host, int port, const std::string& token,
                         std::chrono::milliseconds timeout);

// ----------------------------------------------------------------------------
// The shared fate

/// Every process: polls the round's stop key (prefix + kExternalStopKey) on its own
/// connection and calls on_stop(reason) when it appears, or when the store stays
/// unreachable for `lost_timeout` (rank 0 is gone). on_stop is called at most once, from
/// the watch's thread; it is expected to end the process. With `server` (rank 0) the
/// watch first lets the others read the reason (bounded: 3 s while more than its own
/// connections remain).
class ExternalStopWatch {
 public:
  ExternalStopWatch(const RankContext& ctx, std::chrono::milliseconds lost_timeout,
                    const rendezvous::StoreServer* server, std::function<void(const std::string&)> on_stop);
  ~ExternalStopWatch();
  ExternalStopWatch(const ExternalStopWatch&) = delete;
  ExternalStopWatch& operator=(const ExternalStopWatch&) = delete;
  /// Training is over: a later stop or a vanished store no longer concerns this process.
  void disarm() { done_ = true; }

 private:
  void run(std::string host, int port, std::string token, std::string stop_key, std::chrono::milliseconds lost_timeout,
           const rendezvous::StoreServer* server, std::function<void(const std::string&)> on_stop);
  std::atomic<bool> done_{false};
  std::thread thread_;
};

/// Rank 0: watches the round's failure reports ("fail/rank<R>" = "<exit code> <why>"),
/// heartbeats ("hb/rank<R>") and rank info in its own server, and sets the stop key
/// with the reason: a rank's own error before the communication errors of its peers that
/// follow it (it looks a second for one), else a silent rank or one that never joined
/// (external_watch_verdict). It sets the key on a connection of its own to ctx's store:
/// the rank's own client may be held by a blocking request for as long as that request's
/// timeout. Stops watching once it has set the key.
class ExternalRankZeroWatch {
 public:
  ExternalRankZeroWatch(const rendezvous::StoreServer& server, const RankContext& ctx, int world_size,
                        std::chrono::milliseconds heartbeat_timeout, std::chrono::milliseconds join_timeout);
  ~ExternalRankZeroWatch();
  ExternalRankZeroWatch(const ExternalRankZeroWatch&) = delete;
  ExternalRankZeroWatch& operator=(const ExternalRankZeroWatch&) = delete;

 private:
  void run(const rendezvous::StoreServer& server, std::string host, int port, std::string token, std::string prefix,
           int world_size, std::chrono::milliseconds heartbeat_timeout, std::chrono::milliseconds join_timeout);
  std::atomic<bool> done_{false};
  std::thread thread_;
};

/// The stop reason rank 0's watch derives from the failure reports (key "rank<R>" ->
/// "<exit code> <why>") after `since_first` of seeing the first: a report whose code is
/// not `comm_code` (a rank's own error) at once, else the first report after a second;
/// "" = wait.
std::string external_failure_reason(const std::map<std::string, std::string>& reports, int comm_code,
                                    std::chrono::milliseconds since_first);

}  // namespace dtrain::rank
