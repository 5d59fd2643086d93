// End to end through dtrain-emu (dtrain's CUDA, cuBLASLt and NCCL code on the CPU
// execution engine), over real sshd in network namespaces: `launch --set
// training.device=cuda` on 2 nodes x 2 ranks at ZeRO stage 2 trains on the (emulated)
// GPUs over NCCL, recovers by itself from a kill -9 of one rank, and the run it leaves
// is resumed on the CPU over Gloo from the step its CUDA ranks checkpointed last. A
// config asking for more GPUs than a node has fails before any rank starts, naming the
// host. Built only in the EMU tree.
#include "cli_harness.h"
#include "run_readers.h"
#include "tiny_job.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace dtrain::cli_test;

namespace {

constexpr int kSteps = 12;

// The tiny Llama of the CLI tests: 4 ranks x micro 4, ZeRO stage 2 with overlapped
// communication, a checkpoint every 3 steps, fast failure detection and retry.
std::string config_text(const std::string& device) {
  return tiny_job({.top = "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 1\nsteps_per_print: 1\n"
                          "zero_optimization:\n  stage: 2\n  overlap_comm: true\n",
                   .max_steps = kSteps,
                   .save_steps = 3,
                   .training_more = "  device: " + device + "\n  keep_last: 5\n  seed: 5\n",
                   .rest = R"(fault_tolerance:
  max_retries: 2
  retry_delay: 1
  heartbeat_interval: 1
  heartbeat_timeout: 10
)"});
}

Cluster& cluster_or_skip() {
  static Cluster cluster(2, 2);
  if (!cluster.usable()) {
    if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
    std::printf("namespace cluster unavailable (%s): skipped\n", cluster.skip_reason().c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  return cluster;
}

std::vector<std::string> job_argv(Cluster& c, const std::vector<std::string>& head) {
  std::vector<std::string> argv = head;
  argv.insert(argv.end(), {"--hostfile", c.dir() + "/hostfile", "--master-port", "0"});
  for (auto& s : c.ssh_sets()) argv.push_back(s);
  return argv;
}

}  // namespace

TEST_CASE("dtrain-emu launch, training.device=cuda, 2 nodes x 2 ranks, stage 2: kill -9 recovers, resume on the cpu") {
  const std::string bin = dtrain_bin();
  REQUIRE_MESSAGE(!bin.empty(), "$DTRAIN_BIN (dtrain-emu) is not set: run through ctest in the EMU tree");
  Cluster& c = cluster_or_skip();
  const std::string config = c.dir() + "/cuda.yaml";
  std::ofstream(config) << config_text("cuda");
  const std::string run_dir = c.dir() + "/run-cuda";
  // Two emulated GPUs per node, forwarded to the nodes (cluster.env forwards CUDA_*).
  const std::map<std::string, std::string> gpus = {{"CUDA_EMU_DEVICE_COUNT", "2"}};

  Child launcher(job_argv(c, {bin, "launch", "--config", config, "--output-dir", run_dir}), gpus);
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(launcher.wait_output("saved checkpoints/step3", 240s), "no first checkpoint:\n" << launcher.output());
  auto victim = ns_worker(c.ns(1), bin, 10s);
  REQUIRE_MESSAGE(victim.has_value(), "no worker process in node 1");
  ::kill(victim->first, SIGKILL);
  auto rc = launcher.wait(400s);
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not finish");
  CHECK(*rc == 0);
  // Every rank on its CUDA device, collectives over NCCL: the launcher's plan and each
  // node agent's decision.
  CHECK(contains(out, "ranks 0-1 on cuda devices 0,1 (CUDA_VISIBLE_DEVICES), collectives over nccl"));
  CHECK(contains(out, "ranks 2-3 on cuda devices 0,1 (CUDA_VISIBLE_DEVICES), collectives over nccl"));
  CHECK(contains(out, "2 rank(s) on cuda devices 0,1, collectives: nccl"));
  CHECK(contains(out, "compute on cuda:0"));  // the ZeRO engine's memory report names the device
  CHECK(contains(out, "round 0 failed"));
  CHECK(contains(out, "succeeded in round 1"));
  const size_t at = out.find("resumed from step ");
  REQUIRE_MESSAGE(at != std::string::npos, "no rank resumed from a checkpoint");
  const int k = std::atoi(out.c_str() + at + 18);
  CHECK(k >= 3);
  CHECK(k % 3 == 0);
  CHECK(k < kSteps);
  CHECK(contains(out, fmt::format("resumed from step {} (checkpoints/step{}, saved at world size 4 stage 2)", k, k)));
  auto losses = metric_losses(run_dir);
  REQUIRE(losses.size() == static_cast<size_t>(kSteps));
  for (size_t i = 0; i < losses.size(); ++i) {
    CHECK(losses[i].first == static_cast<int64_t>(i + 1));
    CHECK(std::isfinite(losses[i].second));
  }
  CHECK(losses.back().second < losses.front().second);  // it learns

  // The same run continued on the CPU over Gloo: from the CUDA ranks' last checkpoint.
  auto r = run(job_argv(c, {bin, "resume", run_dir, "--set", "training.device=cpu", "--set",
                            fmt::format("training.max_steps={}", kSteps + 3)}),
               gpus, 300s);
  INFO("resume output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "ranks 2-3 on the cpu, collectives over gloo"));
  CHECK(contains(r.out, "2 rank(s) on cpu, collectives: gloo"));
  CHECK(contains(
      r.out, fmt::format("resumed from step {} (checkpoints/step{}, saved at world size 4 stage 2)", kSteps, kSteps)));
  auto after = metric_losses(run_dir);
  REQUIRE(after.size() == static_cast<size_t>(kSteps + 3));
  for (size_t i = 0; i < after.size(); ++i) CHECK(after[i].first == static_cast<int64_t>(i + 1));
  // The first CPU step continues the CUDA run's loss curve (same data order, same
  // weights), not a restart from scratch.
  CHECK(after[kSteps].second < after.front().second);
  CHECK(std::fabs(after[kSteps].second - after[kSteps - 1].second) < 0.5 * after[kSteps - 1].second);
  MESSAGE(
      fmt::format("cuda: loss {:.4f} at step 1, resumed from step {} after the kill, {:.4f} at step {}; cpu resume: "
                  "{:.4f} at step {}, {:.4f} at step {}",
                  losses.front().second, k, losses.back().second, kSteps, after[kSteps].second, kSteps + 1,
                  after.back().second, kSteps + 3));
}

TEST_CASE(
    "dtrain-emu launch, training.device=cuda on nodes with too few GPUs: refused before any rank starts, "
    "naming the host") {
  const std::string bin = dtrain_bin();
  REQUIRE(!bin.empty());
  Cluster& c = cluster_or_skip();
  const std::string config = c.dir() + "/few.yaml";
  std::ofstream(config) << config_text("cuda");
  const std::string run_dir = c.dir() + "/run-few";
  auto r = run(job_argv(c, {bin, "launch", "--config", config, "--output-dir", run_dir}),
               {{"CUDA_EMU_DEVICE_COUNT", "1"}}, 120s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "): training.device = cuda, but "));  // "node K (host): ..."
  CHECK(contains(r.out, "sees 1 CUDA device(s) and its ranks need device(s) 0,1"));
  CHECK(contains(r.out, "not restarting"));
  CHECK(!contains(r.out, " rank0] "));  // no rank printed anything: none was started
  CHECK(!contains(r.out, " rank2] "));
  CHECK(!std::filesystem::exists(run_dir + "/checkpoints/step3"));

  // auto on the same nodes: the ranks do not fit on the GPUs, so every node trains on the cpu.
  const std::string auto_cfg = c.dir() + "/auto.yaml";
  std::ofstream(auto_cfg) << config_text("auto");
  auto a = run(job_argv(c, {bin, "launch", "--dry-run", "--config", auto_cfg, "--output-dir", run_dir + "-auto"}),
               {{"CUDA_EMU_DEVICE_COUNT", "1"}}, 60s);
  INFO("dry run:\n" << a.out);
  CHECK(a.rc == 0);
  CHECK(contains(a.out, "else the cpu (training.device auto)"));
}
