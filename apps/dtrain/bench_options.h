// The nccl-tests style options of `dtrain bench`, declared once: the launcher parses
// them to validate, and forwards the same words to every rank, which parses them again.
#pragma once

#include "bench/bench.h"

#include <CLI/CLI.hpp>

#include <string>

namespace dtrain::cli {

struct BenchCliOptions {
  std::string collective = "allreduce";  // allreduce | reduce_scatter | all_gather | broadcast | all
  std::string min_bytes = "32", max_bytes = "32M", step_bytes = "0";
  double step_factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0, agg = 1, blocking = 0;
  std::string op = "sum", dtype = "float";
  std::string backend;      // "" = nccl where GPUs are visible, else gloo
  std::string json;         // --json FILE (written by rank 0)
  bool json_force = false;  // --force: replace an existing --json FILE that is not a dtrain bench report
};

// Checks for integer options that say the rule in words ("--num-nodes must be at least 1
// (got 0)") instead of CLI11's "Value 0 not in range 0.000000 to 1.79e308", and refuse
// values an int cannot hold before CLI11 converts (and would wrap or reject) them. `what`
// adds a note after the range ("0 = pick a free one"). main() prints these messages as they
// are, without CLI11's "NAME: " prefix (cli_failure_message).
CLI::Validator int_at_least(const std::string& name, int lo);
CLI::Validator int_in_range(const std::string& name, int lo, int hi, const std::string& what = "");
// The same for a real number: a finite value from lo to hi. nan, inf and text are refused
// with the rule in words (CLI11's Range lets nan through: every comparison with it is false).
CLI::Validator number_in_range(const std::string& name, double lo, double hi);
std::string cli_failure_message(const CLI::App* app, const CLI::Error& e);

// The largest -b/-e/-i bench_options_resolve accepts: 256G (2^38 bytes). Each rank holds a
// send and a receive buffer of -e bytes, and 512 GiB is more than any one device holds.
inline constexpr size_t kBenchMaxBytes = size_t{1} << 38;

void bench_add_options(CLI::App* app, BenchCliOptions& o);
bench::BenchOptions bench_options_resolve(const BenchCliOptions& o);    // UsageError on bad values
std::vector<std::string> bench_options_argv(const BenchCliOptions& o);  // the words for the ranks

}  // namespace dtrain::cli
