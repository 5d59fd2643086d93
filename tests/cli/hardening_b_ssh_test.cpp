// Issue 33 part B over real sshd in a network namespace (scripts/test_cluster.sh; skipped
// with a message when not root, without sshd/ip, or without $DTRAIN_BIN): cluster.env.set
// reaches the ranks over SSH without being in any command line (item 13), and the
// preflight does not restart on a permanent SSH error: an unknown host key under the strict
// policy, or an identity file that is not a key (item 15).
#include "cli_harness.h"
#include "skip.h"

#include <fmt/format.h>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

struct Env {
  Cluster cluster{1, 1};
  std::string bin = dtrain_bin();
};

Env* env() {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test("hardening SSH tests skipped: $DTRAIN_BIN is not set or not executable");
    return nullptr;
  }
  static std::unique_ptr<Env> instance = std::make_unique<Env>();
  if (!instance->cluster.usable()) {
    ::dtrain::test::skip_test("hardening SSH tests skipped: " + instance->cluster.skip_reason());
    if (instance->cluster.failed()) FAIL("the test cluster could not be started: " << instance->cluster.skip_reason());
    return nullptr;
  }
  return instance.get();
}

// A 1-rank bench on node 0 with these settings after the cluster's own SSH ones.
std::vector<std::string> bench(const Env& e, const std::string& tag, const std::vector<std::string>& extra) {
  const std::string hf = e.cluster.hostfile("hf-" + tag, {1});
  std::vector<std::string> argv = {e.bin,
                                   "bench",
                                   "allreduce",
                                   "--backend",
                                   "gloo",
                                   "-b",
                                   "1K",
                                   "-e",
                                   "1K",
                                   "-n",
                                   "1",
                                   "-w",
                                   "0",
                                   "--hostfile",
                                   hf,
                                   "--master-port",
                                   "0",
                                   "--output-dir",
                                   e.cluster.dir() + "/run-" + tag};
  for (const auto& s : e.cluster.ssh_sets()) argv.push_back(s);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace

TEST_CASE("item 13 over SSH: the rank sees cluster.env.set; no command line on the node ever holds it") {
  Env* e = env();
  if (!e) return;
  // In a config file: the user's own command line is the one place it could legitimately be.
  const std::string secret = "ssh-s3cr3t-4711-value";
  const std::string config = e->cluster.dir() + "/secret.yaml";
  std::ofstream(config) << "cluster:\n  env:\n    set:\n      MY_SECRET: " << secret << "\n";
  Child job(bench(*e, "secret", {"--config", config}), {{"DTRAIN_WORKER_PRINT_ENV", "MY_SECRET"}});
  REQUIRE(job.started());
  // The namespaces share this PID namespace: every process of the node is in /proc here.
  std::string leak;
  int scans = 0;
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until && !job.wait(0ms) && leak.empty()) {
    for (const auto& p : fs::directory_iterator("/proc")) {
      const std::string cmd = read_text(p.path().string() + "/cmdline");
      if (contains(cmd, secret)) leak = p.path().string() + ": " + cmd;
    }
    ++scans;
  }
  auto rc = job.wait(60s);
  INFO("output:\n" << job.output());
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK_MESSAGE(leak.empty(), leak);
  CHECK(scans > 0);
  CHECK(contains(read_text(e->cluster.dir() + "/run-secret/logs/rank0.log"), "env MY_SECRET=" + secret));
}

TEST_CASE("item 15: the preflight does not restart on an unknown host key or an identity file that is no key") {
  Env* e = env();
  if (!e) return;
  const std::string empty_known = e->cluster.dir() + "/known-empty";
  std::ofstream(empty_known).flush();
  const std::string not_a_key = e->cluster.dir() + "/not-a-key";
  std::ofstream(not_a_key) << "this is not a private key\n";
  ::chmod(not_a_key.c_str(), 0600);
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"unknown host key",
       {"--set", "cluster.ssh.known_hosts=" + empty_known, "--set", "cluster.ssh.host_key_policy=strict"}},
      {"not a key", {"--set", "cluster.ssh.identity_file=" + not_a_key}},
  };
  int n = 0;
  for (const auto& [what, sets] : cases) {
    CAPTURE(what);
    std::vector<std::string> extra = sets;
    extra.insert(extra.end(), {"--set", "doctor.preflight=true", "--set", "fault_tolerance.max_retries=2", "--set",
                               "fault_tolerance.retry_delay=1"});
    auto r = run(bench(*e, "pre" + std::to_string(n++), extra), {}, 90s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 4);
    CHECK(contains(r.out, "preflight: "));
    CHECK(contains(r.out, "not restarting"));
    CHECK(!contains(r.out, "restarting in"));
  }
}
