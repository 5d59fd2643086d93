// network_idle end to end (issue 32), on 2 nodes x 1 rank over sshd in network
// namespaces: once the job is stepping, node 1's veth (bridge side: the traffic to node
// 1) is shaped to 8 kbit/s (1 kB/s), so the next gradient all-reduce (0.9 MB each way)
// stalls with both ranks inside it. The launcher must raise network_idle for node 1 (in
// a stalled two-node ring node 0 may be named too) in events.jsonl, its live view and
// `dtrain status`, once per episode; with the shaping removed the job finishes. Every
// sample names the launch (job_id, launcher.json's). Skipped
// with a message when not root, without sshd/ip/tc, or without $DTRAIN_BIN.
#include "cli_harness.h"
#include "shaped_link.h"
#include "run_readers.h"
#include "tiny_job.h"
#include "skip.h"

using namespace dtrain::cli_test;

namespace {

// The network_idle alerts of events.jsonl, by node.
std::map<int, int> idle_alerts(const std::string& run_dir) {
  std::map<int, int> by_node;
  for (const auto& line : split_lines(read_text(run_dir + "/events.jsonl"))) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "resource_alert" && j.value("alert", "") == "network_idle")
      ++by_node[j.value("node", -1)];
  }
  return by_node;
}

}  // namespace

TEST_CASE("monitor: a link shaped to near zero while the ranks all-reduce raises network_idle once") {
  if (!can_shape_links("monitor network_idle test")) return;
  Cluster cluster(2, 1);
  if (!cluster_ready(cluster, "monitor network_idle test")) return;
  const std::string veth = cluster.veth(1);
  REQUIRE(!veth.empty());

  const std::string config = cluster.dir() + "/monitor.yaml";
  // A heartbeat timeout far above the stall: the shaped link delays node 1's heartbeat
  // answers too, and the test is about the monitor, not the failure detector.
  std::ofstream(config) << tiny_job(
      {.top = "train_micro_batch_size_per_gpu: 2\nsteps_per_print: 1\n",
       .n_layer = 1,
       .max_steps = 12,
       .save_steps = 1000,
       .training_more = "  device: cpu\n",
       .rest = "fault_tolerance:\n  max_retries: 0\n  heartbeat_timeout: 300\nmonitor:\n  interval: 0.2\n"});
  const std::string run_dir = cluster.dir() + "/run";
  std::vector<std::string> argv = {dtrain_bin(),    "launch",
                                   "--config",      config,
                                   "--hostfile",    cluster.dir() + "/hostfile",
                                   "--master-port", "0",
                                   "--output-dir",  run_dir,
                                   "--set",         "model.d_model=128",
                                   "--set",         "model.d_ff=256"};
  for (auto& s : cluster.ssh_sets()) argv.push_back(s);
  // Paced so that the shaping lands between steps rather than after the last one.
  Child job(argv, {{"DTRAIN_TEST_SLOW_RANK", "all"}, {"DTRAIN_TEST_SLOW_MS", "300"}});
  REQUIRE(job.started());

  bool stepping = false;
  for (int i = 0; i < 600 && job.running() && !stepping; ++i) {
    std::this_thread::sleep_for(100ms);
    stepping = metric_losses(run_dir).size() >= 2;
  }
  INFO("launch output:\n" << job.output());
  REQUIRE(stepping);
  int rc = 0;
  const std::string tc_out =
      shell("tc qdisc add dev " + shq(veth) + " root tbf rate 8kbit burst 4kbit latency 400ms 2>&1", &rc);
  INFO("tc: " << tc_out);
  REQUIRE(rc == 0);
  // Two judgements of at least a second each (the launcher looks once per max(1 s,
  // monitor.interval)), and the samples' own lag: well within 60 s.
  bool raised = false;
  for (int i = 0; i < 300 && job.running() && !raised; ++i) {
    std::this_thread::sleep_for(200ms);
    raised = idle_alerts(run_dir).count(1) > 0;
  }
  const auto status = run({dtrain_bin(), "status", run_dir}, {}, 20s);
  shell("tc qdisc del dev " + shq(veth) + " root 2>&1");
  const auto code = job.wait(180s);
  INFO("status while shaped:\n" << status.out);
  INFO("events.jsonl:\n" << read_text(run_dir + "/events.jsonl"));
  CHECK(raised);
  REQUIRE(code.has_value());
  CHECK(*code == 0);

  const auto alerts = idle_alerts(run_dir);
  REQUIRE(alerts.count(1) == 1);
  // One episode, one alert: not one per sample of the stall.
  CHECK(alerts.at(1) == 1);
  // Named by the hostfile's name for node 1 (the namespaces share one gethostname).
  std::vector<std::string> hostfile_hosts;
  for (const auto& line : split_lines(read_text(cluster.dir() + "/hostfile")))
    if (!line.empty() && line[0] != '#') hostfile_hosts.push_back(line.substr(0, line.find_first_of(" \t")));
  REQUIRE(hostfile_hosts.size() == 2);
  for (const auto& line : split_lines(read_text(run_dir + "/events.jsonl"))) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("alert", "") == "network_idle" && j.value("node", -1) == 1)
      CHECK(j.value("host", "") == hostfile_hosts[1]);
  }
  CHECK(contains(job.output(), "[resources] alert network_idle on node1 " + hostfile_hosts[1] + ":"));
  CHECK(contains(status.out, "network_idle"));
  CHECK(contains(status.out, "monitor.min_network"));
  // The samples say why: both ranks waited in the all-reduce while node 1 was shaped.
  // Every sample names this launch (launcher.json's job id).
  const auto launcher = nlohmann::json::parse(read_text(run_dir + "/launcher.json"), nullptr, false);
  REQUIRE(launcher.is_object());
  const std::string job_id = launcher.value("job_id", "");
  CHECK(!job_id.empty());
  int waiting = 0;
  for (const auto& j : resource_records(run_dir)) {
    CHECK(j.value("job_id", "") == job_id);
    if (j.value("in_collective_frac", 0.0) >= 0.5) ++waiting;
  }
  CHECK(waiting >= 4);
}
