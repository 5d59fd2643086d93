// `dtrain run` and `dtrain launch` at join, through the binary on loopback: the second
// probe's cases that external_join_test does not cover. SIGTERM / SIGINT to a
// --nproc-per-node process stops its local ranks (they run in process groups of their
// own); a lone rank ends at once on SIGTERM; RANK and OMPI_COMM_WORLD_RANK both set (and
// equal) with no second process ends at join_timeout; a second rank 0 on the same host
// (its store's port taken by the first) is refused naming both processes and stops the
// set; an outsider's flood of idle connections to rank 0's store gives a few lines and a
// summary; a --master-addr that is another machine's IP is refused before anything starts,
// and one that is a name of another machine fails at the store naming the cause.
#include "cli_harness.h"
#include "external_harness.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <csignal>
#include <regex>

using namespace dtrain::cli_test;

namespace {

constexpr const char* kToken = kExternalToken;

std::string bin() { return external_bin("join probe tests"); }

std::vector<std::string> run_argv(const std::string& run_dir, int join_timeout,
                                  const std::vector<std::string>& more = {}) {
  return external_run_argv(bin(), run_dir, join_timeout, more);
}

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// The pids the local ranks printed ("[rankR] ... joined the job's store at ... (pid N)").
std::vector<pid_t> joined_pids(const std::string& out) {
  std::vector<pid_t> pids;
  static const std::regex re(R"(joined the job's store at \S+ as \S+ \(pid (\d+)\))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1].str())));
  return pids;
}

// A process that still runs (a zombie waiting for its reaper does not).
bool alive(pid_t pid) {
  const std::string stat = read_text(fmt::format("/proc/{}/stat", pid));
  if (stat.empty()) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

int connect_idle(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

// ---------------------------------------------------------------------------
// Item 9: every wait ends on a signal, not only at its timeout.

TEST_CASE("dtrain run --nproc-per-node: SIGTERM or SIGINT stops the node's local ranks with it") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    TempDir dir("dtrain-join-probe");
    // Node 0 of 2, two local ranks: they join and wait for node 1's ranks (join_timeout 60 s).
    Child node(run_argv(dir.path() + "/run", 60, {"--nproc-per-node", "2"}), torchrun_env(0, 2, free_port()));
    REQUIRE(node.wait_count("joined the job's store", 2, 60s));
    const std::vector<pid_t> ranks = joined_pids(node.output());
    REQUIRE(ranks.size() == 2);
    const auto sent = std::chrono::steady_clock::now();
    ::kill(node.pid(), sig);
    auto rc = node.wait(30s);
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    INFO("output:\n" << node.output());
    REQUIRE_MESSAGE(rc.has_value(), "the node process did not end within 30 s of the signal");
    CHECK(*rc == 128 + sig);
    // Before: the node process died at once and its ranks sat in the join until
    // join_timeout (a scheduler's SIGTERM or Ctrl-C left them running).
    for (int i = 0; i < 100 && (alive(ranks[0]) || alive(ranks[1])); ++i) std::this_thread::sleep_for(100ms);
    for (pid_t pid : ranks) {
      CHECK_MESSAGE(!alive(pid), "local rank pid " << pid << " still runs after its node process ended");
      if (alive(pid)) ::kill(pid, SIGKILL);
    }
    CHECK(contains(node.output(),
                   fmt::format("dtrain run: node 0 got {}: stopping its 2 local rank(s)", ::strsignal(sig))));
    MESSAGE(
        fmt::format("--nproc-per-node 2, {} during the join (join_timeout 60 s): node exit {} {:.2f} s after "
                    "the signal, its ranks gone",
                    ::strsignal(sig), *rc, after));
  }
}

TEST_CASE("dtrain run: a lone rank 0 waiting for its peers ends at once on SIGTERM") {
  TempDir dir("dtrain-join-probe");
  Child rank0(run_argv(dir.path() + "/run", 300), torchrun_env(0, 2, free_port()));
  REQUIRE(rank0.wait_output("dtrain run: rank 0 joined the job's store", 60s));
  const auto sent = std::chrono::steady_clock::now();
  ::kill(rank0.pid(), SIGTERM);
  auto rc = rank0.wait(30s);
  INFO("output:\n" << rank0.output());
  REQUIRE_MESSAGE(rc.has_value(), "rank 0 did not end within 30 s of SIGTERM (join_timeout is 300 s)");
  CHECK(*rc == 128 + SIGTERM);
  MESSAGE(fmt::format("lone rank 0 (join_timeout 300 s), SIGTERM during the join: exit {} {:.2f} s after the signal",
                      *rc, std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count()));
}

TEST_CASE("dtrain run: RANK and OMPI_COMM_WORLD_RANK both set (equal) and no second process: ends at join_timeout") {
  TempDir dir("dtrain-join-probe");
  auto env = torchrun_env(0, 2, free_port());
  env["OMPI_COMM_WORLD_RANK"] = "0";
  env["OMPI_COMM_WORLD_SIZE"] = "2";
  auto r = run(run_argv(dir.path() + "/run", 3), env, 60s);
  INFO("output:\n" << r.out);
  REQUIRE_MESSAGE(!r.timed_out, "rank 0 did not end within 60 s (join_timeout is 3 s)");
  CHECK(r.rc == 5);
  CHECK(contains(r.out, "rank(s) 1 did not join within cluster.rendezvous.join_timeout (3 s)"));
  MESSAGE(fmt::format("RANK=0 and OMPI_COMM_WORLD_RANK=0, no rank 1: exit {} after {:.1f} s (join_timeout 3 s)", r.rc,
                      r.seconds));
}

// ---------------------------------------------------------------------------
// Item 10: two processes with RANK=0 on one host.

TEST_CASE("dtrain run: a second rank 0 on the same host is refused naming both processes; the set stops") {
  TempDir dir("dtrain-join-probe");
  const std::string run_dir = dir.path() + "/run";
  const int port = free_port();
  Child first(run_argv(run_dir, 60), torchrun_env(0, 2, port));
  REQUIRE(first.wait_output("dtrain run: rank 0 joined the job's store", 60s));
  Child second(run_argv(run_dir, 60), torchrun_env(0, 2, port));
  auto rc2 = second.wait(30s);
  INFO("second rank 0:\n" << second.output());
  INFO("first rank 0:\n" << first.output());
  REQUIRE_MESSAGE(rc2.has_value(), "the second rank 0 did not end within 30 s");
  // Before: exit 5, "port ... is in use", naming neither process; the first waited on
  // until join_timeout.
  CHECK(*rc2 == 2);
  const std::string want = fmt::format("rank 0 was started twice: by {} (pid {}) and again by {} (pid {})", this_host(),
                                       first.pid(), this_host(), second.pid());
  CHECK(contains(second.output(), want));
  auto rc1 = first.wait(20s);
  REQUIRE_MESSAGE(rc1.has_value(), "the first rank 0 did not stop within 20 s of the refusal (join_timeout 60 s)");
  CHECK(*rc1 == 5);
  CHECK(contains(first.output(), "the job stops: " + want));
  int starts = 0, fails = 0;
  const std::string events = read_text(run_dir + "/events.jsonl");
  INFO("events.jsonl:\n" << events);
  for (const auto& line : split_lines(events)) {
    starts += contains(line, "\"event\":\"round_start\"");
    fails += contains(line, "\"event\":\"failure\"");
    CHECK(!contains(line, "killed or lost"));
  }
  CHECK(starts == 1);
  CHECK(fails == 1);
  MESSAGE(fmt::format("second rank 0 on one host: exit {} after {:.1f} s; the first: exit {} after {:.1f} s", *rc2,
                      second.seconds(), *rc1, first.seconds()));
}

// ---------------------------------------------------------------------------
// Item 18: an outsider's idle connections to rank 0's store.

TEST_CASE("dtrain run: 300 idle connections to rank 0's store give a few warning lines and a summary") {
  TempDir dir("dtrain-join-probe");
  const int port = free_port();
  // Rank 0 of 2 waits 25 s for rank 1: the store closes the idle connections at its 10 s
  // hello timeout and writes its summary at the 20 s mark of its warning interval.
  Child rank0(run_argv(dir.path() + "/run", 25), torchrun_env(0, 2, port));
  REQUIRE(rank0.wait_output("dtrain run: rank 0 joined the job's store", 60s));
  constexpr int kConns = 300;
  std::vector<int> fds;
  for (int i = 0; i < kConns; ++i)
    if (const int fd = connect_idle(port); fd >= 0) fds.push_back(fd);
  auto rc = rank0.wait(90s);
  for (int fd : fds) ::close(fd);
  const std::string out = rank0.output();
  INFO("rank 0 output:\n" << out.substr(0, 20000));
  REQUIRE(fds.size() == static_cast<size_t>(kConns));
  REQUIRE_MESSAGE(rc.has_value(), "rank 0 did not end within 90 s (join_timeout 25 s)");
  const size_t closed = count(out, "closing connection from 127.0.0.1");
  // Before the rate limit: one line per connection.
  CHECK(closed >= 1);
  CHECK(closed <= 5);
  CHECK(count(out, "more such connection warning(s)") >= 1);
  CHECK(contains(out, "not authenticated within the hello timeout"));
  MESSAGE(
      fmt::format("{} idle connections to rank 0's store: {} connection line(s) and {} summary line(s), {} lines "
                  "of output in all",
                  kConns, closed, count(out, "more such connection warning(s)"), split_lines(out).size()));
}

// ---------------------------------------------------------------------------
// Item 19: a store address that this machine cannot listen on.

TEST_CASE("dtrain launch: a --master-addr that is another machine's IP is refused before anything starts") {
  TempDir dir("dtrain-join-probe");
  // TEST-NET-1 (192.0.2.0/24) is never this machine's.
  for (bool dry : {true, false}) {
    CAPTURE(dry);
    std::vector<std::string> argv = {
        bin(),           "launch",     "--nproc-per-node", "1",
        "--master-addr", "192.0.2.10", "--output-dir",     dir.path() + (dry ? "/dry" : "/run")};
    if (dry) argv.push_back("--dry-run");
    auto r = run(argv, {}, 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    // Before: --dry-run printed the plan (exit 0); the launch failed only when the store
    // could not listen there ("pick another port or free this one").
    CHECK(r.rc == 2);
    CHECK(
        contains(r.out, fmt::format("--master-addr '192.0.2.10' is not an address of this machine ({})", this_host())));
    CHECK(!std::filesystem::exists(dir.path() + "/run"));
  }
  // This machine's own addresses are fine.
  auto ok = run({bin(), "launch", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--dry-run", "--output-dir",
                 dir.path() + "/ok"},
                {}, 60s);
  INFO("output:\n" << ok.out);
  CHECK(ok.rc == 0);
  CHECK(!contains(ok.out, "is not an address of this machine"));
}

TEST_CASE(
    "dtrain launch: a --master-addr name of another machine fails at the store saying so, not 'pick another port'") {
  if (::geteuid() != 0) {
    MESSAGE("not root: no mount namespace for a private /etc/hosts; case not run");
    return;
  }
  TempDir dir("dtrain-join-probe");
  // A name that resolves to TEST-NET-1 only inside this command's mount namespace.
  const std::string hosts = dir.path() + "/hosts";
  std::ofstream(hosts) << read_text("/etc/hosts") << "\n192.0.2.20 faraway.test\n";
  const std::string cmd = fmt::format(
      "mount --bind {} /etc/hosts || exit 99; exec {} launch --nproc-per-node 1 --master-addr faraway.test "
      "--output-dir {}",
      shq(hosts), shq(bin()), shq(dir.path() + "/run"));
  auto r = run({"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c", cmd}, {}, 120s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  REQUIRE_MESSAGE(r.rc != 99, "could not bind-mount a private /etc/hosts");
  // Before: "Cannot assign requested address (pick another port or free this one)".
  CHECK(r.rc == 5);
  CHECK(contains(r.out, "rendezvous store cannot listen on 192.0.2.20:"));
  CHECK(contains(r.out, "that address is not this machine's"));
  CHECK(!contains(r.out, "pick another port"));
  MESSAGE(fmt::format("--master-addr faraway.test (192.0.2.20): exit {} after {:.1f} s", r.rc, r.seconds));
}
