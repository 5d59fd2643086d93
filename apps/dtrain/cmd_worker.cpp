// Internal `dtrain worker`: one rank process, started by the node agent. Reads its
// identity from the environment, joins the round's store, builds the communicator and
// runs the job's mode (bench sweep or training).
#include "bench_options.h"
#include "commands.h"

#include "bench/bench.h"
#include "core/check.h"
#include "core/log.h"
#include "launch/rank_context.h"
#ifdef DTRAIN_HAVE_CUDA
#include "kernels/device.cuh"
#endif

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace dtrain::cli {

namespace {

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
  if (ctx.rank == 0 && !o.json.empty()) {
    std::ofstream out(o.json);
    DT_ENFORCE(out.good(), IoError, "cannot write --json file {}", o.json);
    out << bench::bench_json(rows, ctx.world_size, backend, opts) << '\n';
  }
  comm->barrier();
  int64_t wrong = bench::bench_wrong_total(rows);
  DT_ENFORCE(wrong == 0, CommError, "{} wrong element(s) in the collective results", wrong);
  return 0;
}

}  // namespace

int run_worker(const std::vector<std::string>& argv) {
  launch::RankContext ctx = launch::rank_context_from_env(STDIN_FILENO);
  // The agent keeps our stdin open; EOF means it died without stopping us.
  launch::rank_watch_parent(STDIN_FILENO, [] {
    std::fputs("[dtrain] error: the node agent went away: rank exiting\n", stderr);
    std::fflush(stderr);
    std::_Exit(static_cast<int>(Exit::COMM));
  }).detach();
  if (ctx.mode == "bench") return worker_bench(ctx, argv);
  DT_THROW(UsageError, "worker mode '{}' is not available in this build", ctx.mode);
}

}  // namespace dtrain::cli
