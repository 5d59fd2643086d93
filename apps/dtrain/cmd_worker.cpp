// Internal `dtrain worker`: one rank process, started by the node agent (lib/rank/worker.h).
// Here only the bench mode's words from the launcher are parsed, with the same options
// `dtrain bench` declares.
#include "bench_options.h"
#include "commands.h"

#include "core/check.h"
#include "rank/worker.h"

#include <cstdlib>

namespace dtrain::cli {

namespace {

rank::WorkerBench worker_bench_parse(const std::vector<std::string>& argv) {
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
  return {bench_options_resolve(o), o.backend, o.json, o.json_force};
}

}  // namespace

[[noreturn]] void exit_now(int exit_code) { std::_Exit(exit_code); }

int run_worker(const std::vector<std::string>& argv) {
  rank::WorkerOptions o;
  o.bench = [&argv] { return worker_bench_parse(argv); };
  o.exit_now = exit_now;
  return rank::worker_run(o);
}

}  // namespace dtrain::cli
