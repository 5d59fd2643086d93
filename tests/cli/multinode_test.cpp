// End-to-end multi-node tests of `dtrain bench` through the real binary, over real
// sshd in network namespaces (scripts/test_cluster.sh; skipped with a message when not
// root, without sshd/ip, or without $DTRAIN_BIN): the full table with rank placement,
// byte-exact env and the rank env contract on a heterogeneous hostfile, kill -9 of a
// rank (teardown everywhere, exit code, retry), and a node cut off the network.
#include "cli_harness.h"

#include "core/c_escape.h"
#include "skip.h"

#include <fmt/format.h>

#include <algorithm>

using namespace dtrain::cli_test;

namespace {

constexpr int kNodes = 3;

struct Env {
  Cluster cluster{kNodes, 2};
  std::string bin = dtrain_bin();
};

// The cluster for this binary: up on first use, down at exit. nullptr (with a MESSAGE)
// when the tests cannot run here.
Env* env() {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test(
        "multi-node CLI tests skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a "
        "full build)");
    return nullptr;
  }
  static std::unique_ptr<Env> instance = std::make_unique<Env>();
  if (!instance->cluster.usable()) {
    ::dtrain::test::skip_test("multi-node CLI tests skipped: " + instance->cluster.skip_reason());
    if (instance->cluster.failed()) FAIL("the test cluster could not be started: " << instance->cluster.skip_reason());
    return nullptr;
  }
  return instance.get();
}

std::vector<std::string> bench_argv(const Env& e, const std::string& hostfile, const std::string& run_dir,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {e.bin,    "bench",         "allreduce", "--backend",    "gloo", "--hostfile",
                                   hostfile, "--master-port", "0",         "--output-dir", run_dir};
  for (auto& s : e.cluster.ssh_sets()) argv.push_back(s);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Every dtrain process on every node, one line each.
std::string leftovers(const Env& e, const std::vector<int>& nodes) {
  std::string s;
  for (int k : nodes) {
    auto ps = dtrain_processes(e.cluster.ns(k), e.bin);
    if (!ps.empty()) s += fmt::format("node {}:\n{}", k, describe(ps));
  }
  return s;
}

// Waits until no dtrain process lives on `nodes`; "" then, else what is left.
std::string wait_no_leftovers(const Env& e, const std::vector<int>& nodes, Clock::time_point deadline) {
  while (true) {
    std::string left = leftovers(e, nodes);
    if (left.empty() || Clock::now() > deadline) return left;
    std::this_thread::sleep_for(100ms);
  }
}

// A worker process of node k (pid and its RANK), waiting up to `timeout` for one.
std::optional<std::pair<pid_t, int>> find_worker(const Env& e, int k, std::chrono::milliseconds timeout) {
  return ns_worker(e.cluster.ns(k), e.bin, timeout);
}

// The line of the launcher's output that holds every part, or "".
std::string line_with(const std::string& out, const std::vector<std::string>& parts) {
  for (const auto& line : split_lines(out)) {
    bool all = true;
    for (const auto& p : parts) all = all && contains(line, p);
    if (all) return line;
  }
  return "";
}

// Every rank logs this (at debug level) once its Gloo mesh is connected: from then on
// the job is running collectives. (The table header is no signal: rank 0's stdout is a
// pipe and reaches us at the first flushed row.)
bool wait_all_connected(Child& launcher, int world) {
  return launcher.wait_count(fmt::format(" of {} connected on", world), world, 60s);
}

const std::map<std::string, std::string> kDebug = {{"DTRAIN_LOG_LEVEL", "debug"}};

// Starts a long bench on the 3x2 cluster, kills one worker of node 1 with SIGKILL once
// every rank is connected, waits for the launcher. Returns the killed rank.
struct KillRun {
  int rank = -1;
  std::optional<int> rc;
  std::string out;
  Clock::time_point killed_at;
};

KillRun kill_one_rank(Env& e, const std::string& tag) {
  KillRun k;
  Child launcher(
      bench_argv(e, e.cluster.dir() + "/hostfile", e.cluster.dir() + "/run-" + tag,
                 {"-b", "16M", "-e", "16M", "-n", "1000", "-w", "1", "--set", "fault_tolerance.max_retries=0"}),
      kDebug);
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(wait_all_connected(launcher, 6), "the bench did not start:\n" << launcher.output());
  auto victim = find_worker(e, 1, 10s);
  REQUIRE_MESSAGE(victim.has_value(), "no worker process in node 1");
  k.rank = victim->second;
  ::kill(victim->first, SIGKILL);
  k.killed_at = Clock::now();
  k.rc = launcher.wait(30s);
  k.out = launcher.output();
  return k;
}

}  // namespace

TEST_CASE("3 nodes x 2 slots: the full allreduce table, every rank where the placement put it") {
  Env* e = env();
  if (!e) return;
  std::string run_dir = e->cluster.dir() + "/run-table";
  auto r = run(bench_argv(*e, e->cluster.hostfile("hf-3x2", {2, 2, 2}), run_dir,
                          {"-b", "1K", "-e", "4M", "-n", "10", "-w", "2"}),
               {{"DTRAIN_LOG_LEVEL", "debug"}}, 90s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  auto rows = table_rows(r.out);
  REQUIRE(rows.size() == 13);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i].bytes == (size_t{1024} << i));
    REQUIRE(rows[i].cols.size() == 13);
    CHECK(rows[i].cols[1] == std::to_string((size_t{1024} << i) / 4));  // count of floats
    CHECK(rows[i].cols[8] == "0");                                      // out-of-place #wrong
    CHECK(rows[i].cols[12] == "0");                                     // in-place #wrong
  }
  CHECK(contains(r.out, "# Out of bounds values : 0 OK"));
  // Placement: rank r on node r/2, local rank r%2. The rank's Gloo device binds the
  // address it routes from, which exists only inside its node's namespace.
  for (int rank = 0; rank < 6; ++rank) {
    int node = rank / 2;
    std::string addr = e->cluster.addr(node);
    CHECK_MESSAGE(!line_with(r.out, {fmt::format("[node{} rank{}]", node, rank),
                                     fmt::format("gloo: rank {} of 6 connected", rank), "addr=[" + addr + "]"})
                       .empty(),
                  "rank " << rank << " did not connect from node " << node << " (" << addr << ")");
    CHECK_MESSAGE(
        !line_with(r.out, {fmt::format("[node{} rank{}]", node, rank),
                           fmt::format("rank {} (local {}, node {}) on", rank, rank % 2, node), "gloo address " + addr})
             .empty(),
        "no worker placement line for rank " << rank);
  }
}

TEST_CASE("heterogeneous hostfile (1, 2, 3 slots): rank env contract and byte-exact env values") {
  Env* e = env();
  if (!e) return;
  // Spaces, both quotes, $, backquotes, a backslash, a tab and newlines: every byte must
  // survive the launcher's SSH command line and the agent.
  const std::string odd = "a b 'single' \"double\" $HOME ${X} `id` \\back\ttab\nsecond line\n";
  const std::string fwd = "forwarded 'value' with $dollar\nand a newline";
  std::string run_dir = e->cluster.dir() + "/run-env";
  auto r = run(
      bench_argv(*e, e->cluster.hostfile("hf-123", {1, 2, 3}), run_dir,
                 {"-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--set", "cluster.env.set.DT_E2E_ODD=" + odd}),
      {{"DTRAIN_WORKER_PRINT_ENV", "DT_E2E_ODD,NCCL_E2E_FWD"}, {"NCCL_E2E_FWD", fwd}, {"DTRAIN_LOG_LEVEL", "debug"}},
      60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  const int first_rank[] = {0, 1, 3}, slots[] = {1, 2, 3};
  for (int node = 0; node < 3; ++node) {
    for (int lr = 0; lr < slots[node]; ++lr) {
      int rank = first_rank[node] + lr;
      std::string log = read_text(fmt::format("{}/logs/rank{}.log", run_dir, rank));
      INFO("rank " << rank << " log:\n" << log);
      auto lines = split_lines(log);
      auto has = [&](const std::string& l) { return std::find(lines.begin(), lines.end(), l) != lines.end(); };
      CHECK(has(fmt::format("env RANK={}", rank)));
      CHECK(has(fmt::format("env LOCAL_RANK={}", lr)));
      CHECK(has("env WORLD_SIZE=6"));
      CHECK(has(fmt::format("env LOCAL_WORLD_SIZE={}", slots[node])));
      CHECK(has(fmt::format("env NODE_RANK={}", node)));
      CHECK(has("env MASTER_ADDR=" + e->cluster.launcher_addr()));
      CHECK(has("env DT_E2E_ODD=" + dtrain::c_escape(odd)));
      CHECK(has("env NCCL_E2E_FWD=" + dtrain::c_escape(fwd)));
      CHECK(contains(log, "addr=[" + e->cluster.addr(node) + "]"));
    }
  }
  // The whole job used exactly the ranks 0..5.
  CHECK(!std::filesystem::exists(run_dir + "/logs/rank6.log"));
}

TEST_CASE("kill -9 of one rank: every process on every node gone, the rank and its node named") {
  Env* e = env();
  if (!e) return;
  KillRun k = kill_one_rank(*e, "kill");
  INFO("output:\n" << k.out);
  REQUIRE_MESSAGE(k.rc.has_value(), "the launcher did not exit after the rank died");
  CHECK(*k.rc != 0);
  std::string left = wait_no_leftovers(*e, {0, 1, 2}, k.killed_at + 10s);
  CHECK_MESSAGE(left.empty(), "dtrain processes left 10 s after the kill:\n" << left);
  MESSAGE(fmt::format("kill -9 -> launcher exit and every node clean in {:.2f} s",
                      std::chrono::duration<double>(Clock::now() - k.killed_at).count()));
  // Node 1's agent names the rank, the host and the signal.
  CHECK(!line_with(k.out, {"[node1]", fmt::format("rank {} ", k.rank), "on ", "killed by signal 9"}).empty());
  CHECK(contains(k.out, "round 0 failed"));
}

// When a rank is killed its peers fail at the same moment with a Gloo "connection
// closed" error (exit 5); the supervisor must still blame the killed rank and exit 137.
TEST_CASE("kill -9 of one rank: the launcher blames the killed rank and exits with its code (137)") {
  Env* e = env();
  if (!e) return;
  KillRun k = kill_one_rank(*e, "kill-code");
  INFO("output:\n" << k.out);
  REQUIRE(k.rc.has_value());
  CHECK(*k.rc == 137);
  CHECK(!line_with(k.out, {"round 0 failed", fmt::format("rank {} ", k.rank), "killed by signal 9"}).empty());
}

TEST_CASE("kill -9 of one rank with max_retries=1: the next round runs and succeeds") {
  Env* e = env();
  if (!e) return;
  std::string run_dir = e->cluster.dir() + "/run-retry";
  Child launcher(bench_argv(*e, e->cluster.dir() + "/hostfile", run_dir,
                            {"-b", "1M", "-e", "1M", "-n", "200", "-w", "1", "--set", "fault_tolerance.max_retries=1",
                             "--set", "fault_tolerance.retry_delay=1"}),
                 kDebug);
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(wait_all_connected(launcher, 6), "the bench did not start:\n" << launcher.output());
  auto victim = find_worker(*e, 2, 10s);
  REQUIRE_MESSAGE(victim.has_value(), "no worker process in node 2");
  ::kill(victim->first, SIGKILL);
  auto rc = launcher.wait(90s);
  std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the launcher did not finish");
  CHECK(*rc == 0);
  CHECK(contains(out, "round 0 failed"));
  CHECK(contains(out, "round 1: starting 6 rank(s)"));
  CHECK(contains(out, "succeeded in round 1"));
  auto rows = table_rows(out);
  REQUIRE(!rows.empty());
  CHECK(rows.back().cols.size() == 13);
  CHECK(rows.back().cols[8] == "0");
  CHECK(rows.back().cols[12] == "0");
  std::string left = wait_no_leftovers(*e, {0, 1, 2}, Clock::now() + 10s);
  CHECK_MESSAGE(left.empty(), "dtrain processes left after the job:\n" << left);
}

TEST_CASE("a node cut off the network: missed heartbeats detected, job torn down, node named") {
  Env* e = env();
  if (!e) return;
  std::string run_dir = e->cluster.dir() + "/run-link";
  Child launcher(
      bench_argv(*e, e->cluster.dir() + "/hostfile", run_dir,
                 {"-b", "16M", "-e", "16M", "-n", "1000", "-w", "1", "--set", "fault_tolerance.max_retries=0", "--set",
                  "fault_tolerance.heartbeat_interval=1", "--set", "fault_tolerance.heartbeat_timeout=4"}),
      kDebug);
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(wait_all_connected(launcher, 6), "the bench did not start:\n" << launcher.output());
  REQUIRE(e->cluster.link(2, false));
  struct LinkBack {
    const Cluster& c;
    ~LinkBack() { c.link(2, true); }
  } link_back{e->cluster};
  auto cut_at = Clock::now();
  auto rc = launcher.wait(45s);
  double detect_s = std::chrono::duration<double>(Clock::now() - cut_at).count();
  std::string out = launcher.output();
  INFO("output:\n" << out);
  REQUIRE_MESSAGE(rc.has_value(), "the launcher did not give up on the cut-off node");
  CHECK(*rc != 0);
  std::string fail_line = line_with(out, {"round 0 failed", "node 2", e->cluster.addr(2), "missed heartbeats"});
  CHECK_MESSAGE(!fail_line.empty(), "no failure line naming node 2 and its missed heartbeats");
  std::string left = wait_no_leftovers(*e, {0, 1}, Clock::now() + 10s);
  CHECK_MESSAGE(left.empty(), "dtrain processes left on the reachable nodes:\n" << left);
  MESSAGE(fmt::format("link down -> launcher exit in {:.2f} s (heartbeat_timeout 4 s)", detect_s));
  // Once reconnected, the cut-off node's agent notices the launcher is gone and stops.
  e->cluster.link(2, true);
  std::string left2 = wait_no_leftovers(*e, {2}, Clock::now() + 30s);
  CHECK_MESSAGE(left2.empty(), "dtrain processes left on the reconnected node:\n" << left2);
}
