// `dtrain worker` (worker.h): the rank's identity and token, its heartbeat and the
// agent watch, then the job's mode: the collective sweep or training.
#include "rank/worker.h"

#include "comm/communicator.h"
#include "core/c_escape.h"
#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "core/output_path.h"
#include "core/input_file.h"
#include "device/device.h"
#include "config/train_config.h"
#include "launch/agent.h"
#include "launch/job.h"
#include "launch/rank_watch.h"
#include "rank/rank_context.h"
#include "rank/train_rank.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

namespace dtrain::rank {

namespace {

// The --json file under the output rule (core/output_path.h), checked before the bench
// runs: never a directory, an existing file only when it is a bench report (or --force);
// a device or FIFO (/dev/stdout) is written in place. Refusals are usage errors (exit 2),
// so a job is not restarted over them.
OutputFile bench_json_target(const WorkerBench& o) {
  OutputRule rule;
  rule.what = "bench --json";
  rule.in_place = true;
  rule.force = o.json_force;
  rule.own = [](const std::string& target) {
    if (!input_file_problem(target, 256u << 20).empty()) return false;
    try {
      const auto j = nlohmann::json::parse(input_file_read(target, "bench report", 256u << 20));
      return j.is_object() && j.contains("rows") && j.contains("backend") && j.contains("world_size");
    } catch (const std::exception&) {
      return false;
    }
  };
  rule.own_kind = "a dtrain bench report";
  OutputFile f = output_file_check(o.json, rule);
  f.given = "--json file " + o.json;
  return f;
}

// Every byte checked (a full disk or /dev/full is an error naming the file and the
// reason); the file is renamed into place only when whole, so a failed write leaves the old
// file or nothing. A usage error too: retrying the job would run the whole bench again
// and fail the same way.
void bench_json_write(const OutputFile& out, const std::string& text) {
  try {
    output_file_write(out, text);
  } catch (const IoError& e) {
    DT_THROW(UsageError, "{}; the results are only in the output above; give --json a file that can be written",
             e.what());
  }
}

int worker_bench(RankContext& ctx, const std::function<WorkerBench()>& parse) {
  DT_ENFORCE(parse != nullptr, UsageError, "dtrain worker: bench mode without bench options");
  const WorkerBench o = parse();
  const bench::BenchOptions& opts = o.opts;
  comm::Backend backend = comm::Backend::GLOO;
  if (!o.backend.empty()) {
    comm::backend_parse(o.backend, &backend);
  } else {
    if (device::cuda_count() > 0) backend = comm::Backend::NCCL;
  }
  std::optional<OutputFile> json_out;
  if (ctx.rank == 0 && !o.json.empty()) json_out = bench_json_target(o);
  auto comm = rank_comm_create(ctx, backend);
  auto rows = bench::bench_run(*comm, opts, ctx.rank == 0 ? stdout : nullptr);
  std::fflush(stdout);
  if (json_out) bench_json_write(*json_out, bench::bench_json(rows, ctx.world_size, backend, opts) + "\n");
  comm->barrier();
  int64_t wrong = bench::bench_wrong_total(rows);
  DT_ENFORCE(wrong == 0, CommError, "{} wrong element(s) in the collective results", wrong);
  return 0;
}

int worker_train(RankContext& ctx, rendezvous::Heartbeat& hb) {
  DT_ENFORCE(!ctx.config_path.empty(), UsageError, "DTRAIN_CONFIG is not set: the launcher passes the run's config");
  config::LoadedConfig loaded = config::config_load_file(ctx.config_path);
  config::TrainConfig cfg = std::move(loaded.cfg);
  // The agent decided the device before starting us (DTRAIN_DEVICE: cpu or cuda).
  const char* dev_env = env_get("DTRAIN_DEVICE");
  // The test seam: DTRAIN_TEST_* faults, set by the multi-process tests (none in production).
  return train_rank(ctx, hb, std::move(cfg), device::kind_parse(dev_env && *dev_env ? dev_env : "cpu", "DTRAIN_DEVICE"),
                    true, train_rank_hooks_from_env());
}

// DTRAIN_WORKER_PRINT_ENV=NAME,NAME,...: print those variables (C-escaped) plus the
// torchrun contract, one "env NAME=value" line each, so operators (and the multi-node
// tests) can see exactly what a rank received.
void print_env_if_asked() {
  const char* list = env_get("DTRAIN_WORKER_PRINT_ENV");
  if (!list || !*list) return;
  std::vector<std::string> names = {"RANK",      "LOCAL_RANK",  "WORLD_SIZE",  "LOCAL_WORLD_SIZE",
                                    "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};
  std::string cur;
  for (const char* p = list;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty() && cur != "1") names.push_back(cur);
      cur.clear();
      if (!*p) break;
    } else {
      cur.push_back(*p);
    }
  }
  for (const auto& n : names) {
    const char* v = env_get_user_named(n);  // names the user chose: no table lists them
    std::printf("env %s=%s\n", n.c_str(), v ? c_escape(v).c_str() : "<unset>");
  }
  std::fflush(stdout);
}

}  // namespace

int worker_run(const WorkerOptions& o) {
  ::signal(SIGPIPE, SIG_IGN);  // a dead peer's socket must be an error, not a silent exit
  RankContext ctx = rank_context_from_env(STDIN_FILENO);
  print_env_if_asked();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  log_debug("rank {} (local {}, node {}) on {}, gloo address {}", ctx.rank, ctx.local_rank, ctx.node_rank, host,
            launch::local_address_towards(ctx.master_addr));
  // The agent keeps our stdin open; EOF means it died without stopping us.
  rank_watch_parent(STDIN_FILENO, [exit_now = o.exit_now] {
    std::fputs("[dtrain] error: the node agent went away: rank exiting\n", stderr);
    std::fflush(stderr);
    exit_now(static_cast<int>(Exit::COMM));
  }).detach();
  DT_ENFORCE(ctx.mode == "bench" || ctx.mode == "train", UsageError,
             "unknown worker mode '{}' (expected train or bench)", ctx.mode);
  // Proof of life from this process itself: the agent sees only that the pid exists,
  // which a stopped or frozen rank still does; this thread stops with the process.
  auto hb = rank_heartbeat_start(ctx, launch::agent_timing_from_env().heartbeat_interval);
  const int rc = ctx.mode == "bench" ? worker_bench(ctx, o.bench) : worker_train(ctx, *hb);
  hb->finish(launch::kRankBeatExited);
  return rc;
}

}  // namespace dtrain::rank
