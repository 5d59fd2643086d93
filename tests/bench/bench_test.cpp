// The benchmark sweep: size parsing, bus-bandwidth factors, a 3-rank Gloo sweep of every
// collective whose table parses like nccl-tests output with no wrong elements, and a
// corrupting communicator that the #wrong check must catch.
#include "bench/bench.h"
#include "comm/gloo_comm.h"
#include "core/error.h"
#include "rank_threads.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::bench;
using comm::Communicator;

namespace {

// Forwards to a real communicator; on rank 1 it flips the sign/exponent byte of the first
// output element of every allreduce with at least 16 elements (the bench's own small
// statistics allreduces stay intact).
class CorruptingComm final : public Communicator {
 public:
  explicit CorruptingComm(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  comm::Backend backend() const override { return inner_->backend(); }
  bool on_device() const override { return inner_->on_device(); }
  std::string device_name() const override { return inner_->device_name(); }
  void allreduce(const void* s, void* r, size_t n, DType t, comm::ReduceOp op) override {
    inner_->allreduce(s, r, n, t, op);
    if (rank() == 1 && n >= 16) static_cast<unsigned char*>(r)[dtype_size(t) - 1] ^= 0x40;
  }
  void reduce_scatter(const void* s, void* r, size_t n, DType t, comm::ReduceOp op) override {
    inner_->reduce_scatter(s, r, n, t, op);
  }
  void all_gather(const void* s, void* r, size_t n, DType t) override { inner_->all_gather(s, r, n, t); }
  void broadcast(const void* s, void* r, size_t n, DType t, int root) override { inner_->broadcast(s, r, n, t, root); }
  void barrier() override { inner_->barrier(); }
  void abort() override { inner_->abort(); }

 private:
  std::unique_ptr<Communicator> inner_;
};

struct SweepResult {
  std::vector<std::vector<BenchRow>> rows;  // per rank
  std::string table;                        // rank 0's output
  std::vector<std::string> errors;
};

// Runs bench_run on n in-process Gloo ranks; rank 0 prints into a temporary file.
SweepResult sweep(int n, const BenchOptions& opts, bool corrupt = false) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  SweepResult res;
  res.rows.resize(n);
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  res.errors = test::run_threads(n, [&](int r) {
    std::unique_ptr<Communicator> c = comm::comm_create_gloo(store, r, n, test::loopback_gloo());
    if (corrupt) c = std::make_unique<CorruptingComm>(std::move(c));
    res.rows[r] = bench_run(*c, opts, r == 0 ? out : nullptr);
  });
  std::rewind(out);
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, out)) > 0) res.table.append(buf, got);
  std::fclose(out);
  return res;
}

std::vector<std::string> split_ws(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::vector<std::string> data_lines(const std::string& table) {
  std::vector<std::string> out;
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') out.push_back(line);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("parse_size: nccl-tests suffixes are powers of 1024, garbage is a UsageError") {
  CHECK(parse_size("8") == 8);
  CHECK(parse_size("1K") == 1024);
  CHECK(parse_size("64k") == 65536);
  CHECK(parse_size("4M") == (size_t{4} << 20));
  CHECK(parse_size("1G") == (size_t{1} << 30));
  CHECK(parse_size("2GB") == (size_t{2} << 30));
  CHECK(parse_size("0") == 0);
  for (const char* bad :
       {"", "K", "1.5M", "-1", "12Q", "4M4", " 8", "1KBB", "99999999999999999999", "20000000000000000G"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_size(bad), UsageError);
  }
}

TEST_CASE("bus bandwidth factors follow nccl-tests") {
  CHECK(bus_factor(Collective::ALLREDUCE, 4) == doctest::Approx(1.5));
  CHECK(bus_factor(Collective::ALLREDUCE, 1) == doctest::Approx(0.0));
  CHECK(bus_factor(Collective::REDUCE_SCATTER, 4) == doctest::Approx(0.75));
  CHECK(bus_factor(Collective::ALL_GATHER, 8) == doctest::Approx(0.875));
  CHECK(bus_factor(Collective::BROADCAST, 8) == doctest::Approx(1.0));
  Collective c{};
  CHECK(collective_parse("all_reduce", &c));
  CHECK(c == Collective::ALLREDUCE);
  CHECK(collective_parse("reducescatter", &c));
  CHECK(c == Collective::REDUCE_SCATTER);
  CHECK(collective_parse("AllGather", &c));
  CHECK(c == Collective::ALL_GATHER);
  CHECK(collective_parse(collective_name(Collective::BROADCAST), &c));
  CHECK(c == Collective::BROADCAST);
  CHECK_FALSE(collective_parse("alltoall", &c));
}

TEST_CASE("3-rank Gloo sweep 1K..64K of every collective: no wrong element, nccl-tests table") {
  BenchOptions o;
  o.min_bytes = 1024;
  o.max_bytes = 64 * 1024;
  o.iters = 3;
  o.warmup = 1;
  o.root = 2;
  auto res = sweep(3, o);
  for (const auto& e : res.errors) CHECK(e == "");
  REQUIRE(res.rows[0].size() == 7 * 4);  // 1K,2K,...,64K for each of 4 collectives
  for (int r = 1; r < 3; ++r) {
    REQUIRE(res.rows[r].size() == res.rows[0].size());
    for (size_t i = 0; i < res.rows[0].size(); ++i) {
      // Times are max-reduced: every rank reports the same figures.
      CHECK(res.rows[r][i].oop_time_us == res.rows[0][i].oop_time_us);
      CHECK(res.rows[r][i].ip_wrong == res.rows[0][i].ip_wrong);
    }
  }
  for (const auto& row : res.rows[0]) {
    CAPTURE(collective_name(row.coll));
    CAPTURE(row.bytes);
    CHECK(row.oop_wrong == 0);
    CHECK(row.ip_wrong == 0);
    CHECK(row.oop_time_us > 0);
    CHECK(row.oop_busbw == doctest::Approx(row.oop_algbw * bus_factor(row.coll, 3)));
    if (row.coll == Collective::REDUCE_SCATTER || row.coll == Collective::ALL_GATHER) {
      // Per-rank count rounded down so the whole buffer is 3 equal slices.
      CHECK(row.bytes == row.count * 3 * 4);
    } else {
      CHECK(row.bytes == row.count * 4);
    }
    CHECK(row.root == (row.coll == Collective::BROADCAST ? 2 : -1));
  }
  CHECK(bench_wrong_total(res.rows[0]) == 0);

  const std::string& t = res.table;
  CHECK(t.find("# nThread 1 nGpus 1 minBytes 1024 maxBytes 65536 step: 2(factor) warmup iters: 1 iters: 3 "
               "agg iters: 1 validation: 1") != std::string::npos);
  CHECK(t.find("#  Rank  0 Group  0 Pid") != std::string::npos);
  CHECK(t.find("#  Rank  2 Group  0 Pid") != std::string::npos);
  CHECK(t.find("[cpu") != std::string::npos);
  CHECK(t.find("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
               "algbw   busbw #wrong") != std::string::npos);
  CHECK(t.find("# Out of bounds values : 0 OK") != std::string::npos);
  CHECK(t.find("# Avg bus bandwidth    : ") != std::string::npos);
  const auto lines = data_lines(t);
  REQUIRE(lines.size() == 28);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto cols = split_ws(lines[i]);
    CAPTURE(lines[i]);
    REQUIRE(cols.size() == 13);
    CHECK(std::stoull(cols[0]) == res.rows[0][i].bytes);
    CHECK(std::stoull(cols[1]) == res.rows[0][i].count);
    CHECK(cols[2] == "float");
    CHECK(cols[8] == "0");
    CHECK(cols[12] == "0");
    CHECK(std::stod(cols[5]) > 0);
  }
  const auto first = split_ws(lines[0]);
  CHECK(first[3] == "sum");
  CHECK(first[4] == "-1");

  const auto j = nlohmann::json::parse(bench_json(res.rows[0], 3, comm::Backend::GLOO, o));
  CHECK(j["world_size"] == 3);
  CHECK(j["backend"] == "gloo");
  CHECK(j["rows"].size() == 28);
  CHECK(j["rows"][0]["collective"] == "allreduce");
  CHECK(j["rows"][0]["in_place"]["wrong"] == 0);
  CHECK(j["wrong_total"] == 0);
}

TEST_CASE("sweep in bf16/avg and fp16/max over 2 ranks stays exact, unchecked rows say N/A") {
  for (auto [dtype, op] : {std::pair{DType::BF16, comm::ReduceOp::AVG}, std::pair{DType::F16, comm::ReduceOp::MAX}}) {
    BenchOptions o;
    o.collectives = {Collective::ALLREDUCE, Collective::REDUCE_SCATTER};
    o.min_bytes = 64;
    o.max_bytes = 4096;
    o.step_factor = 4;
    o.iters = 2;
    o.warmup = 0;
    o.dtype = dtype;
    o.op = op;
    auto res = sweep(2, o);
    for (const auto& e : res.errors) CHECK(e == "");
    REQUIRE(res.rows[0].size() == 4 * 2);
    CHECK(bench_wrong_total(res.rows[0]) == 0);
    CHECK(res.table.find(dtype == DType::BF16 ? "bfloat16     avg" : "    half     max") != std::string::npos);
  }
  BenchOptions o;
  o.collectives = {Collective::BROADCAST};
  o.min_bytes = o.max_bytes = 256;
  o.iters = 1;
  o.warmup = 0;
  o.check = false;
  auto res = sweep(2, o);
  REQUIRE(res.rows[0].size() == 1);
  CHECK(res.rows[0][0].oop_wrong == -1);
  const auto lines = data_lines(res.table);
  REQUIRE(lines.size() == 1);
  const auto cols = split_ws(lines[0]);
  REQUIRE(cols.size() == 13);
  CHECK(cols[8] == "N/A");
  CHECK(cols[3] == "none");
}

TEST_CASE("a communicator that corrupts one element is caught by #wrong") {
  BenchOptions o;
  o.collectives = {Collective::ALLREDUCE};
  o.min_bytes = 1024;
  o.max_bytes = 4096;
  o.iters = 2;
  o.warmup = 0;
  auto res = sweep(3, o, /*corrupt=*/true);
  for (const auto& e : res.errors) CHECK(e == "");
  REQUIRE(res.rows[0].size() == 3);
  for (const auto& row : res.rows[0]) {
    CHECK(row.oop_wrong == 1);
    CHECK(row.ip_wrong == 1);
  }
  CHECK(res.table.find("# Out of bounds values : 6 FAILED") != std::string::npos);
}

TEST_CASE("bench options are validated on every rank") {
  auto bad = [](std::function<void(BenchOptions&)> f) {
    BenchOptions o;
    o.max_bytes = 1024;
    f(o);
    auto res = sweep(1, o);
    return res.errors[0];
  };
  CHECK(bad([](BenchOptions& o) { o.min_bytes = 4096; }).find("exceeds maximum") != std::string::npos);
  CHECK(bad([](BenchOptions& o) { o.step_factor = 1.0; }).find("step factor") != std::string::npos);
  CHECK(bad([](BenchOptions& o) { o.iters = 0; }).find("iterations") != std::string::npos);
  CHECK(bad([](BenchOptions& o) { o.root = 1; }).find("root") != std::string::npos);
}
