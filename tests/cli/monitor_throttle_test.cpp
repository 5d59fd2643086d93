// The monitor's network figures under a throttled link (issue 32), on 2 nodes x 1 rank
// over sshd in network namespaces: node 1's veth (bridge side, so the traffic *to* node 1)
// is shaped with `tbf rate 8mbit` (1 MB/s) and a job with a wider model all-reduces
// enough gradients to saturate it. `dtrain status`, polled while the job runs, shows
// node 1's receive rate above 0 and never above the shaped rate (1.5x for the bucket and
// the sampling jitter), while node 0's receive rate, the unshaped direction of the same
// link, goes above it. Skipped with a message when not root, without sshd/ip/tc, or
// without $DTRAIN_BIN.
#include "cli_harness.h"
#include "shaped_link.h"
#include "tiny_job.h"
#include "skip.h"

#include <map>
#include <regex>

using namespace dtrain::cli_test;

namespace {

struct NetRates {
  double rx = 0, tx = 0;
};

// The node rows of `dtrain status`'s resources section: node -> its net rates.
std::map<int, NetRates> status_net(const std::string& out) {
  static const std::regex row(R"(^  host .* \(node(\d+), sampled .*net rx ([0-9.]+) tx ([0-9.]+) MB/s)");
  std::map<int, NetRates> rates;
  for (const auto& line : split_lines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) rates[std::stoi(m[1])] = {std::stod(m[2]), std::stod(m[3])};
  }
  return rates;
}

}  // namespace

TEST_CASE("monitor: a node's veth shaped to 8 Mbit/s bounds its network rate in dtrain status") {
  if (!can_shape_links("monitor throttle test")) return;
  Cluster cluster(2, 1);
  if (!cluster_ready(cluster, "monitor throttle test")) return;
  const std::string veth = cluster.veth(1);
  REQUIRE(!veth.empty());
  // The veth goes with the cluster (test_cluster.sh down), its qdisc with it.
  int rc = 0;
  const std::string tc_out =
      shell("tc qdisc add dev " + shq(veth) + " root tbf rate 8mbit burst 32kbit latency 400ms 2>&1", &rc);
  INFO("tc: " << tc_out);
  REQUIRE(rc == 0);

  const std::string config = cluster.dir() + "/monitor.yaml";
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 2\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .max_steps = 16,
                                     .save_steps = 1000,
                                     .training_more = "  device: cpu\n",
                                     .rest = "fault_tolerance:\n  max_retries: 0\nmonitor:\n  interval: 0.2\n"});
  const std::string run_dir = cluster.dir() + "/run";
  // d_model 128: about 0.2 M parameters, 0.9 MB of fp32 gradients a step each way, about
  // a second a step through the shaped link.
  std::vector<std::string> argv = {dtrain_bin(),    "launch",
                                   "--config",      config,
                                   "--hostfile",    cluster.dir() + "/hostfile",
                                   "--master-port", "0",
                                   "--output-dir",  run_dir,
                                   "--set",         "model.d_model=128",
                                   "--set",         "model.d_ff=256"};
  for (auto& s : cluster.ssh_sets()) argv.push_back(s);
  Child job(argv);
  REQUIRE(job.started());

  // The latest sample of each node, as often as status can show a new one.
  std::map<int, std::vector<NetRates>> seen;
  for (int i = 0; i < 600 && job.running(); ++i) {
    std::this_thread::sleep_for(200ms);
    for (const auto& [node, r] : status_net(run({dtrain_bin(), "status", run_dir}, {}, 20s).out))
      seen[node].push_back(r);
  }
  const auto code = job.wait(120s);
  INFO("launch output:\n" << job.output());
  REQUIRE(code.has_value());
  REQUIRE(*code == 0);

  double max_rx[2] = {0, 0};
  std::string trace;
  for (const auto& [node, rates] : seen) {
    trace += "node" + std::to_string(node) + ":";
    for (const auto& r : rates) {
      if (node == 0 || node == 1) max_rx[node] = std::max(max_rx[node], r.rx);
      trace += " " + std::to_string(r.rx) + "/" + std::to_string(r.tx);
    }
    trace += "\n";
  }
  INFO("rx/tx MB/s as status showed them:\n" << trace);
  REQUIRE(seen[1].size() >= 3);
  // Node 1 received the gradients through the shaped veth: at most 8 Mbit/s = 1 MB/s.
  CHECK(max_rx[1] > 0);
  CHECK(max_rx[1] <= 1.5);
  // The other direction of the same link is not shaped: node 1's sends reach node 0 faster.
  CHECK(max_rx[0] > 1.5);
}
