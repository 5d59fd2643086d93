// `dtrain bench` options: CLI11 declarations, validation, and forwarding to ranks.
#include "bench_options.h"

#include "core/check.h"

namespace dtrain::cli {

void bench_add_options(CLI::App* app, BenchCliOptions& o) {
  app->add_option("-b,--minbytes", o.min_bytes, "smallest size (bytes; K/M/G suffixes)")->capture_default_str();
  app->add_option("-e,--maxbytes", o.max_bytes, "largest size")->capture_default_str();
  app->add_option("-f,--stepfactor", o.step_factor, "multiply the size by this each row")->capture_default_str();
  app->add_option("-i,--stepbytes", o.step_bytes, "add this to the size each row instead (0 = use -f)");
  app->add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_option("-w,--warmup_iters", o.warmup, "untimed warm-up iterations")->check(CLI::NonNegativeNumber)->capture_default_str();
  app->add_option("-m,--agg_iters", o.agg, "collectives per timed iteration")->check(CLI::PositiveNumber);
  app->add_option("-c,--check", o.check, "count wrong elements (1) or not (0)")->check(CLI::Range(0, 1))->capture_default_str();
  app->add_option("-o,--op", o.op, "reduction: sum, avg, max")->capture_default_str();
  app->add_option("-d,--datatype", o.dtype, "float, bfloat16, half")->capture_default_str();
  app->add_option("-r,--root", o.root, "broadcast root")->check(CLI::NonNegativeNumber);
  app->add_option("-z,--blocking", o.blocking, "wait for each collective (1) or not (0)")->check(CLI::Range(0, 1));
  app->add_option("--backend", o.backend, "gloo or nccl (default: nccl where GPUs are visible, else gloo)");
  app->add_option("--json", o.json, "also write the results as JSON to FILE (by rank 0)");
}

bench::BenchOptions bench_options_resolve(const BenchCliOptions& o) {
  bench::BenchOptions b;
  if (o.collective != "all") {
    bench::Collective c;
    DT_ENFORCE(bench::collective_parse(o.collective, &c), UsageError,
               "unknown collective '{}': use allreduce, reduce_scatter, all_gather, broadcast or all", o.collective);
    b.collectives = {c};
  }
  b.min_bytes = bench::parse_size(o.min_bytes);
  b.max_bytes = bench::parse_size(o.max_bytes);
  b.step_bytes = bench::parse_size(o.step_bytes);
  DT_ENFORCE(b.min_bytes <= b.max_bytes, UsageError, "-b {} is larger than -e {}", o.min_bytes, o.max_bytes);
  DT_ENFORCE(b.step_bytes > 0 || o.step_factor > 1, UsageError, "-f must be > 1 (or give -i)");
  b.step_factor = o.step_factor;
  b.iters = o.iters;
  b.warmup = o.warmup;
  b.agg_iters = o.agg;
  b.check = o.check != 0;
  b.blocking = o.blocking != 0;
  b.root = o.root;
  DT_ENFORCE(comm::reduce_op_parse(o.op, &b.op), UsageError, "unknown -o '{}': use sum, avg or max", o.op);
  DT_ENFORCE(dtype_parse(o.dtype, &b.dtype), UsageError, "unknown -d '{}': use float, bfloat16 or half", o.dtype);
  if (!o.backend.empty()) {
    comm::Backend be;
    DT_ENFORCE(comm::backend_parse(o.backend, &be), UsageError, "unknown --backend '{}': use gloo or nccl", o.backend);
#ifndef DTRAIN_HAVE_CUDA
    if (be == comm::Backend::NCCL)
      DT_THROW(UsageError,
               "--backend nccl: this dtrain was built without CUDA (rebuild with -DDTRAIN_CUDA=ON where nvcc is "
               "installed), or use --backend gloo");
#endif
  }
  return b;
}

std::vector<std::string> bench_options_argv(const BenchCliOptions& o) {
  std::vector<std::string> a = {"--collective", o.collective, "-b", o.min_bytes, "-e", o.max_bytes,
                                "-f", fmt::format("{}", o.step_factor), "-i", o.step_bytes,
                                "-n", std::to_string(o.iters), "-w", std::to_string(o.warmup),
                                "-m", std::to_string(o.agg), "-c", std::to_string(o.check),
                                "-o", o.op, "-d", o.dtype, "-r", std::to_string(o.root),
                                "-z", std::to_string(o.blocking)};
  if (!o.backend.empty()) a.insert(a.end(), {"--backend", o.backend});
  if (!o.json.empty()) a.insert(a.end(), {"--json", o.json});
  return a;
}

}  // namespace dtrain::cli
