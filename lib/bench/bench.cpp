// The nccl-tests style sweep: sizes, exact-result data patterns and #wrong counting,
// timing (max over ranks), the nccl-tests table layout, and the JSON export.
#include "bench/bench.h"

#include "comm/buffer.h"
#include "core/check.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace dtrain::bench {

// ---------------------------------------------------------------------------
// Names, factors, sizes

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::ALLREDUCE: return "allreduce";
    case Collective::REDUCE_SCATTER: return "reduce_scatter";
    case Collective::ALL_GATHER: return "all_gather";
    case Collective::BROADCAST: return "broadcast";
  }
  return "?";
}

bool collective_parse(std::string_view s, Collective* out) {
  std::string l;
  for (char ch : s)
    if (ch != '_' && ch != '-') l += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (l == "allreduce") {
    *out = Collective::ALLREDUCE;
    return true;
  }
  if (l == "reducescatter") {
    *out = Collective::REDUCE_SCATTER;
    return true;
  }
  if (l == "allgather") {
    *out = Collective::ALL_GATHER;
    return true;
  }
  if (l == "broadcast" || l == "bcast") {
    *out = Collective::BROADCAST;
    return true;
  }
  return false;
}

double bus_factor(Collective c, int n) {
  const double nn = static_cast<double>(n);
  switch (c) {
    case Collective::ALLREDUCE: return 2.0 * (nn - 1) / nn;
    case Collective::REDUCE_SCATTER:
    case Collective::ALL_GATHER: return (nn - 1) / nn;
    case Collective::BROADCAST: return 1.0;
  }
  return 1.0;
}

size_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  DT_ENFORCE(i > 0, UsageError, "invalid size '{}': expected a byte count such as 8, 64K, 4M or 1G (powers of 1024)",
             text);
  size_t value = 0;
  for (size_t k = 0; k < i; ++k) {
    const size_t digit = static_cast<size_t>(text[k] - '0');
    DT_ENFORCE(value <= (std::numeric_limits<size_t>::max() - digit) / 10, UsageError, "size '{}' is too large", text);
    value = value * 10 + digit;
  }
  size_t mult = 1;
  if (i < text.size()) {
    switch (std::tolower(static_cast<unsigned char>(text[i]))) {
      case 'k':
        mult = size_t{1} << 10;
        ++i;
        break;
      case 'm':
        mult = size_t{1} << 20;
        ++i;
        break;
      case 'g':
        mult = size_t{1} << 30;
        ++i;
        break;
      case 't':
        mult = size_t{1} << 40;
        ++i;
        break;
      default: break;
    }
    if (i < text.size() && (text[i] == 'B' || text[i] == 'b')) ++i;
  }
  DT_ENFORCE(i == text.size(), UsageError,
             "invalid size '{}': expected a byte count such as 8, 64K, 4M or 1G (powers of 1024)", text);
  DT_ENFORCE(value <= std::numeric_limits<size_t>::max() / mult, UsageError, "size '{}' is too large", text);
  return value * mult;
}

int64_t bench_wrong_total(const std::vector<BenchRow>& rows) {
  int64_t total = 0;
  for (const auto& r : rows) total += std::max<int64_t>(r.oop_wrong, 0) + std::max<int64_t>(r.ip_wrong, 0);
  return total;
}

double bench_avg_busbw(const std::vector<BenchRow>& rows) {
  if (rows.empty()) return 0;
  double sum = 0;
  for (const auto& r : rows) sum += r.oop_busbw + r.ip_busbw;
  return sum / (2.0 * static_cast<double>(rows.size()));
}

namespace {

using comm::Buffer;
using comm::Communicator;
using Clock = std::chrono::steady_clock;

const char* type_name(DType t) {  // nccl-tests spelling
  return t == DType::F32 ? "float" : t == DType::BF16 ? "bfloat16" : "half";
}

// ---------------------------------------------------------------------------
// Data whose reduction is known exactly: small integers with |value| <= k, where k*n
// stays below the dtype's exact-integer range, so every partial sum of any reduction
// order is exact (bf16 256, fp16 2048, fp32 2^24). AVG adds one division whose
// rounding differs between backends (Gloo divides the sum, NCCL pre-scales each input),
// so it is compared with a 2-ulp relative tolerance; SUM and MAX must be exact.

struct Pattern {
  int k;  // values in [-k, k]
  float value(int rank, size_t i) const {
    const size_t m = static_cast<size_t>(2 * k + 1);
    return static_cast<float>(static_cast<int>((i * 5 + static_cast<size_t>(rank) * 3) % m) - k);
  }
};

Pattern pattern_for(DType t, int n) {
  const int limit = t == DType::BF16 ? 256 : t == DType::F16 ? 2048 : (1 << 24);
  return Pattern{std::clamp(limit / std::max(n, 1), 1, 4)};
}

double avg_tolerance(DType t) { return t == DType::BF16 ? 1.0 / 128 : t == DType::F16 ? 1.0 / 1024 : 1.0 / (1 << 22); }

float expected_reduce(const Pattern& p, int n, size_t i, ReduceOp op) {
  double sum = 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < n; ++r) {
    sum += p.value(r, i);
    mx = std::max(mx, p.value(r, i));
  }
  if (op == ReduceOp::MAX) return mx;
  if (op == ReduceOp::SUM) return static_cast<float>(sum);
  return static_cast<float>(sum / n);
}

bool matches(float got, float want, ReduceOp op, DType t) {
  if (op != ReduceOp::AVG) return got == want;
  return std::fabs(static_cast<double>(got) - want) <=
         avg_tolerance(t) * std::max(1.0, std::fabs(static_cast<double>(want)));
}

void fill(std::vector<char>& host, DType t, size_t count, const std::function<float(size_t)>& f) {
  host.resize(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) dtype_store(host.data(), i, t, f(i));
}

// ---------------------------------------------------------------------------
// One collective at one size: where input and output live for each mode and what the
// output must hold.

struct Shape {
  Collective coll;
  size_t count;      // the count argument of the collective
  size_t in_elems;   // elements of input per rank
  size_t out_elems;  // elements of output per rank
};

Shape shape_for(Collective c, size_t bytes, DType t, int n) {
  const size_t elems = bytes / dtype_size(t);
  switch (c) {
    case Collective::REDUCE_SCATTER: {
      const size_t per = elems / static_cast<size_t>(n);
      return {c, per, per * n, per};
    }
    case Collective::ALL_GATHER: {
      const size_t per = elems / static_cast<size_t>(n);
      return {c, per, per, per * n};
    }
    default: return {c, elems, elems, elems};
  }
}

// The output elements of one collective on rank r (got, as the device left them) that
// differ from what the pattern's inputs give.
int64_t count_wrong(const Shape& s, const Pattern& p, int n, int r, const BenchOptions& opts,
                    const std::vector<char>& got) {
  const DType t = opts.dtype;
  const ReduceOp op = opts.op;
  int64_t wrong = 0;
  for (size_t i = 0; i < s.out_elems; ++i) {
    const float g = dtype_load(got.data(), i, t);
    float want = 0;
    bool ok = false;
    switch (s.coll) {
      case Collective::ALLREDUCE:
        want = expected_reduce(p, n, i, op);
        ok = matches(g, want, op, t);
        break;
      case Collective::REDUCE_SCATTER:
        want = expected_reduce(p, n, r * s.count + i, op);
        ok = matches(g, want, op, t);
        break;
      case Collective::ALL_GATHER:
        want = p.value(static_cast<int>(i / s.count), i);
        ok = g == want;
        break;
      case Collective::BROADCAST:
        want = p.value(opts.root, i);
        ok = g == want;
        break;
    }
    if (!ok) ++wrong;
  }
  return wrong;
}

class Runner {
 public:
  Runner(Communicator& comm, const BenchOptions& opts, size_t max_bytes)
      : comm_(comm), opts_(opts), n_(comm.size()), rank_(comm.rank()), pattern_(pattern_for(opts.dtype, comm.size())),
        send_(comm, max_bytes), recv_(comm, max_bytes) {}

  // Issue the collective once (asynchronously on NCCL).
  void issue(const Shape& s, bool in_place) {
    const DType t = opts_.dtype;
    const size_t es = dtype_size(t);
    switch (s.coll) {
      case Collective::ALLREDUCE:
        if (in_place) comm_.allreduce(recv_.data(), recv_.data(), s.count, t, opts_.op);
        else comm_.allreduce(send_.data(), recv_.data(), s.count, t, opts_.op);
        break;
      case Collective::REDUCE_SCATTER:
        if (in_place) comm_.reduce_scatter(send_.data(), send_.at(rank_ * s.count * es), s.count, t, opts_.op);
        else comm_.reduce_scatter(send_.data(), recv_.data(), s.count, t, opts_.op);
        break;
      case Collective::ALL_GATHER:
        if (in_place) comm_.all_gather(recv_.at(rank_ * s.count * es), recv_.data(), s.count, t);
        else comm_.all_gather(send_.data(), recv_.data(), s.count, t);
        break;
      case Collective::BROADCAST:
        if (in_place) comm_.broadcast(recv_.data(), recv_.data(), s.count, t, opts_.root);
        else comm_.broadcast(send_.data(), recv_.data(), s.count, t, opts_.root);
        break;
    }
  }

  // Average microseconds per collective on this rank.
  double time_us(const Shape& s, bool in_place) {
    comm_.barrier();
    comm_.synchronize();
    const auto start = Clock::now();
    for (int it = 0; it < opts_.iters; ++it) {
      for (int a = 0; a < opts_.agg_iters; ++a) {
        issue(s, in_place);
        if (opts_.blocking) comm_.synchronize();
      }
    }
    comm_.synchronize();
    const double sec = std::chrono::duration<double>(Clock::now() - start).count();
    return sec * 1e6 / (static_cast<double>(opts_.iters) * opts_.agg_iters);
  }

  void warmup(const Shape& s) {
    for (int i = 0; i < opts_.warmup; ++i) issue(s, false);
    comm_.synchronize();
  }

  // Fresh inputs, one collective, and the number of output elements on this rank that
  // differ from the exact expectation.
  int64_t check(const Shape& s, bool in_place) {
    const DType t = opts_.dtype;
    const size_t es = dtype_size(t);
    const int r = rank_;
    std::vector<char> host;
    // Inputs: for all_gather rank r contributes value(r, r*count + i) so that every
    // output position is distinct; otherwise value(r, i) over the input.
    switch (s.coll) {
      case Collective::ALL_GATHER:
        fill(host, t, s.in_elems, [&](size_t i) { return pattern_.value(r, r * s.count + i); });
        if (in_place) recv_.copy_from_host(host.data(), host.size(), r * s.count * es);
        else send_.copy_from_host(host.data(), host.size());
        break;
      default:
        fill(host, t, s.in_elems, [&](size_t i) { return pattern_.value(r, i); });
        if (in_place && s.coll != Collective::REDUCE_SCATTER) recv_.copy_from_host(host.data(), host.size());
        else send_.copy_from_host(host.data(), host.size());
        break;
    }
    issue(s, in_place);
    comm_.synchronize();

    std::vector<char> got(s.out_elems * es);
    if (s.coll == Collective::REDUCE_SCATTER && in_place) send_.copy_to_host(got.data(), got.size(), r * s.count * es);
    else recv_.copy_to_host(got.data(), got.size());
    return count_wrong(s, pattern_, n_, r, opts_, got);
  }

  // Element-wise MAX (times) or SUM (#wrong) of a few doubles across ranks, through the
  // communicator itself in fp32 (times keep 7 digits; counts are exact below 2^24).
  std::vector<double> reduce_across(const std::vector<double>& v, ReduceOp op) {
    std::vector<float> f(v.begin(), v.end());
    Buffer b(comm_, f.size() * sizeof(float));
    b.copy_from_host(f.data(), f.size() * sizeof(float));
    comm_.allreduce(b.data(), b.data(), f.size(), DType::F32, op);
    comm_.synchronize();
    b.copy_to_host(f.data(), f.size() * sizeof(float));
    return {f.begin(), f.end()};
  }

 private:
  Communicator& comm_;
  const BenchOptions& opts_;
  const int n_, rank_;
  const Pattern pattern_;
  Buffer send_, recv_;
};

// ---------------------------------------------------------------------------
// Table

std::string time_str(double us) {
  char buf[32];
  if (us >= 10000.0) std::snprintf(buf, sizeof buf, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(buf, sizeof buf, "%7.1f", us);
  else std::snprintf(buf, sizeof buf, "%7.2f", us);
  return buf;
}

std::string wrong_str(int64_t w) { return w < 0 ? std::string("N/A") : std::to_string(w); }

// Every rank's "pid|host|device|device name", gathered so rank 0 can list them all.
std::vector<std::string> gather_rank_list(Communicator& comm) {
  constexpr size_t kRecord = 256;
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  char record[kRecord] = {};
  std::snprintf(record, sizeof record, "%d|%s|%d|%s", static_cast<int>(getpid()), host, std::max(comm.device(), 0),
                comm.device_name().c_str());
  // Raw bytes travel as fp16 bit patterns: all_gather copies them unchanged.
  Buffer mine(comm, kRecord), all(comm, kRecord * comm.size());
  mine.copy_from_host(record, kRecord);
  comm.all_gather(mine.data(), all.data(), kRecord / 2, DType::F16);
  comm.synchronize();
  std::vector<char> bytes(kRecord * comm.size());
  all.copy_to_host(bytes.data(), bytes.size());
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) {
    const char* rec = bytes.data() + r * kRecord;
    out.emplace_back(rec, strnlen(rec, kRecord));
  }
  return out;
}

void print_header(std::FILE* out, const BenchOptions& opts, const std::vector<std::string>& ranks) {
  std::fprintf(out, "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: ", opts.min_bytes, opts.max_bytes);
  if (opts.step_bytes > 0) std::fprintf(out, "%zu(bytes)", opts.step_bytes);
  else std::fprintf(out, "%g(factor)", opts.step_factor);
  std::fprintf(out, " warmup iters: %d iters: %d agg iters: %d validation: %d graph: 0\n", opts.warmup, opts.iters,
               opts.agg_iters, opts.check ? 1 : 0);
  std::fprintf(out, "#\n# Using devices\n");
  for (size_t r = 0; r < ranks.size(); ++r) {
    // pid|host|device|name; the name is last so it may contain '|'.
    std::string f[4];
    std::string rest = ranks[r];
    for (int k = 0; k < 3; ++k) {
      const auto bar = rest.find('|');
      f[k] = rest.substr(0, bar);
      rest = bar == std::string::npos ? "" : rest.substr(bar + 1);
    }
    f[3] = rest;
    std::fprintf(out, "#  Rank %2zu Group  0 Pid %6s on %10s device %2s [%s]\n", r, f[0].c_str(), f[1].c_str(),
                 f[2].c_str(), f[3].c_str());
  }
  std::fprintf(out, "#\n");
  std::fflush(out);
}

void print_columns(std::FILE* out, Collective c) {
  std::fprintf(out, "#\n# Collective test: %s\n", collective_name(c));
  std::fprintf(out, "#%58s%s%30s%s\n", "", "out-of-place", "", "in-place");
  std::fprintf(
      out,
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
  std::fprintf(
      out,
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
  std::fflush(out);
}

void print_row(std::FILE* out, const BenchRow& r) {
  const bool reduces = r.coll == Collective::ALLREDUCE || r.coll == Collective::REDUCE_SCATTER;
  std::fprintf(out, "%12zu  %12zu  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6s  %7s  %6.2f  %6.2f  %6s\n", r.bytes, r.count,
               type_name(r.dtype), reduces ? comm::reduce_op_name(r.op) : "none", r.root,
               time_str(r.oop_time_us).c_str(), r.oop_algbw, r.oop_busbw, wrong_str(r.oop_wrong).c_str(),
               time_str(r.ip_time_us).c_str(), r.ip_algbw, r.ip_busbw, wrong_str(r.ip_wrong).c_str());
  std::fflush(out);
}

void validate(const BenchOptions& o, int n) {
  DT_ENFORCE_GT(o.min_bytes, size_t{0}, UsageError, "minimum size (-b) must be positive");
  DT_ENFORCE_LE(o.min_bytes, o.max_bytes, UsageError, "minimum size (-b) exceeds maximum size (-e)");
  DT_ENFORCE(o.step_bytes > 0 || o.step_factor > 1.0, UsageError,
             "step factor (-f) must be > 1 when no step in bytes (-i) is given, got {}", o.step_factor);
  DT_ENFORCE_GE(o.iters, 1, UsageError, "iterations (-n) must be at least 1");
  DT_ENFORCE_GE(o.warmup, 0, UsageError, "warmup iterations (-w) must not be negative");
  DT_ENFORCE_GE(o.agg_iters, 1, UsageError, "aggregated iterations (-m) must be at least 1");
  DT_ENFORCE(o.root >= 0 && o.root < n, UsageError, "root (-r) {} out of range for {} ranks", o.root, n);
}

}  // namespace

// ---------------------------------------------------------------------------

std::vector<BenchRow> bench_run(Communicator& comm, const BenchOptions& opts, std::FILE* out) {
  const int n = comm.size();
  validate(opts, n);
  std::vector<Collective> colls = opts.collectives;
  if (colls.empty())
    colls = {Collective::ALLREDUCE, Collective::REDUCE_SCATTER, Collective::ALL_GATHER, Collective::BROADCAST};

  std::vector<size_t> sizes;
  for (size_t b = opts.min_bytes; b <= opts.max_bytes;) {
    sizes.push_back(b);
    const size_t next =
        opts.step_bytes > 0 ? b + opts.step_bytes : static_cast<size_t>(static_cast<double>(b) * opts.step_factor);
    if (next <= b) break;  // overflow or a factor too close to 1 to advance
    b = next;
  }

  const auto ranks = gather_rank_list(comm);
  if (out != nullptr) print_header(out, opts, ranks);

  const size_t es = dtype_size(opts.dtype);
  Runner runner(comm, opts, std::max(opts.max_bytes / es * es, es));
  std::vector<BenchRow> rows;
  for (Collective c : colls) {
    if (out != nullptr) print_columns(out, c);
    const Shape biggest = shape_for(c, opts.max_bytes, opts.dtype, n);
    if (biggest.count > 0) runner.warmup(biggest);
    for (size_t bytes : sizes) {
      const Shape s = shape_for(c, bytes, opts.dtype, n);
      if (s.count == 0) continue;
      BenchRow row{};
      row.coll = c;
      row.count = s.count;
      row.bytes = std::max(s.in_elems, s.out_elems) * es;
      row.dtype = opts.dtype;
      row.op = opts.op;
      row.root = c == Collective::BROADCAST ? opts.root : -1;
      std::vector<double> wrong = {-1, -1};
      if (opts.check) {
        wrong = runner.reduce_across(
            {static_cast<double>(runner.check(s, false)), static_cast<double>(runner.check(s, true))}, ReduceOp::SUM);
      }
      const auto times = runner.reduce_across({runner.time_us(s, false), runner.time_us(s, true)}, ReduceOp::MAX);
      row.oop_time_us = times[0];
      row.ip_time_us = times[1];
      row.oop_wrong = static_cast<int64_t>(std::llround(wrong[0]));
      row.ip_wrong = static_cast<int64_t>(std::llround(wrong[1]));
      const double factor = bus_factor(c, n);
      row.oop_algbw = static_cast<double>(row.bytes) / (row.oop_time_us * 1e-6) / 1e9;
      row.ip_algbw = static_cast<double>(row.bytes) / (row.ip_time_us * 1e-6) / 1e9;
      row.oop_busbw = row.oop_algbw * factor;
      row.ip_busbw = row.ip_algbw * factor;
      rows.push_back(row);
      if (out != nullptr) print_row(out, row);
    }
  }
  if (out != nullptr) {
    const int64_t wrong = bench_wrong_total(rows);
    std::fprintf(out, "# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
                 wrong == 0 ? "OK" : "FAILED");
    std::fprintf(out, "# Avg bus bandwidth    : %g \n#\n", bench_avg_busbw(rows));
    std::fflush(out);
  }
  return rows;
}

std::string bench_json(const std::vector<BenchRow>& rows, int world_size, comm::Backend backend,
                       const BenchOptions& opts) {
  using nlohmann::json;
  json j;
  j["world_size"] = world_size;
  j["backend"] = comm::backend_name(backend);
  j["options"] = {{"min_bytes", opts.min_bytes},
                  {"max_bytes", opts.max_bytes},
                  {"step_factor", opts.step_factor},
                  {"step_bytes", opts.step_bytes},
                  {"iters", opts.iters},
                  {"warmup", opts.warmup},
                  {"agg_iters", opts.agg_iters},
                  {"check", opts.check},
                  {"blocking", opts.blocking},
                  {"type", type_name(opts.dtype)},
                  {"redop", comm::reduce_op_name(opts.op)},
                  {"root", opts.root}};
  json arr = json::array();
  for (const auto& r : rows) {
    const bool reduces = r.coll == Collective::ALLREDUCE || r.coll == Collective::REDUCE_SCATTER;
    auto side = [](double t, double alg, double bus, int64_t wrong) {
      return json{{"time_us", t},
                  {"algbw_gbps", alg},
                  {"busbw_gbps", bus},
                  {"wrong", wrong < 0 ? json(nullptr) : json(wrong)}};
    };
    arr.push_back({{"collective", collective_name(r.coll)},
                   {"bytes", r.bytes},
                   {"count", r.count},
                   {"type", type_name(r.dtype)},
                   {"redop", reduces ? comm::reduce_op_name(r.op) : "none"},
                   {"root", r.root},
                   {"out_of_place", side(r.oop_time_us, r.oop_algbw, r.oop_busbw, r.oop_wrong)},
                   {"in_place", side(r.ip_time_us, r.ip_algbw, r.ip_busbw, r.ip_wrong)}});
  }
  j["rows"] = std::move(arr);
  j["wrong_total"] = bench_wrong_total(rows);
  j["avg_busbw_gbps"] = bench_avg_busbw(rows);
  return j.dump(2) + "\n";
}

}  // namespace dtrain::bench
