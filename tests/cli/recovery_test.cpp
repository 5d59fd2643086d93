// End-to-end recovery of a training job through the real binary over sshd in network
// namespaces (3 nodes x 2 ranks; skipped with a message when not root, without sshd/ip,
// or without $DTRAIN_BIN): kill -9 of one rank's worker, and a node cut off the network
// and reconnected, both after the first checkpoint. The launcher must tear the round
// down, start the next one by itself, the ranks resume from the latest complete
// checkpoint ("resumed from step K"), the job exit 0, and the final weights equal those
// of an uninterrupted run of the same config.
#include "cli_harness.h"
#include "run_readers.h"
#include "tiny_job.h"
#include "skip.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <set>

using namespace dtrain::cli_test;

namespace {

constexpr int kSteps = 40;

// A tiny Llama on the shipped task data: 6 ranks x micro 16 x accum 2 (batches large
// enough that the 35 steps after the first checkpoint outlast the fault injection), a
// checkpoint every 5 steps, and fast failure detection and retry.
std::string config_text() {
  return tiny_job({.top = "train_batch_size: 192\ntrain_micro_batch_size_per_gpu: 16\nsteps_per_print: 1\n",
                   .optimizer_more = R"(    weight_decay: 0.01
scheduler:
  type: WarmupDecayLR
  params:
    warmup_num_steps: 5
)",
                   .max_steps = kSteps,
                   .save_steps = 5,
                   .training_more = "  keep_last: 3\n  seed: 11\n",
                   .rest = R"(fault_tolerance:
  max_retries: 2
  retry_delay: 1
  heartbeat_interval: 1
  heartbeat_timeout: 5
)"});
}

struct Env {
  Cluster cluster{3, 2};
  std::string bin = dtrain_bin();
  std::string config;
  std::string reference_dir;  // run dir of the uninterrupted run ("" until it ran)
};

Env* env() {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test(
        "recovery tests skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a full build)");
    return nullptr;
  }
  static std::unique_ptr<Env> instance = [] {
    auto e = std::make_unique<Env>();
    if (e->cluster.usable()) {
      e->config = e->cluster.dir() + "/recovery.yaml";
      std::ofstream(e->config) << config_text();
    }
    return e;
  }();
  if (!instance->cluster.usable()) {
    ::dtrain::test::skip_test("recovery tests skipped: " + instance->cluster.skip_reason());
    if (instance->cluster.failed()) FAIL("the test cluster could not be started: " << instance->cluster.skip_reason());
    return nullptr;
  }
  return instance.get();
}

std::vector<std::string> launch_argv(const Env& e, const std::string& run_dir) {
  std::vector<std::string> argv = {
      e.bin,           "launch", "--config",     e.config, "--hostfile", e.cluster.dir() + "/hostfile",
      "--master-port", "0",      "--output-dir", run_dir};
  for (auto& s : e.cluster.ssh_sets()) argv.push_back(s);
  return argv;
}

// The uninterrupted run, once per binary; its run dir.
std::string reference(Env& e) {
  if (!e.reference_dir.empty()) return e.reference_dir;
  const std::string dir = e.cluster.dir() + "/run-reference";
  auto r = run(launch_argv(e, dir), {}, 180s);
  INFO("reference run output:\n" << r.out);
  REQUIRE_MESSAGE(!r.timed_out, "the uninterrupted run did not finish in 60 s");
  REQUIRE(r.rc == 0);
  REQUIRE(contains(r.out, "succeeded in round 0"));
  MESSAGE(fmt::format("uninterrupted run: {:.1f} s", r.seconds));
  e.reference_dir = dir;
  return dir;
}

// Training steps recorded in metrics.jsonl, in file order.
std::vector<int64_t> metric_steps(const std::string& run_dir) {
  std::vector<int64_t> steps;
  for (const auto& [step, loss] : metric_losses(run_dir)) steps.push_back(step);
  return steps;
}

// Waits for a progress line ("step N/") written after `marker`; its arrival time.
std::optional<Clock::time_point> wait_progress_after(Child& c, const std::string& marker,
                                                     std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const std::string out = c.output();
    const size_t at = out.find(marker);
    if (at != std::string::npos && out.find(fmt::format("/{} | loss", kSteps), at) != std::string::npos)
      return Clock::now();
    if (!c.running()) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
  return std::nullopt;
}

// What every recovered run must show: a failed round 0, a round 1 that resumed from a
// checkpoint and succeeded, every step in metrics.jsonl once, and the reference weights.
void check_recovered(Env& e, const std::string& run_dir, const std::string& out, int rc) {
  INFO("output:\n" << out);
  CHECK(rc == 0);
  CHECK(contains(out, "round 0 failed"));
  CHECK(contains(out, "round 1: starting 6 rank(s)"));
  CHECK(contains(out, "succeeded in round 1"));
  const size_t at = out.find("resumed from step ");
  REQUIRE_MESSAGE(at != std::string::npos, "no rank resumed from a checkpoint");
  const int k = std::atoi(out.c_str() + at + 18);
  CHECK(k >= 5);
  CHECK(k % 5 == 0);
  CHECK(k < kSteps);
  CHECK(contains(out, fmt::format("resumed from step {} (checkpoints/step{}, saved at world size 6 stage 0)", k, k)));
  std::vector<int64_t> want;
  for (int s = 1; s <= kSteps; ++s) want.push_back(s);
  CHECK(metric_steps(run_dir) == want);
  const std::string ref = reference(e);
  const double d = weights_diff(run_dir + "/final/model.safetensors", ref + "/final/model.safetensors");
  CHECK_MESSAGE(d <= 1e-5, "final weights differ from the uninterrupted run by " << d);
  MESSAGE(fmt::format("resumed from step {}; final weights vs uninterrupted run: max rel diff {:g}{}", k, d,
                      read_text(run_dir + "/final/model.safetensors") == read_text(ref + "/final/model.safetensors")
                          ? " (bit-identical)"
                          : ""));
}

}  // namespace

TEST_CASE("kill -9 of a rank mid-training: the job resumes from its last checkpoint by itself") {
  Env* e = env();
  if (!e) return;
  reference(*e);
  const std::string run_dir = e->cluster.dir() + "/run-kill";
  Child launcher(launch_argv(*e, run_dir));
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(launcher.wait_output("saved checkpoints/step5", 180s), "no first checkpoint:\n" << launcher.output());
  auto victim = ns_worker(e->cluster.ns(1), e->bin, 10s);
  REQUIRE_MESSAGE(victim.has_value(), "no worker process in node 1");
  ::kill(victim->first, SIGKILL);
  const auto killed_at = Clock::now();
  auto training_again = wait_progress_after(launcher, "resumed from step", 180s);
  auto rc = launcher.wait(180s);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not finish:\n" << launcher.output());
  check_recovered(*e, run_dir, launcher.output(), *rc);
  REQUIRE(training_again.has_value());
  MESSAGE(fmt::format("kill -9 -> training again (round 1's first progress line) in {:.2f} s",
                      std::chrono::duration<double>(*training_again - killed_at).count()));
}

TEST_CASE("a node cut off the network mid-training and back: the job resumes by itself") {
  Env* e = env();
  if (!e) return;
  reference(*e);
  const std::string run_dir = e->cluster.dir() + "/run-link";
  Child launcher(launch_argv(*e, run_dir));
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(launcher.wait_output("saved checkpoints/step5", 180s), "no first checkpoint:\n" << launcher.output());
  REQUIRE(e->cluster.link(2, false));
  const auto cut_at = Clock::now();
  struct LinkBack {
    const Cluster& c;
    ~LinkBack() { c.link(2, true); }
  } link_back{e->cluster};
  // Back on the network once the launcher gave up on the round (retry_delay 1 s later
  // the next round dials the node again).
  const bool failed = launcher.wait_output("round 0 failed", 30s);
  REQUIRE(e->cluster.link(2, true));
  const auto back_at = Clock::now();
  REQUIRE_MESSAGE(failed, "the launcher did not notice the cut-off node:\n" << launcher.output());
  auto training_again = wait_progress_after(launcher, "resumed from step", 180s);
  auto rc = launcher.wait(180s);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not finish:\n" << launcher.output());
  check_recovered(*e, run_dir, launcher.output(), *rc);
  REQUIRE(training_again.has_value());
  MESSAGE(fmt::format("link down -> round failed and link up in {:.2f} s; link down -> training again in {:.2f} s",
                      std::chrono::duration<double>(back_at - cut_at).count(),
                      std::chrono::duration<double>(*training_again - cut_at).count()));
}
