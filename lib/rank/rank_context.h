// What a rank process knows about itself: the torchrun-style environment the agent set
// (RANK, LOCAL_RANK, WORLD_SIZE, ...), the rendezvous token from its stdin, its store
// connection scoped to the job's round, and the communicator built over that store.
#pragma once

#include "comm/communicator.h"
#include "rendezvous/gloo_store.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/store.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace dtrain::rank {

struct RankContext {
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1, node_rank = 0, nnodes = 1, round = 0;
  std::string master_addr;
  int master_port = 0;
  std::string job_id, run_dir, mode, config_path;
  std::string token;  // the rendezvous token (for further connections: the heartbeat's)
  std::unique_ptr<rendezvous::StoreClient> store;
  std::unique_ptr<rendezvous::PrefixStore> round_store;  // "job/<id>/r<round>/"
  std::shared_ptr<rendezvous::GlooStore> gloo_store;     // under "<round prefix>comm/"
};

/// Reads the environment (UsageError naming a missing or bad variable) and the token
/// (first line of token_fd), then connects to the store.
RankContext rank_context_from_env(int token_fd);

/// Connects c.store (retrying until connect_timeout: the server may start later) to
/// c.master_addr:c.master_port with c.token, and scopes round_store and gloo_store to
/// c.job_id / c.round.
void rank_context_connect(RankContext& c, std::chrono::milliseconds connect_timeout);

/// Starts this rank's heartbeat (rank_watch.h: "hb/rank<R>" every interval on its own
/// connection, from a thread of this process, so it stops when the process is stopped)
/// and publishes "rankinfo/rank<R>" = "<pid> <hostname>". CommError when the store
/// cannot be reached. Report training steps with progress(), and finish(kRankBeatExited)
/// on a clean return.
std::unique_ptr<rendezvous::Heartbeat> rank_heartbeat_start(RankContext& ctx, std::chrono::milliseconds interval);

/// The communicator for this rank: Gloo over TCP bound to DTRAIN_NETWORK_INTERFACE or
/// the address that routes to MASTER_ADDR; NCCL on this rank's CUDA device.
std::unique_ptr<comm::Communicator> rank_comm_create(RankContext& ctx, comm::Backend backend);

/// Calls on_parent_gone (from a thread) when token_fd reaches EOF: the agent died
/// without stopping this rank. The returned thread is detached by the caller's choice.
std::thread rank_watch_parent(int token_fd, std::function<void()> on_parent_gone);

}  // namespace dtrain::rank
