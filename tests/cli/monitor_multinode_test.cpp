// The resource monitor on 2 nodes x 1 rank over sshd in network namespaces (skipped with
// a message when not root, without sshd/ip, or without $DTRAIN_BIN): each rank's records
// reach its own file RUN_DIR/resources/rank<R>.jsonl (none the trainer's metrics.jsonl)
// with its node and host name, the interfaces are those of the rank's own namespace, the job's traffic between the nodes shows in their network
// rates, and `dtrain status` shows a row per node.
#include "cli_harness.h"
#include "run_readers.h"
#include "tiny_job.h"
#include "skip.h"

#include <nlohmann/json.hpp>

#include <map>

using namespace dtrain::cli_test;

TEST_CASE("monitor: 2 nodes' resource records, their network traffic and dtrain status") {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test("monitor multinode test skipped: $DTRAIN_BIN is not set or not executable");
    return;
  }
  Cluster cluster(2, 1);
  if (!cluster.usable()) {
    ::dtrain::test::skip_test("monitor multinode test skipped: " + cluster.skip_reason());
    if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
    return;
  }
  const std::string config = cluster.dir() + "/monitor.yaml";
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 2\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .max_steps = 8,
                                     .save_steps = 100,
                                     .training_more = "  device: cpu\n",
                                     .rest = "fault_tolerance:\n  max_retries: 0\nmonitor:\n  interval: 0.2\n"});
  const std::string run_dir = cluster.dir() + "/run";
  std::vector<std::string> argv = {
      dtrain_bin(),    "launch", "--config",     config, "--hostfile", cluster.dir() + "/hostfile",
      "--master-port", "0",      "--output-dir", run_dir};
  for (auto& s : cluster.ssh_sets()) argv.push_back(s);
  // Paced so that the job spans several samples.
  auto r = run(argv, {{"DTRAIN_TEST_SLOW_RANK", "all"}, {"DTRAIN_TEST_SLOW_MS", "200"}}, 120s);
  INFO("output:\n" << r.out);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.rc == 0);

  std::map<int, int> records;        // node -> records
  std::map<int, double> wire_bytes;  // node -> bytes in + out on its interfaces other than lo
  std::map<int, std::string> hosts;
  for (const auto& j : resource_records(run_dir)) {
    INFO(j.dump());
    const int node = j.at("node").get<int>();
    CHECK(j.at("rank").get<int>() == node);  // one rank per node
    ++records[node];
    hosts[node] = j.at("host").get<std::string>();
    if (j.contains("net_rx_mbps"))
      wire_bytes[node] += (j.at("net_rx_mbps").get<double>() + j.at("net_tx_mbps").get<double>()) * 1e6 *
                          j.at("interval_s").get<double>();
  }
  REQUIRE(records.size() == 2);
  CHECK(metrics_resource_records(run_dir) == 0);  // the trainer's file holds its records only
  CHECK(records[0] >= 2);
  CHECK(records[1] >= 2);
  CHECK(!hosts[0].empty());  // gethostname (the namespaces share one: node tells them apart)
  // The gradients all-reduced between the two nodes crossed each one's veth.
  CHECK(wire_bytes[0] > 0);
  CHECK(wire_bytes[1] > 0);

  auto st = run({dtrain_bin(), "status", run_dir}, {}, 20s);
  INFO("status:\n" << st.out);
  CHECK(st.rc == 0);
  CHECK(contains(st.out, "resources  latest sample of every rank"));
  CHECK(contains(st.out, "  host " + hosts[0] + " (node0, sampled "));
  CHECK(contains(st.out, "  host " + hosts[1] + " (node1, sampled "));
  CHECK(contains(st.out, "net rx "));
}
