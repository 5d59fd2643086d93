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
  std::string backend;  // "" = nccl where GPUs are visible, else gloo
  std::string json;     // --json FILE (written by rank 0)
};

void bench_add_options(CLI::App* app, BenchCliOptions& o);
bench::BenchOptions bench_options_resolve(const BenchCliOptions& o);  // UsageError on bad values
std::vector<std::string> bench_options_argv(const BenchCliOptions& o);  // the words for the ranks

}  // namespace dtrain::cli
