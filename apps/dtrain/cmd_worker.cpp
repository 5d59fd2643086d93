// Internal `dtrain worker`: one rank process, started by the node agent. Reads its
// identity from the environment, joins the round's store, builds the communicator and
// runs the job's mode (bench sweep or training).
#include "bench_options.h"
#include "commands.h"

#include "bench/bench.h"
#include "comm/activity.h"
#include "core/c_escape.h"
#include "core/check.h"
#include "core/log.h"
#include "config/train_config.h"
#include "device/device.h"
#include "launch/agent.h"
#include "launch/rank_device.h"
#include "launch/job.h"
#include "launch/membership.h"
#include "launch/rank_context.h"
#include "launch/rank_watch.h"
#include "launch/run_dir.h"
#include "monitor/monitor.h"
#include "tensorboard/event_writer.h"
#include "train/trainer.h"
#ifdef DTRAIN_HAVE_CUDA
#include "kernels/device.cuh"
#endif

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace dtrain::cli {

namespace {

// The --json results, every byte checked: a full disk (or /dev/full) is an error naming
// the file and the reason, never an empty file and exit 0.
void bench_json_write(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  DT_ENFORCE(fd >= 0, IoError, "cannot write --json file {}: {}", path, std::strerror(errno));
  int err = 0;
  for (size_t off = 0; off < text.size() && err == 0;) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) err = w < 0 ? errno : ENOSPC;  // 0: nothing more fits (errno not set)
    else off += static_cast<size_t>(w);
  }
  // Some file systems (NFS) report a full disk only when the data is flushed; a device
  // or pipe cannot be synced (EINVAL / EROFS), which is no error of the write.
  if (err == 0 && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  DT_ENFORCE(err == 0, IoError, "cannot write --json file {}: {}; the results are only in the output above", path,
             std::strerror(err));
}

int worker_bench(launch::RankContext& ctx, const std::vector<std::string>& argv) {
  CLI::App app{"dtrain worker (bench)"};
  BenchCliOptions o;
  app.add_option("--collective", o.collective);
  bench_add_options(&app, o);
  std::vector<std::string> rev(argv.rbegin(), argv.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    DT_THROW(UsageError, "bad bench arguments from the launcher: {}", e.what());
  }
  bench::BenchOptions opts = bench_options_resolve(o);
  comm::Backend backend = comm::Backend::GLOO;
  if (!o.backend.empty()) {
    comm::backend_parse(o.backend, &backend);
  } else {
#ifdef DTRAIN_HAVE_CUDA
    if (kernels::device_count() > 0) backend = comm::Backend::NCCL;
#endif
  }
  auto comm = launch::rank_comm_create(ctx, backend);
  auto rows = bench::bench_run(*comm, opts, ctx.rank == 0 ? stdout : nullptr);
  std::fflush(stdout);
  if (ctx.rank == 0 && !o.json.empty())
    bench_json_write(o.json, bench::bench_json(rows, ctx.world_size, backend, opts) + "\n");
  comm->barrier();
  int64_t wrong = bench::bench_wrong_total(rows);
  DT_ENFORCE(wrong == 0, CommError, "{} wrong element(s) in the collective results", wrong);
  return 0;
}

// Test-only (tests/cli/hung_rank_test.cpp): DTRAIN_TEST_STALL_AT_STEP=N makes the rank
// stop before training step N in round 0 (only rank DTRAIN_TEST_STALL_RANK when that is
// set) while its heartbeat goes on, as a rank stuck in a step would; the launcher's
// fault_tolerance.step_timeout must catch it. Sleeps at most 10 minutes.
void test_stall_if_asked(const launch::RankContext& ctx, int64_t done_step) {
  const char* at = std::getenv("DTRAIN_TEST_STALL_AT_STEP");
  if (!at || !*at || ctx.round != 0 || std::atoll(at) != done_step + 1) return;
  const char* only = std::getenv("DTRAIN_TEST_STALL_RANK");
  if (only && *only && std::atoi(only) != ctx.rank) return;
  std::fprintf(stderr, "[dtrain] test: DTRAIN_TEST_STALL_AT_STEP: rank %d stalls before step %s\n", ctx.rank, at);
  std::fflush(stderr);
  for (int i = 0; i < 6000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// Test-only: DTRAIN_TEST_SLOW_RANK=R with DTRAIN_TEST_SLOW_MS=M makes rank R sleep M ms
// (at most 10 s) after every training step, a persistently slow rank for the straggler
// check to flag (tests/cli/straggler_test.cpp); R = "all" slows every rank, a job paced
// so a test can act between its checkpoints (tests/cli/elastic_test.cpp).
void test_slow_if_asked(const launch::RankContext& ctx) {
  const char* r = std::getenv("DTRAIN_TEST_SLOW_RANK");
  const char* ms = std::getenv("DTRAIN_TEST_SLOW_MS");
  if (!r || !*r || !ms || !*ms || (std::string(r) != "all" && std::atoi(r) != ctx.rank)) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::clamp(std::atoi(ms), 0, 10000)));
}

int worker_train(launch::RankContext& ctx, rendezvous::Heartbeat& hb) {
  DT_ENFORCE(!ctx.config_path.empty(), UsageError, "DTRAIN_CONFIG is not set: the launcher passes the run's config");
  config::LoadedConfig loaded = config::config_load_file(ctx.config_path);
  config::TrainConfig cfg = std::move(loaded.cfg);
  // The agent decided the device before starting us (DTRAIN_DEVICE: cpu or cuda).
  const char* dev_env = std::getenv("DTRAIN_DEVICE");
  return train_rank(ctx, hb, std::move(cfg), dev_env && *dev_env ? dev_env : "cpu", true);
}

}  // namespace

int train_rank(launch::RankContext& ctx, rendezvous::Heartbeat& hb, config::TrainConfig cfg,
               const std::string& device_name, bool launcher_lines) {
  config::config_resolve_batch(cfg, ctx.world_size);
  // Before anything is allocated: this node's CPU ranks share its memory (a CUDA rank's
  // activations are on its GPU, which the launcher cannot see).
  if (device_name == "cpu")
    config::config_check_batch_memory(
        cfg, ctx.local_world_size, config::config_host_memory_bytes(),
        fmt::format("this machine has {:.1f} GiB of memory for its {} rank(s)",
                    config::config_host_memory_bytes() / (1024.0 * 1024.0 * 1024.0), ctx.local_world_size));
  // The launcher's step timeout watches the last completed step and whether this rank
  // waits in a collective (so it can tell the rank that is stuck from the peers waiting
  // for it); the heartbeat thread publishes both.
  std::mutex progress_mu;
  std::atomic<int64_t> last_step{-1};
  std::unique_ptr<comm::ActivityCommunicator> comm;
  auto publish = [&] {
    std::lock_guard<std::mutex> lock(progress_mu);  // the last caller publishes the latest state
    const int64_t step = last_step.load();
    if (step >= 0) hb.progress(launch::rank_progress_value(step, comm && comm->in_collective()));
  };
  // The backend follows the device. Local rank i opens device i of this node's
  // CUDA_VISIBLE_DEVICES.
  DT_ENFORCE(device_name == "cpu" || device_name == "cuda", UsageError,
             "the rank's device must be cpu or cuda, got \"{}\"", device_name);
  std::unique_ptr<device::Device> device;
  if (device_name == "cuda") device = device::cuda_create(ctx.local_rank);
  if (ctx.world_size > 1)
    comm = std::make_unique<comm::ActivityCommunicator>(
        launch::rank_comm_create(ctx, device ? comm::Backend::NCCL : comm::Backend::GLOO), publish);
  log_debug("rank {}: device {}, collectives {}", ctx.rank,
            device ? fmt::format("cuda:{}", ctx.local_rank) : std::string("cpu"),
            launch::rank_backend_name(device_name, ctx.world_size));
  train::TrainerEnv env;
  env.device = device.get();
  env.rank = ctx.rank;
  env.world_size = ctx.world_size;
  env.run_dir = ctx.run_dir;
  env.comm = comm.get();
  env.print_rank_times = launcher_lines;
  env.on_step = [&](int64_t step) {
    last_step = step;
    publish();
    test_stall_if_asked(ctx, step);
    if (step > 0) test_slow_if_asked(ctx);
  };
  // An elastic launcher that wants to regrow the job asks (store key) for a stop at the
  // next checkpoint; rank 0 answers for all and records the step it stopped at.
  env.stop_after_save = [&](int64_t step) {
    if (ctx.rank != 0 || !ctx.round_store) return false;
    try {
      if (!ctx.round_store->check({launch::kElasticGrowKey})) return false;
      ctx.round_store->set(launch::kElasticStoppedKey, std::to_string(step));
      return true;
    } catch (const Error& e) {
      log_warn("rank 0 could not ask the store whether to stop for a membership change: {}", e.what());
      return false;
    }
  };
  env.on_steps_done = [&] {
    std::lock_guard<std::mutex> lock(progress_mu);
    last_step = -1;  // no more steps: later collectives (the final barriers) publish nothing
    hb.progress(launch::kRankStepsDone);
  };
  // The resource monitor samples from a thread of its own until training returns.
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  monitor::MonitorOptions mo;
  mo.interval_s = cfg.monitor.interval;
  mo.run_dir = ctx.run_dir;
  mo.max_mode = launch::run_dir_mode_parse(cfg.training.run_dir_mode);
  mo.origin = {.rank = ctx.rank, .local_rank = ctx.local_rank, .node = ctx.node_rank, .round = ctx.round, .host = host};
  mo.limits.min_free_memory_bytes = static_cast<int64_t>(cfg.monitor.min_free_memory * 1024.0 * 1024.0 * 1024.0);
  mo.limits.node_checks = ctx.local_rank == 0;  // one rank per node watches the node's memory
  mo.gpu = device != nullptr;
  mo.gpu_index = monitor::nvml_index_of(ctx.local_rank, std::getenv("CUDA_VISIBLE_DEVICES"));
  mo.nvml_library = cfg.monitor.nvml_library;
  // Each rank's scalars are a TensorBoard run of their own beside rank 0's training scalars.
  if (cfg.tensorboard.enabled && !ctx.run_dir.empty())
    mo.tensorboard_dir = (std::filesystem::path(tensorboard::log_dir(ctx.run_dir, cfg.tensorboard.output_path,
                                                                     cfg.tensorboard.job_name)) /
                          "resources" / fmt::format("rank{}", ctx.rank))
                             .string();
  auto resource_monitor = monitor::monitor_start(std::move(mo), cfg.monitor.enabled);
  train::train_run(cfg, env);
  resource_monitor.reset();
  if (comm) comm->barrier();
  comm.reset();  // NCCL's communicator goes before the device it runs on
  return 0;
}

// DTRAIN_WORKER_PRINT_ENV=NAME,NAME,...: print those variables (C-escaped) plus the
// torchrun contract, one "env NAME=value" line each, so operators (and the multi-node
// tests) can see exactly what a rank received.
void print_env_if_asked() {
  const char* list = std::getenv("DTRAIN_WORKER_PRINT_ENV");
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
    const char* v = std::getenv(n.c_str());
    std::printf("env %s=%s\n", n.c_str(), v ? c_escape(v).c_str() : "<unset>");
  }
  std::fflush(stdout);
}

int run_worker(const std::vector<std::string>& argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a dead peer's socket must be an error, not a silent exit
  launch::RankContext ctx = launch::rank_context_from_env(STDIN_FILENO);
  print_env_if_asked();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  log_debug("rank {} (local {}, node {}) on {}, gloo address {}", ctx.rank, ctx.local_rank, ctx.node_rank, host,
            launch::local_address_towards(ctx.master_addr));
  // The agent keeps our stdin open; EOF means it died without stopping us.
  launch::rank_watch_parent(STDIN_FILENO, [] {
    std::fputs("[dtrain] error: the node agent went away: rank exiting\n", stderr);
    std::fflush(stderr);
    std::_Exit(static_cast<int>(Exit::COMM));
  }).detach();
  DT_ENFORCE(ctx.mode == "bench" || ctx.mode == "train", UsageError,
             "unknown worker mode '{}' (expected train or bench)", ctx.mode);
  // Proof of life from this process itself: the agent sees only that the pid exists,
  // which a stopped or frozen rank still does; this thread stops with the process.
  auto hb = launch::rank_heartbeat_start(ctx, launch::agent_timing_from_env().heartbeat_interval);
  const int rc = ctx.mode == "bench" ? worker_bench(ctx, argv) : worker_train(ctx, *hb);
  hb->finish(launch::kRankBeatExited);
  return rc;
}

}  // namespace dtrain::cli
