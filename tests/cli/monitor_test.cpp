// The resource monitor through the real binary: the tiny CPU job on two local ranks with
// monitor.interval 0.2 s leaves resource records of each rank in its own file
// resources/rank<R>.jsonl (private as the run directory), none in metrics.jsonl (the
// trainer's alone: one record per step), a resumed run appends to the same files, each
// rank's TensorBoard run
// (RUN_DIR/tensorboard/resources/rank<R>, read back by the independent reader) holds the
// same figures, `dtrain status` shows the node's latest samples, and monitor.enabled:
// false writes none.
#include "cli_harness.h"
#include "run_readers.h"
#include "tiny_job.h"

#include "skip.h"
#include "tensorboard/tfevents_reader.h"

#include <cmath>

#include <map>
#include <set>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

std::string job(const std::string& monitor) {
  // Paced (DTRAIN_TEST_SLOW_MS per step) so the job runs for a few samples.
  return tiny_job({.top = "train_micro_batch_size_per_gpu: 2\nsteps_per_print: 1\n",
                   .n_layer = 1,
                   .max_steps = 6,
                   .save_steps = 100,
                   .training_more = "  device: cpu\n",
                   .rest = "fault_tolerance:\n  max_retries: 0\n" + monitor});
}

}  // namespace

TEST_CASE("monitor: a 2-rank tiny job's resource records in resources/rank<R>.jsonl and dtrain status") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) {
    ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
    return;
  }
  TempDir tmp("dtrain-monitor");
  REQUIRE(!tmp.path().empty());
  const std::map<std::string, std::string> slow = {{"DTRAIN_TEST_SLOW_RANK", "all"}, {"DTRAIN_TEST_SLOW_MS", "300"}};

  const std::string config = tmp.path() + "/tiny.yaml";
  const std::string run_dir = tmp.path() + "/run";
  std::ofstream(config) << job("monitor:\n  interval: 0.2\ntensorboard:\n  enabled: true\n");
  auto r =
      run({bin, "launch", "--config", config, "--nproc-per-node", "2", "--master-port", "0", "--output-dir", run_dir},
          slow, 120s);
  INFO("launch output:\n" << r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);

  // The live view: a compact line for the node (polled once a second at this interval).
  CHECK(contains(r.out, "[resources] node0 "));
  const auto recs = resource_records(run_dir);
  std::set<int> ranks;
  int with_rates = 0;
  for (const auto& j : recs) {
    ranks.insert(j.at("rank").get<int>());
    CHECK(j.at("node") == 0);
    CHECK_FALSE(j.contains("step"));
    CHECK(j.at("rss_bytes").get<int64_t>() > 0);
    CHECK(j.at("mem_available_bytes").get<int64_t>() > 0);
    CHECK(j.at("disk_free_bytes").get<int64_t>() > 0);
    CHECK_FALSE(j.contains("gpu_index"));  // CPU ranks read no GPU
    if (j.contains("cpu_pct") && j.contains("node_cpu_pct") && j.contains("net")) ++with_rates;
  }
  CHECK(ranks == std::set<int>{0, 1});
  CHECK(with_rates >= 2);  // every rank's second sample on has its rates
  // Private as the run directory (training.run_dir_mode 0700 by default).
  CHECK(mode_of(run_dir + "/resources") == 0700);
  CHECK(mode_of(run_dir + "/resources/rank0.jsonl") == 0600);
  CHECK(mode_of(run_dir + "/resources/rank1.jsonl") == 0600);
  // metrics.jsonl is the trainer's alone: one record per step, none of the monitors'.
  CHECK(metrics_resource_records(run_dir) == 0);
  const auto losses = metric_losses(run_dir);
  REQUIRE(losses.size() == 6);
  CHECK(losses.back().first == 6);

  // TensorBoard: rank 0's training scalars still match metrics.jsonl; each rank's
  // resource scalars are its records' figures, stepped by the record's time_ms.
  {
    const auto v = dtrain::test::tfevents_read(run_dir + "/tensorboard", run_dir + "/metrics.jsonl");
    INFO("reader:\n" << v.output);
    CHECK(v.code == 0);
  }
  for (int rank : {0, 1}) {
    const auto v = dtrain::test::tfevents_read(run_dir + "/tensorboard/resources/rank" + std::to_string(rank));
    INFO("reader:\n" << v.output);
    REQUIRE(v.code == 0);
    // Every record's figure is in the event file at the record's time.
    std::map<int64_t, double> tb;
    for (const auto& p : v.result["scalars"]["resource/rss_gib"]) tb[p[0].get<int64_t>()] = p[1].get<double>();
    int matched = 0;
    for (const auto& j : recs) {
      if (j.at("rank") != rank) continue;
      auto it = tb.find(j.at("time_ms").get<int64_t>());
      REQUIRE(it != tb.end());
      CHECK(it->second ==
            doctest::Approx(j.at("rss_bytes").get<double>() / (1024.0 * 1024.0 * 1024.0)).epsilon(1e-6));  // float32
      ++matched;
    }
    CHECK(matched >= 2);
    CHECK(v.result["scalars"].contains("resource/node_cpu_pct"));
    CHECK(v.result["scalars"].contains("resource/mem_available_gib"));
    CHECK_FALSE(v.result["scalars"].contains("gpu/util_pct"));  // CPU ranks
  }

  auto st = run({bin, "status", run_dir}, {}, 30s);
  INFO("status:\n" << st.out);
  CHECK(st.rc == 0);
  CHECK(contains(st.out, "state      finished"));
  CHECK(contains(st.out, "resources  latest sample of every rank"));
  CHECK(contains(st.out, "  host "));
  CHECK(contains(st.out, " (node0, sampled "));
  CHECK(contains(st.out, "    rank 0: cpu "));
  CHECK(contains(st.out, "    rank 1: cpu "));
  CHECK(contains(st.out, " GiB available"));

  SUBCASE("dtrain resume appends to the ranks' files") {
    // The saved config (monitor.interval 0.2) with two more steps: a new launch whose
    // rounds count from 0 again.
    auto r2 = run({bin, "resume", run_dir, "--set", "training.max_steps=8", "--master-port", "0"}, slow, 120s);
    INFO("resume output:\n" << r2.out);
    REQUIRE(r2.rc == 0);
    // Each rank's file: the first run's records kept, in order, then the resumed run's.
    std::map<int, std::vector<nlohmann::json>> before, after;
    for (const auto& j : recs) before[j.at("rank").get<int>()].push_back(j);
    for (const auto& j : resource_records(run_dir)) after[j.at("rank").get<int>()].push_back(j);
    REQUIRE(after.size() == 2);
    for (auto& [rank, b] : before) {
      CAPTURE(rank);
      auto& a = after[rank];
      REQUIRE(a.size() > b.size());
      CHECK(std::equal(b.begin(), b.end(), a.begin()));
      CHECK(a.back().at("time_ms").get<int64_t>() > b.back().at("time_ms").get<int64_t>());
    }
    CHECK(metrics_resource_records(run_dir) == 0);
  }
  SUBCASE("monitor.enabled: false writes no resource record") {
    const std::string off_dir = tmp.path() + "/off";
    std::ofstream(config) << job("monitor:\n  enabled: false\n  interval: 0.2\n");
    auto r2 =
        run({bin, "launch", "--config", config, "--nproc-per-node", "2", "--master-port", "0", "--output-dir", off_dir},
            slow, 120s);
    INFO("launch output:\n" << r2.out);
    REQUIRE(r2.rc == 0);
    CHECK(resource_records(off_dir).empty());
    CHECK_FALSE(fs::exists(off_dir + "/resources"));
    CHECK(metrics_resource_records(off_dir) == 0);
    CHECK(metric_losses(off_dir).size() == 6);
  }
}
