// DeepSpeed's batch rule (config_resolve_batch): every combination of given keys, and
// errors that show all four numbers and say which key to change.
#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <optional>
#include <string>

using namespace dtrain;
using namespace dtrain::config;

namespace {

TrainConfig with(std::optional<int64_t> tb, std::optional<int64_t> mb, std::optional<int64_t> ga) {
  TrainConfig c;
  c.source = "test.yaml";
  c.train_batch_size = tb;
  c.train_micro_batch_size_per_gpu = mb;
  c.gradient_accumulation_steps = ga;
  return c;
}

struct Resolved {
  int64_t tb, mb, ga;
};

Resolved resolve(std::optional<int64_t> tb, std::optional<int64_t> mb, std::optional<int64_t> ga, int w) {
  TrainConfig c = with(tb, mb, ga);
  config_resolve_batch(c, w);
  CHECK(c.resolved_dp_world_size == w);
  CHECK(c.resolved_train_batch_size == c.resolved_micro_batch_size * c.resolved_grad_accum_steps * w);
  return {c.resolved_train_batch_size, c.resolved_micro_batch_size, c.resolved_grad_accum_steps};
}

std::string error_of(std::optional<int64_t> tb, std::optional<int64_t> mb, std::optional<int64_t> ga, int w) {
  TrainConfig c = with(tb, mb, ga);
  try {
    config_resolve_batch(c, w);
  } catch (const ConfigError& e) {
    CHECK(c.resolved_train_batch_size == 0);
    return e.what();
  }
  FAIL("config_resolve_batch did not throw");
  return "";
}

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Every error shows the four numbers, labelled.
void check_four(const std::string& m, const std::string& tb, const std::string& mb, const std::string& ga, int w) {
  INFO(m);
  CHECK(has(m, "train_batch_size = " + tb));
  CHECK(has(m, "train_micro_batch_size_per_gpu = " + mb));
  CHECK(has(m, "gradient_accumulation_steps = " + ga));
  CHECK(has(m, "world size = " + std::to_string(w)));
  CHECK(has(m, "test.yaml"));
}

}  // namespace

TEST_CASE("all three given and consistent") {
  Resolved r = resolve(32, 4, 2, 4);
  CHECK(r.tb == 32);
  CHECK(r.mb == 4);
  CHECK(r.ga == 2);
}

TEST_CASE("all three given and inconsistent: error names the product to use") {
  std::string m = error_of(30, 4, 2, 4);
  check_four(m, "30", "4", "2", 4);
  CHECK(has(m, "change train_batch_size to 32"));
}

TEST_CASE("train_batch_size and micro: accumulation derived") {
  Resolved r = resolve(64, 4, std::nullopt, 2);
  CHECK(r.ga == 8);
  CHECK(r.mb == 4);
  std::string m = error_of(60, 4, std::nullopt, 2);
  check_four(m, "60", "4", "not set", 2);
  CHECK(has(m, "multiple of 8"));
}

TEST_CASE("train_batch_size and accumulation: micro derived") {
  Resolved r = resolve(48, std::nullopt, 3, 4);
  CHECK(r.mb == 4);
  CHECK(r.ga == 3);
  std::string m = error_of(50, std::nullopt, 3, 4);
  check_four(m, "50", "not set", "3", 4);
  CHECK(has(m, "multiple of 12"));
}

TEST_CASE("micro and accumulation: train_batch_size derived") {
  Resolved r = resolve(std::nullopt, 2, 5, 3);
  CHECK(r.tb == 30);
}

TEST_CASE("only train_batch_size: accumulation 1") {
  Resolved r = resolve(16, std::nullopt, std::nullopt, 4);
  CHECK(r.mb == 4);
  CHECK(r.ga == 1);
  std::string m = error_of(10, std::nullopt, std::nullopt, 4);
  check_four(m, "10", "not set", "not set", 4);
  CHECK(has(m, "multiple of 4"));
}

TEST_CASE("only micro: accumulation 1") {
  Resolved r = resolve(std::nullopt, 3, std::nullopt, 5);
  CHECK(r.tb == 15);
  CHECK(r.ga == 1);
}

TEST_CASE("none given is an error") {
  std::string m = error_of(std::nullopt, std::nullopt, std::nullopt, 2);
  check_four(m, "not set", "not set", "not set", 2);
  CHECK(has(m, "set train_micro_batch_size_per_gpu"));
}

TEST_CASE("world size 1 and bad world sizes") {
  Resolved r = resolve(8, 8, 1, 1);
  CHECK(r.tb == 8);
  check_four(error_of(8, 8, 1, 0), "8", "8", "1", 0);
  check_four(error_of(std::nullopt, 0, std::nullopt, 2), "not set", "0", "not set", 2);
}

TEST_CASE("products that overflow are config errors") {
  std::string m = error_of(std::nullopt, int64_t(1) << 40, int64_t(1) << 40, 8);
  CHECK(has(m, "overflow"));
}

TEST_CASE("a train_batch_size smaller than one step of micro batches") {
  std::string m = error_of(4, 4, std::nullopt, 2);
  check_four(m, "4", "4", "not set", 2);
}

// ---------------------------------------------------------------------------
// Elastic rounds (config_elastic_batch): the global batch stays where it divides.

TEST_CASE("elastic batch: fewer ranks keep the global batch through more accumulation") {
  TrainConfig c = with(24, 4, std::nullopt);
  config_resolve_batch(c, 6);  // accumulation 1 on 6 ranks
  ElasticBatch b = config_elastic_batch(c, 6, 3);
  CHECK_FALSE(b.global_changed);
  CHECK(b.cfg.resolved_train_batch_size == 24);
  CHECK(b.cfg.resolved_micro_batch_size == 4);
  CHECK(b.cfg.resolved_grad_accum_steps == 2);
  CHECK(b.cfg.resolved_dp_world_size == 3);
  CHECK(b.note.find("gradient_accumulation_steps 1 -> 2") != std::string::npos);
  // back at full size: unchanged
  ElasticBatch full = config_elastic_batch(c, 6, 6);
  CHECK(full.cfg.resolved_grad_accum_steps == 1);
  CHECK(full.note.find("unchanged") != std::string::npos);
}

TEST_CASE(
    "elastic batch: a world size that does not divide keeps micro and accumulation and says the global batch changed") {
  TrainConfig c = with(std::nullopt, 4, 2);
  config_resolve_batch(c, 6);                      // 48
  ElasticBatch b = config_elastic_batch(c, 6, 4);  // 48 / (4*4) = 3: divides
  CHECK_FALSE(b.global_changed);
  CHECK(b.cfg.resolved_grad_accum_steps == 3);
  ElasticBatch odd = config_elastic_batch(c, 6, 5);  // 48 / 20: does not
  CHECK(odd.global_changed);
  CHECK(odd.cfg.resolved_train_batch_size == 40);
  CHECK(odd.cfg.resolved_micro_batch_size == 4);
  CHECK(odd.cfg.resolved_grad_accum_steps == 2);
  CHECK(odd.note.find("train_batch_size 48 -> 40") != std::string::npos);
}

TEST_CASE("monitor.min_free_memory at or above the node's memory is refused, naming the key and the memory") {
  // Issue 43, item 14: 1e10 and 1e30 (bytes where GiB are meant) were accepted and, past
  // int64 once in bytes, never alerted.
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  TrainConfig c;
  c.source = "job.yaml";
  c.monitor.min_free_memory = 2;
  CHECK(config_min_free_memory_bytes(c, 16 * kGiB) == int64_t{2} << 30);
  c.monitor.min_free_memory = 0;
  CHECK(config_min_free_memory_bytes(c, 16 * kGiB) == 0);
  for (double v : {16.0, 17.0, 1e10, 1e30}) {
    CAPTURE(v);
    c.monitor.min_free_memory = v;
    CHECK_THROWS_WITH_AS(config_min_free_memory_bytes(c, 16 * kGiB),
                         doctest::Contains("job.yaml: monitor.min_free_memory = "), ConfigError);
    CHECK_THROWS_WITH_AS(config_min_free_memory_bytes(c, 16 * kGiB),
                         doctest::Contains("this node's 16.0 GiB of memory"), ConfigError);
    CHECK_THROWS_WITH_AS(config_min_free_memory_bytes(c, 16 * kGiB), doctest::Contains("is in GiB, not bytes"),
                         ConfigError);
  }
  // The node's memory unknown: still never a byte count that wraps.
  c.monitor.min_free_memory = 1e30;
  CHECK_THROWS_AS(config_min_free_memory_bytes(c, 0), ConfigError);
  c.monitor.min_free_memory = 64;
  CHECK(config_min_free_memory_bytes(c, 0) == int64_t{64} << 30);
}
