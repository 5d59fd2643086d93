// Straggler detection end to end through the real binary over sshd in network namespaces
// (3 nodes x 1 rank; skipped with a message when not root, without sshd/ip, or without
// $DTRAIN_BIN): rank 1 is slowed by the test-only DTRAIN_TEST_SLOW_RANK/_MS delay (200 ms
// after every step); the launcher's live output and `dtrain status` must flag rank 1
// naming its host, and metrics.jsonl must carry every rank's compute and communication
// wait, the slowed rank's peers waiting for it.
#include "cli_harness.h"
#include "tiny_job.h"
#include "skip.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

using namespace dtrain::cli_test;

TEST_CASE("a persistently slow rank is flagged with its host by the launcher and by dtrain status") {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test(
        "straggler test skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a full build)");
    return;
  }
  Cluster cluster(3, 1);
  if (!cluster.usable()) {
    ::dtrain::test::skip_test("straggler test skipped: " + cluster.skip_reason());
    if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
    return;
  }
  const std::string config = cluster.dir() + "/straggler.yaml";
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 2\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .max_steps = 10,
                                     .save_steps = 100,
                                     .training_more = "  device: cpu\n",
                                     .rest = "fault_tolerance:\n  max_retries: 0\n  straggler_factor: 1.5\n"
                                             "  straggler_window: 3\n"});
  const std::string run_dir = cluster.dir() + "/run";
  std::vector<std::string> argv = {
      dtrain_bin(),    "launch", "--config",     config, "--hostfile", cluster.dir() + "/hostfile",
      "--master-port", "0",      "--output-dir", run_dir};
  for (auto& s : cluster.ssh_sets()) argv.push_back(s);
  auto r = run(argv, {{"DTRAIN_TEST_SLOW_RANK", "1"}, {"DTRAIN_TEST_SLOW_MS", "200"}}, 90s);
  INFO("output:\n" << r.out);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.rc == 0);
  const std::string host1 = "root@" + cluster.addr(1);
  CHECK(contains(r.out, "straggler: rank 1 on " + host1 + " (node 1)"));
  CHECK(contains(r.out, "| straggler rank 1 (" + host1 + ")"));
  CHECK_FALSE(contains(r.out, "straggler: rank 0 "));
  CHECK_FALSE(contains(r.out, "straggler: rank 2 "));
  CHECK_FALSE(contains(r.out, "rank_times compute_ms"));  // the launcher's input, not terminal output

  // Every record from the first window on: rank 1 computes longest, its peers wait longest.
  int records = 0;
  for (const auto& line : split_lines(read_text(run_dir + "/metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("rank_compute_ms")) continue;
    ++records;
    const auto c = j["rank_compute_ms"].get<std::vector<double>>();
    const auto w = j["rank_comm_ms"].get<std::vector<double>>();
    REQUIRE(c.size() == 3);
    REQUIRE(w.size() == 3);
    if (j["step"].get<int>() < 2) continue;  // step 1 has no delay before it
    CHECK(c[1] > c[0]);
    CHECK(c[1] > c[2]);
    CHECK(w[0] > w[1]);
    CHECK(w[2] > w[1]);
  }
  CHECK(records == 10);

  auto st = run({dtrain_bin(), "status", run_dir}, {}, 20s);
  INFO("status:\n" << st.out);
  CHECK(st.rc == 0);
  CHECK(contains(st.out, "stragglers 1 rank(s) slower than 1.5x the median for 3+ progress records in a row"));
  CHECK(contains(st.out, "rank 1 on " + host1 + ": compute"));
  // A straggler event in events.jsonl, with its host.
  CHECK(contains(read_text(run_dir + "/events.jsonl"), "\"event\":\"straggler\""));
  CHECK(contains(read_text(run_dir + "/events.jsonl"), "\"host\":\"" + host1 + "\""));
}
