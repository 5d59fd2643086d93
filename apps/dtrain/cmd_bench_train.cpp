// `dtrain bench train --config FILE`: prints the one-device training throughput that
// lib/bench/bench_train measures (a table, or one JSON object with --json), or with --plan
// the step's predicted GPU budget (lib/bench/bench_plan: no GPU needed). main.cpp registers
// the subcommand; DeviceError (exit code 8) for a timed GPU run without a CUDA build or a GPU.
#include "bench/bench_plan.h"
#include "bench/bench_train.h"
#include "device/kind.h"

#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::cli {

int run_bench_train(const std::string& config_path, const std::vector<std::string>& sets, int steps, int warmup,
                    bool json, const std::string& device, bool plan, const std::string& gpu) {
  bench::BenchTrainOptions o;
  o.config_path = config_path;
  o.sets = sets;
  o.steps = steps;
  o.warmup = warmup;
  o.device = device::kind_parse(device, "--device");
  const std::string out = plan ? bench::bench_plan_format(bench::bench_plan_run(o, gpu), json)
                               : bench::bench_train_format(bench::bench_train_run(o), json);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::cli
