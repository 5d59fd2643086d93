// End-to-end SSH launch failures through the real `dtrain` binary against a real sshd in
// a network namespace (skipped with a message when not root, without sshd/ip, or without
// $DTRAIN_BIN): a changed host key under the strict policy, an unknown host, a refused
// port and a bad identity file each end bounded, with exit code 4 and a message naming
// the host and the file to fix.
#include "cli_harness.h"
#include "skip.h"

#include <fmt/format.h>

using namespace dtrain::cli_test;

namespace {

constexpr int kLaunchError = 4;  // main.cpp footer: 4 launch/SSH

struct Env {
  Cluster cluster{1, 1};
  std::string bin = dtrain_bin();
};

Env* env() {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test(
        "launch error tests skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a "
        "full build)");
    return nullptr;
  }
  static std::unique_ptr<Env> instance = std::make_unique<Env>();
  if (!instance->cluster.usable()) {
    ::dtrain::test::skip_test("launch error tests skipped: " + instance->cluster.skip_reason());
    if (instance->cluster.failed()) FAIL("the test cluster could not be started: " << instance->cluster.skip_reason());
    return nullptr;
  }
  return instance.get();
}

// One launch of a 1-rank bench on node 0 with these SSH settings; no retries so the
// first failure is the answer.
RunResult launch(const Env& e, const std::string& hostfile_line, const std::string& identity,
                 const std::string& known_hosts, const std::string& tag) {
  std::string hf = e.cluster.dir() + "/hf-" + tag;
  std::ofstream(hf) << hostfile_line << "\n";
  return run({e.bin,
              "bench",
              "allreduce",
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
              e.cluster.dir() + "/run-" + tag,
              "--set",
              "cluster.ssh.identity_file=" + identity,
              "--set",
              "cluster.ssh.known_hosts=" + known_hosts,
              "--set",
              "cluster.ssh.host_key_policy=strict",
              "--set",
              "cluster.ssh.connect_timeout=5",
              "--set",
              "fault_tolerance.max_retries=0"},
             {}, 60s);
}

}  // namespace

TEST_CASE("SSH launch errors: exit 4 with the host and the file named, never a hang") {
  Env* e = env();
  if (!e) return;
  const Cluster& c = e->cluster;
  const std::string addr = c.addr(0);
  const std::string good = "root@" + addr + " slots=1";

  SUBCASE("a different host key for the address under the strict policy") {
    std::string other = c.dir() + "/other_key";
    int rc = 0;
    shell("ssh-keygen -q -t ed25519 -N '' -f " + other + " </dev/null >/dev/null 2>&1", &rc);
    REQUIRE(rc == 0);
    std::string pub = read_text(other + ".pub");
    std::string kh = c.dir() + "/known_hosts_wrong";
    std::ofstream(kh) << addr << " " << pub.substr(0, pub.find(' ', pub.find(' ') + 1)) << "\n";
    auto r = launch(*e, good, c.identity(), kh, "hostkey");
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kLaunchError);
    CHECK(contains(r.out, "HOST KEY MISMATCH"));
    CHECK(contains(r.out, addr));
    CHECK(contains(r.out, kh));
  }
  SUBCASE("an unknown host (empty known_hosts)") {
    std::string kh = c.dir() + "/known_hosts_empty";
    std::ofstream(kh).flush();
    auto r = launch(*e, good, c.identity(), kh, "unknown");
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kLaunchError);
    CHECK(contains(r.out, "unknown host key"));
    CHECK(contains(r.out, addr));
    CHECK(contains(r.out, kh));
  }
  SUBCASE("a refused port (port=1 in the hostfile)") {
    auto r = launch(*e, good + " port=1", c.identity(), c.known_hosts(), "port");
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kLaunchError);
    CHECK(contains(r.out, "refused"));
    CHECK(contains(r.out, addr));
    CHECK(contains(r.out, "port 1"));
  }
  SUBCASE("a missing identity file") {
    std::string id = c.dir() + "/no_such_key";
    auto r = launch(*e, good, id, c.known_hosts(), "noid");
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kLaunchError);
    CHECK(contains(r.out, addr));
    CHECK(contains(r.out, id));
  }
  SUBCASE("an identity file whose key the node does not accept") {
    std::string id = c.dir() + "/stranger_key";
    int rc = 0;
    shell("ssh-keygen -q -t ed25519 -N '' -f " + id + " </dev/null >/dev/null 2>&1", &rc);
    REQUIRE(rc == 0);
    auto r = launch(*e, good, id, c.known_hosts(), "badid");
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kLaunchError);
    CHECK(contains(r.out, addr));
    CHECK(contains(r.out, id));
    CHECK(contains(r.out, "authentication"));
  }
  SUBCASE("a garbage identity file") {
    std::string id = c.dir() + "/garbage_key";
    std::ofstream(id) << "this is not a key\n";
    ::chmod(id.c_str(), 0600);
    auto r = launch(*e, good, id, c.known_hosts(), "garbage");
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kLaunchError);
    CHECK(contains(r.out, addr));
    CHECK(contains(r.out, id));
  }
}
