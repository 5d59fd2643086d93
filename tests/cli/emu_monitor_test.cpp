// The resource monitor on the CUDA execution engine through dtrain-emu: two local CUDA
// ranks with monitor.nvml_library "" (the engine's NVML subset inside the program) write
// resource records with their GPU's figures (memory used = what the rank's engine
// allocated, the card model's total and SM clock), and `dtrain status` shows each rank's
// GPU. Built only in the EMU tree.
#include "cli_harness.h"
#include "run_readers.h"
#include "tiny_job.h"

#include <nlohmann/json.hpp>

#include <set>

using namespace dtrain::cli_test;

TEST_CASE("dtrain-emu: CUDA ranks' resource records carry the engine's NVML figures") {
  const std::string bin = dtrain_bin();
  REQUIRE_MESSAGE(!bin.empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  TempDir tmp("dtrain-emu-monitor");
  REQUIRE(!tmp.path().empty());
  const std::string config = tmp.path() + "/tiny.yaml";
  const std::string run_dir = tmp.path() + "/run";
  std::ofstream(config) << tiny_job({.top = "train_micro_batch_size_per_gpu: 2\nsteps_per_print: 1\n",
                                     .n_layer = 1,
                                     .max_steps = 4,
                                     .save_steps = 100,
                                     .training_more = "  device: cuda\n  cuda_graph: false\n",
                                     .rest = "fault_tolerance:\n  max_retries: 0\n"
                                             "monitor:\n  interval: 0.2\n  nvml_library: \"\"\n"});
  auto r =
      run({bin, "launch", "--config", config, "--nproc-per-node", "2", "--master-port", "0", "--output-dir", run_dir},
          {{"CUDA_EMU_DEVICE_COUNT", "2"}, {"DTRAIN_TEST_SLOW_RANK", "all"}, {"DTRAIN_TEST_SLOW_MS", "300"}}, 300s);
  INFO("launch output:\n" << r.out);
  REQUIRE(!r.timed_out);
  REQUIRE(r.rc == 0);
  CHECK_FALSE(contains(r.out, "resource monitor without GPU figures"));

  std::set<int> ranks, gpus;
  for (const auto& j : resource_records(run_dir)) {
    INFO(j.dump());
    const int rank = j.at("rank").get<int>();
    ranks.insert(rank);
    REQUIRE(j.contains("gpu_index"));
    gpus.insert(j.at("gpu_index").get<int>());
    CHECK(j.at("gpu_index") == rank);                      // local rank i on the node's slot i
    CHECK(j.at("gpu_mem_used_bytes").get<int64_t>() > 0);  // the rank's model and optimizer state
    CHECK(j.at("gpu_mem_total_bytes") == int64_t{80} << 30);
    CHECK(j.at("gpu_sm_clock_mhz") == 1980);
    CHECK(j.contains("gpu_util_pct"));
    CHECK_FALSE(j.contains("gpu_temperature_c"));  // the engine has no thermal model
  }
  CHECK(ranks == std::set<int>{0, 1});
  CHECK(metrics_resource_records(run_dir) == 0);
  CHECK(gpus == std::set<int>{0, 1});

  auto st = run({bin, "status", run_dir}, {}, 30s);
  INFO("status:\n" << st.out);
  CHECK(contains(st.out, "    rank 0: cpu "));
  CHECK(contains(st.out, "gpu0 "));
  CHECK(contains(st.out, "gpu1 "));
  CHECK(contains(st.out, "/80.0 GiB"));
}
