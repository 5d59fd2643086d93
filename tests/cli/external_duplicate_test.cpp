// Two `dtrain run` processes with RANK=0 on two nodes of the namespace cluster (the
// second one's MASTER_ADDR is the first one's node, so it hosts a store of its own nobody
// dials and joins the first one's): the second is refused at join naming both processes,
// the first stops on it at once, and the shared run directory records one round and one
// true failure (no false "killed or lost" round for the first).
#include "cli_harness.h"

#include <fmt/format.h>

using namespace dtrain::cli_test;

namespace {

[[noreturn]] void skip(const std::string& why) {
  std::printf("duplicate rank 0 test skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

}  // namespace

TEST_CASE("dtrain run: two processes with RANK=0 on two nodes: the second is refused naming both, the first stops") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) skip("$DTRAIN_BIN is not set or not executable (run through ctest)");
  Cluster cluster(2, 1);
  if (!cluster.usable()) {
    if (cluster.failed()) FAIL("the test cluster could not be started: " << cluster.skip_reason());
    skip(cluster.skip_reason());
  }
  const std::string run_dir = cluster.dir() + "/run";
  const int port = 21000 + static_cast<int>(::getpid() % 20000);
  auto node = [&](int k) {
    const std::string cmd = fmt::format(
        "exec ip netns exec {} env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR={} MASTER_PORT={} "
        "DTRAIN_TEST_TOKEN=0123456789abcdef0123456789abcdef {} run --output-dir {} --set "
        "cluster.rendezvous.token_env=DTRAIN_TEST_TOKEN --set cluster.rendezvous.join_timeout=30 --set "
        "fault_tolerance.heartbeat_interval=1 --set fault_tolerance.heartbeat_timeout=5",
        cluster.ns(k), cluster.addr(0), port, shq(bin), shq(run_dir));
    return std::make_unique<Child>(std::vector<std::string>{"/bin/sh", "-c", cmd});
  };
  auto first = node(0);
  REQUIRE(first->wait_output("dtrain run: rank 0 joined the job's store", 30s));
  auto second = node(1);
  auto rc2 = second->wait(30s);
  INFO("first rank 0 (node 0):\n" << first->output());
  INFO("second rank 0 (node 1):\n" << second->output());
  // Before: no detection; both waited 300 s for rank 1, and the second recorded the
  // first's round as "killed or lost".
  REQUIRE_MESSAGE(rc2.has_value(), "the second rank 0 did not end within 30 s (join_timeout is 30 s)");
  CHECK(*rc2 == 2);
  CHECK(contains(second->output(), "rank 0 was started twice: by "));
  CHECK(contains(second->output(), fmt::format("(pid {})", first->pid())));
  auto rc1 = first->wait(20s);
  REQUIRE_MESSAGE(rc1.has_value(), "the first rank 0 did not stop within 20 s of the refusal");
  CHECK(*rc1 == 5);
  CHECK(contains(first->output(), "the job stops: rank 0 was started twice"));
  int starts = 0, fails = 0;
  std::string events = read_text(run_dir + "/events.jsonl");
  for (const auto& line : split_lines(events)) {
    starts += contains(line, "\"event\":\"round_start\"");
    fails += contains(line, "\"event\":\"failure\"");
    CHECK(!contains(line, "killed or lost"));
  }
  INFO("events.jsonl:\n" << events);
  CHECK(starts == 1);
  CHECK(fails == 1);
  MESSAGE(fmt::format("second rank 0 refused after {:.1f} s; the first stopped {:.1f} s after its start",
                      second->seconds(), first->seconds()));
}
