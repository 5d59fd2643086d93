// `dtrain bench` options: CLI11 declarations, validation, and forwarding to ranks.
#include "bench_options.h"

#include "core/check.h"

#include <charconv>
#include <climits>
#include <cmath>

namespace dtrain::cli {

// ---------------------------------------------------------------------------
// Integer option checks

namespace {
CLI::Validator int_check(const std::string& name, long long lo, long long hi, const std::string& what) {
  std::string rule =
      hi == INT_MAX ? fmt::format("must be at least {}", lo) : fmt::format("must be from {} to {}", lo, hi);
  if (!what.empty()) rule += fmt::format(" ({})", what);
  return CLI::Validator(
      [name, lo, hi, rule](std::string& text) -> std::string {
        std::string_view t = text;
        if (!t.empty() && t.front() == '+') t.remove_prefix(1);
        long long v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || p != t.data() + t.size() || (ec != std::errc() && ec != std::errc::result_out_of_range))
          return fmt::format("{} must be a whole number and {} (got '{}')", name, rule, text);
        if (ec == std::errc::result_out_of_range || v > hi)
          return hi == INT_MAX ? fmt::format("{} {}, at most {} (got {})", name, rule, hi, text)
                               : fmt::format("{} {} (got {})", name, rule, text);
        if (v < lo) return fmt::format("{} {} (got {})", name, rule, text);
        return "";
      },
      "", "INT_RANGE");
}
}  // namespace

CLI::Validator int_at_least(const std::string& name, int lo) { return int_check(name, lo, INT_MAX, ""); }
CLI::Validator int_in_range(const std::string& name, int lo, int hi, const std::string& what) {
  return int_check(name, lo, hi, what);
}

CLI::Validator number_in_range(const std::string& name, double lo, double hi) {
  return CLI::Validator(
      [name, lo, hi](std::string& text) -> std::string {
        double v = 0;
        const char* b = text.data();
        const char* e = b + text.size();
        if (b != e && *b == '+') ++b;
        auto [p, ec] = std::from_chars(b, e, v);
        if (b == e || p != e || ec != std::errc() || !std::isfinite(v) || v < lo || v > hi)
          return fmt::format("{} must be a number from {} to {} (got '{}')", name, lo, hi, text);
        return "";
      },
      "", "NUMBER_RANGE");
}

std::string cli_failure_message(const CLI::App* app, const CLI::Error& e) {
  std::string msg = e.what();
  // CLI11 prefixes a validator's message with "--option: "; ours already names the option.
  size_t sep = msg.find(": ");
  if (e.get_name() == "ValidationError" && sep != std::string::npos && sep > 0 &&
      msg.find(msg.substr(0, sep), sep + 2) != std::string::npos)
    msg.erase(0, sep + 2);
  return CLI::FailureMessage::simple(app, CLI::Error(e.get_name(), msg, e.get_exit_code()));
}

void bench_add_options(CLI::App* app, BenchCliOptions& o) {
  app->add_option("-b,--minbytes", o.min_bytes, "smallest size (bytes; K/M/G suffixes)")->capture_default_str();
  app->add_option("-e,--maxbytes", o.max_bytes, "largest size")->capture_default_str();
  app->add_option("-f,--stepfactor", o.step_factor, "multiply the size by this each row")->capture_default_str();
  app->add_option("-i,--stepbytes", o.step_bytes, "add this to the size each row instead (0 = use -f)");
  app->add_option("-n,--iters", o.iters, "timed iterations per size")
      ->check(int_at_least("-n/--iters", 1))
      ->capture_default_str();
  app->add_option("-w,--warmup_iters", o.warmup, "untimed warm-up iterations")
      ->check(int_at_least("-w/--warmup_iters", 0))
      ->capture_default_str();
  app->add_option("-m,--agg_iters", o.agg, "collectives per timed iteration")->check(int_at_least("-m/--agg_iters", 1));
  app->add_option("-c,--check", o.check, "count wrong elements (1) or not (0)")
      ->check(int_in_range("-c/--check", 0, 1, "1 = check, 0 = not"))
      ->capture_default_str();
  app->add_option("-o,--op", o.op, "reduction: sum, avg, max")->capture_default_str();
  app->add_option("-d,--datatype", o.dtype, "float, bfloat16, half")->capture_default_str();
  app->add_option("-r,--root", o.root, "broadcast root")->check(int_at_least("-r/--root", 0));
  app->add_option("-z,--blocking", o.blocking, "wait for each collective (1) or not (0)")
      ->check(int_in_range("-z/--blocking", 0, 1, "1 = wait, 0 = not"));
  app->add_option("--backend", o.backend, "gloo or nccl (default: nccl where GPUs are visible, else gloo)");
  app->add_option("--json", o.json,
                  "also write the results as JSON to FILE (by rank 0; an existing file only if it is a dtrain bench "
                  "report)");
  app->add_flag("--force", o.json_force, "replace an existing --json FILE that is not a dtrain bench report");
}

bench::BenchOptions bench_options_resolve(const BenchCliOptions& o) {
  bench::BenchOptions b;
  if (o.collective != "all") {
    bench::Collective c;
    DT_ENFORCE(bench::collective_parse(o.collective, &c), UsageError,
               "unknown collective '{}': use allreduce, reduce_scatter, all_gather, broadcast or all", o.collective);
    b.collectives = {c};
  }
  // A size no rank can allocate is refused here, at once, not by every rank of every retry
  // round. Each rank holds a send and a receive buffer of -e bytes.
  auto size = [](const std::string& flag, const std::string& text) {
    const size_t v = bench::parse_size(text);
    DT_ENFORCE(v <= kBenchMaxBytes, UsageError,
               "{} {} is above the largest benchmark size, 256G (2^38 bytes): each rank allocates two buffers of "
               "the largest size, more than any device or host holds; give a smaller {}",
               flag, text, flag);
    return v;
  };
  b.min_bytes = size("-b/--minbytes", o.min_bytes);
  b.max_bytes = size("-e/--maxbytes", o.max_bytes);
  b.step_bytes = size("-i/--stepbytes", o.step_bytes);
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
  std::vector<std::string> a = {"--collective", o.collective,
                                "-b",           o.min_bytes,
                                "-e",           o.max_bytes,
                                "-f",           fmt::format("{}", o.step_factor),
                                "-i",           o.step_bytes,
                                "-n",           std::to_string(o.iters),
                                "-w",           std::to_string(o.warmup),
                                "-m",           std::to_string(o.agg),
                                "-c",           std::to_string(o.check),
                                "-o",           o.op,
                                "-d",           o.dtype,
                                "-r",           std::to_string(o.root),
                                "-z",           std::to_string(o.blocking)};
  if (!o.backend.empty()) a.insert(a.end(), {"--backend", o.backend});
  if (!o.json.empty()) a.insert(a.end(), {"--json", o.json});
  if (o.json_force) a.push_back("--force");
  return a;
}

}  // namespace dtrain::cli
