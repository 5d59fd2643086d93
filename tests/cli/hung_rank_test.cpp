// Hung ranks through the real binary (issue 12 finding 5), on this machine and over SSH
// in network namespaces (that case skips with a message without root/sshd): a rank
// process stopped with SIGSTOP is still alive, so only its own heartbeat can give it
// away. The launcher must name it (node, host, rank, local rank, pid, how long silent),
// tear the round down and retry from the last checkpoint, or give up with exit 9. A rank
// that stops making training steps while it still beats (the test-only stall knob in
// `dtrain worker`) is caught by fault_tolerance.step_timeout.
#include "cli_harness.h"
#include "tiny_job.h"
#include "skip.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dirent.h>

using namespace dtrain::cli_test;

namespace {

constexpr int kHung = 9;  // README exit codes: a rank hung

// A tiny Llama on the shipped task data, long enough that training is still running
// well after the first checkpoint, with fast heartbeats and retries.
std::string config_text(int steps, int max_retries, const std::string& fault_extra) {
  return tiny_job({.top = "train_batch_size: 32\ntrain_micro_batch_size_per_gpu: 16\nsteps_per_print: 1\n",
                   .max_steps = steps,
                   .save_steps = 5,
                   .training_more = "  keep_last: 2\n  seed: 5\n",
                   .rest = "fault_tolerance:\n  max_retries: " + std::to_string(max_retries) +
                           "\n  retry_delay: 0.5\n  heartbeat_interval: 0.5\n" + fault_extra});
}

struct Job {
  TempDir tmp{"dtrain-hung"};
  std::string bin = dtrain_bin();
  std::string run_dir, config;

  Job(int steps, int max_retries, const std::string& fault_extra) {
    run_dir = tmp.path() + "/run";
    config = tmp.path() + "/hung.yaml";
    std::ofstream(config) << config_text(steps, max_retries, fault_extra);
  }
  std::vector<std::string> argv(int nproc) const {
    return {bin, "launch",       "--config", config, "--nproc-per-node", std::to_string(nproc), "--master-port",
            "0", "--output-dir", run_dir};
  }
};

// The `dtrain worker` process of `rank` of the job in run_dir (its environment names both),
// waiting up to `timeout` for it.
std::optional<pid_t> find_rank(const std::string& bin, const std::string& run_dir, int rank,
                               std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (DIR* d = ::opendir("/proc")) {
      std::optional<pid_t> found;
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const pid_t pid = std::stoi(name);
        const std::string cmd = proc_cmdline(pid);
        if (cmd.rfind(bin + " worker", 0) != 0) continue;
        if (proc_env(pid, "DTRAIN_RUN_DIR") == run_dir && proc_env(pid, "RANK") == std::to_string(rank)) found = pid;
      }
      ::closedir(d);
      if (found) return found;
    }
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

// The process is gone (reaped), not left behind stopped.
bool gone(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

std::vector<nlohmann::json> events(const std::string& run_dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& line : split_lines(read_text(run_dir + "/events.jsonl"))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == kind) out.push_back(j);
  }
  return out;
}

// Stops rank `rank` with SIGSTOP once the first checkpoint is written; its pid.
pid_t stop_rank_after_checkpoint(Child& launcher, const Job& job, int rank) {
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(launcher.wait_output("saved checkpoints/step5", 60s), "no first checkpoint:\n" << launcher.output());
  auto pid = find_rank(job.bin, job.run_dir, rank, 10s);
  REQUIRE_MESSAGE(pid.has_value(), "no worker process for rank " << rank << ":\n" << launcher.output());
  REQUIRE(::kill(*pid, SIGSTOP) == 0);
  return *pid;
}

bool have_bin() {
  if (!dtrain_bin().empty()) return true;
  ::dtrain::test::skip_test(
      "hung-rank tests skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a full build)");
  return false;
}

}  // namespace

TEST_CASE("1 rank stopped with SIGSTOP: named as hung, the retry resumes from its checkpoint and the job completes") {
  if (!have_bin()) return;
  Job job(600, 1, "  heartbeat_timeout: 3\n");
  Child launcher(job.argv(1));
  const pid_t victim = stop_rank_after_checkpoint(launcher, job, 0);
  auto rc = launcher.wait(90s);
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not end: the stopped rank was never noticed");
  CHECK(*rc == 0);
  // The rank's own host name follows its pid when it differs from the hostfile's name.
  CHECK(contains(out, fmt::format("round 0 failed: node 0 (localhost): rank 0 (local rank 0, pid {}", victim)));
  CHECK(contains(out, ") sent no heartbeat for "));
  CHECK(contains(out, "(fault_tolerance.heartbeat_timeout 3 s)"));
  CHECK(contains(out, "resumed from step "));
  CHECK(contains(out, "succeeded in round 1"));
  CHECK(gone(victim));

  const auto failures = events(job.run_dir, "failure");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].value("hang", "") == "missed_heartbeats");
  CHECK(failures[0].value("rank", -1) == 0);
  CHECK(failures[0].value("local_rank", -1) == 0);
  CHECK(failures[0].value("pid", -1) == victim);
  CHECK(failures[0].value("host", "") == "localhost");
  CHECK(failures[0].value("exit_code", -1) == kHung);
  CHECK(failures[0].value("retry", false));
  CHECK(failures[0].value("silent_s", 0.0) > 3.0);
  CHECK(events(job.run_dir, "finished").size() == 1);
}

TEST_CASE("1 rank stopped with SIGSTOP and max_retries 0: exit 9 naming the rank") {
  if (!have_bin()) return;
  Job job(600, 0, "  heartbeat_timeout: 3\n");
  Child launcher(job.argv(1));
  const pid_t victim = stop_rank_after_checkpoint(launcher, job, 0);
  auto rc = launcher.wait(60s);
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not end: the stopped rank was never noticed");
  CHECK(*rc == kHung);
  CHECK(contains(out, fmt::format("rank 0 (local rank 0, pid {}", victim)));
  CHECK(contains(out, ") sent no heartbeat for "));
  CHECK(contains(out, "giving up after 0 restart(s)"));
  CHECK(!contains(out, "round 1: starting"));
  CHECK(gone(victim));
  const auto failures = events(job.run_dir, "failure");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].value("exit_code", -1) == kHung);
  CHECK(!failures[0].value("retry", true));
}

TEST_CASE("2 ranks, one stopped with SIGSTOP: it is named, not left to Gloo's 60 s timeout") {
  if (!have_bin()) return;
  Job job(600, 0, "  heartbeat_timeout: 3\n");
  Child launcher(job.argv(2));
  const pid_t victim = stop_rank_after_checkpoint(launcher, job, 1);
  const auto stopped_at = Clock::now();
  // Well under Gloo's 60 s collective timeout: only the rank's own heartbeat can end it.
  const bool failed = launcher.wait_output("round 0 failed", 40s);
  const auto failed_at = Clock::now();
  auto rc = launcher.wait(30s);  // teardown of every process; generous for a loaded host
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(failed, "no failed round within 40 s of SIGSTOP");
  REQUIRE_MESSAGE(rc.has_value(), "the launcher did not exit within 30 s of the failed round");
  MESSAGE(fmt::format("SIGSTOP of rank 1 of 2 -> round failed in {:.2f} s (heartbeat_timeout 3 s, interval 0.5 s)",
                      std::chrono::duration<double>(failed_at - stopped_at).count()));
  CHECK(*rc == kHung);
  CHECK(contains(out, fmt::format("round 0 failed: node 0 (localhost): rank 1 (local rank 1, pid {}", victim)));
  CHECK(contains(out, ") sent no heartbeat for "));
  CHECK(!contains(out, "rank 0 (local rank 0"));  // its peer, waiting in a collective, is not blamed
  CHECK(gone(victim));
  const auto failures = events(job.run_dir, "failure");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].value("rank", -1) == 1);
  CHECK(failures[0].value("pid", -1) == victim);
}

TEST_CASE("a rank that beats but makes no step is caught by step_timeout, named, and the retry completes") {
  if (!have_bin()) return;
  // A heartbeat_timeout far beyond the step timeout: the heartbeat must not be what fires.
  Job job(40, 1, "  heartbeat_timeout: 30\n  step_timeout: 3\n");
  Child launcher(job.argv(1), {{"DTRAIN_TEST_STALL_AT_STEP", "8"}});
  REQUIRE(launcher.started());
  auto rc = launcher.wait(90s);
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not end: the stalled rank was never noticed");
  CHECK(*rc == 0);
  CHECK(contains(out, "rank 0 stalls before step 8"));
  const size_t at = out.find("round 0 failed: node 0 (localhost): rank 0 (local rank 0, pid ");
  REQUIRE(at != std::string::npos);
  CHECK(out.find(") made no step for ", at) != std::string::npos);
  CHECK(out.find("(fault_tolerance.step_timeout 3 s; last step 7)", at) != std::string::npos);
  CHECK(!contains(out, "sent no heartbeat"));
  CHECK(contains(out, "resumed from step 5"));
  CHECK(contains(out, "succeeded in round 1"));
  const auto failures = events(job.run_dir, "failure");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].value("hang", "") == "no_step");
  CHECK(failures[0].value("last_step", -1) == 7);
  CHECK(failures[0].value("exit_code", -1) == kHung);
  CHECK(failures[0].value("silent_s", 0.0) > 3.0);
}

TEST_CASE("over SSH, 2 nodes x 1 rank: a SIGSTOPped rank on the remote node is named with its node and host") {
  if (!have_bin()) return;
  Cluster cluster(2, 1);
  if (!cluster.usable()) {
    ::dtrain::test::skip_test("multi-node hung-rank test skipped: " + cluster.skip_reason());
    if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
    return;
  }
  Job job(600, 1, "  heartbeat_timeout: 3\n");
  std::vector<std::string> argv = {
      job.bin,         "launch", "--config",     job.config, "--hostfile", cluster.hostfile("hf-2x1", {1, 1}),
      "--master-port", "0",      "--output-dir", job.run_dir};
  for (const auto& s : cluster.ssh_sets()) argv.push_back(s);
  Child launcher(argv);
  const pid_t victim = stop_rank_after_checkpoint(launcher, job, 1);
  auto rc = launcher.wait(90s);
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not end: the stopped rank was never noticed");
  CHECK(*rc == 0);
  CHECK(contains(
      out, fmt::format("round 0 failed: node 1 (root@{}): rank 1 (local rank 0, pid {}", cluster.addr(1), victim)));
  CHECK(contains(out, ") sent no heartbeat for "));
  CHECK(!contains(out, "missed heartbeats for"));  // node 1's agent was fine: not a lost node
  CHECK(contains(out, "resumed from step "));
  CHECK(contains(out, "succeeded in round 1"));
  CHECK(gone(victim));
}

TEST_CASE("2 ranks, one stuck outside collectives: step_timeout names it, not the peer waiting for it") {
  if (!have_bin()) return;
  Job job(40, 0, "  heartbeat_timeout: 30\n  step_timeout: 3\n");
  Child launcher(job.argv(2), {{"DTRAIN_TEST_STALL_AT_STEP", "8"}, {"DTRAIN_TEST_STALL_RANK", "1"}});
  REQUIRE(launcher.started());
  auto rc = launcher.wait(60s);
  const std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the job did not end: the stalled rank was never noticed");
  CHECK(*rc == kHung);
  CHECK(contains(out, "rank 1 stalls before step 8"));
  CHECK(!contains(out, "rank 0 stalls"));
  const size_t at = out.find("round 0 failed: node 0 (localhost): rank 1 (local rank 1, pid ");
  REQUIRE(at != std::string::npos);
  CHECK(out.find(") made no step for ", at) != std::string::npos);
  CHECK(out.find("(fault_tolerance.step_timeout 3 s; last step 7) while its heartbeat goes on: stuck in its own "
                 "work, outside any collective; rank 0 waits in a collective",
                 at) != std::string::npos);
  const auto failures = events(job.run_dir, "failure");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].value("rank", -1) == 1);
  CHECK(failures[0].value("hang", "") == "no_step");
}
