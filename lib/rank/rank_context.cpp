// Rank context: env contract, token, store and communicator creation.
#include "rank/rank_context.h"

#include "comm/gloo_comm.h"
#include "comm/nccl_comm.h"
#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "launch/job.h"
#include "launch/rank_watch.h"

#include <poll.h>
#include <unistd.h>

#include <cstdlib>

namespace dtrain::rank {

namespace {

std::string env_str(const char* name, bool required = true) {
  const char* v = env_get(name);
  if (!v || !*v) {
    DT_ENFORCE(!required, UsageError,
               "environment variable {} is not set: dtrain worker runs under dtrain agent, which sets it", name);
    return "";
  }
  return v;
}

int env_int(const char* name, int lo, int hi) {
  std::string s = env_str(name);
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  DT_ENFORCE(end && *end == '\0' && v >= lo && v <= hi, UsageError, "{}='{}' must be an integer in [{}, {}]", name, s,
             lo, hi);
  return static_cast<int>(v);
}

std::string read_line(int fd) {
  std::string line;
  for (int i = 0; i < 600; ++i) {  // 60 s at most
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, 100);
    if (r < 0 && errno == EINTR) continue;
    DT_ENFORCE(r >= 0, IoError, "poll on stdin failed");
    if (r == 0) continue;
    char c;
    ssize_t n = ::read(fd, &c, 1);
    DT_ENFORCE(n > 0, UsageError, "stdin closed before the rendezvous token arrived");
    if (c == '\n') return line;
    line.push_back(c);
    DT_ENFORCE(line.size() < 4096, UsageError, "rendezvous token line too long");
    i = 0;
  }
  DT_THROW(UsageError, "no rendezvous token on stdin within 60 s");
}

}  // namespace

RankContext rank_context_from_env(int token_fd) {
  RankContext c;
  c.world_size = env_int("WORLD_SIZE", 1, 1 << 20);
  c.rank = env_int("RANK", 0, c.world_size - 1);
  c.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, c.world_size);
  c.local_rank = env_int("LOCAL_RANK", 0, c.local_world_size - 1);
  c.nnodes = env_int("NNODES", 1, c.world_size);
  c.node_rank = env_int("NODE_RANK", 0, c.nnodes - 1);
  c.round = env_int("DTRAIN_ROUND", 0, 1 << 20);
  c.master_addr = env_str("MASTER_ADDR");
  c.master_port = env_int("MASTER_PORT", 1, 65535);
  c.job_id = env_str("DTRAIN_JOB_ID");
  c.run_dir = env_str("DTRAIN_RUN_DIR");
  c.mode = env_str("DTRAIN_MODE");
  c.config_path = env_str("DTRAIN_CONFIG", false);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  set_error_context(fmt::format("host={} rank={}", host, c.rank));
  c.token = read_line(token_fd);
  rank_context_connect(c, std::chrono::seconds(30));
  return c;
}

void rank_context_connect(RankContext& c, std::chrono::milliseconds connect_timeout) {
  c.store = std::make_unique<rendezvous::StoreClient>(c.master_addr, static_cast<uint16_t>(c.master_port), c.token,
                                                      connect_timeout);
  c.round_store = std::make_unique<rendezvous::PrefixStore>(*c.store, c.job_id, c.round);
  c.gloo_store =
      std::make_shared<rendezvous::GlooStore>(*c.store, c.round_store->prefix() + "comm/", std::chrono::seconds(120));
}

std::unique_ptr<rendezvous::Heartbeat> rank_heartbeat_start(RankContext& ctx, std::chrono::milliseconds interval) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  ctx.round_store->set(launch::rank_info_key(ctx.rank), fmt::format("{} {}", ::getpid(), host));
  return std::make_unique<rendezvous::Heartbeat>(ctx.master_addr, static_cast<uint16_t>(ctx.master_port), ctx.token,
                                                 launch::rank_beat_name(ctx.rank), interval, ctx.round_store->prefix());
}

std::unique_ptr<comm::Communicator> rank_comm_create(RankContext& ctx, comm::Backend backend) {
  if (backend == comm::Backend::NCCL) {
    // CUDA_VISIBLE_DEVICES lists this node's slots, so local rank i opens device i. In a
    // CPU-only build the factory throws DeviceError saying so.
    comm::NcclOptions o;
    return comm::comm_create_nccl(*ctx.gloo_store, ctx.rank, ctx.world_size, ctx.local_rank, o);
  }
  comm::GlooOptions o;
  o.interface = env_str("DTRAIN_NETWORK_INTERFACE", false);
  if (o.interface.empty()) o.address = launch::local_address_towards(ctx.master_addr);
  return comm::comm_create_gloo(ctx.gloo_store, ctx.rank, ctx.world_size, o);
}

std::thread rank_watch_parent(int fd, std::function<void()> on_parent_gone) {
  return std::thread([fd, cb = std::move(on_parent_gone)] {
    char buf[64];
    while (true) {
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, 500);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) break;
      if (r == 0) continue;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
    }
    cb();
  });
}

}  // namespace dtrain::rank
