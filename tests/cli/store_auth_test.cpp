// End-to-end checks of the rendezvous store's exposure through the real binary: on a
// 2-node namespace cluster an attacker in a node's namespace, without the job token,
// cannot set the stop key or read a key and the job finishes; the store listens only on
// the advertised address; and a wrong --master-addr is reported quickly with its reason.
#include "cli_harness.h"

#include "core/error.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store.h"
#include "skip.h"

#include <fmt/format.h>

#include <algorithm>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

using namespace dtrain::cli_test;
namespace rdzv = dtrain::rendezvous;

namespace {

struct Env {
  Cluster cluster{2, 1};
  std::string bin = dtrain_bin();
};

// The cluster for this binary: up on first use, down at exit. nullptr (with a MESSAGE)
// when the tests cannot run here.
Env* env() {
  if (dtrain_bin().empty()) {
    ::dtrain::test::skip_test("store auth CLI tests skipped: $DTRAIN_BIN is not set or not executable");
    return nullptr;
  }
  static std::unique_ptr<Env> instance = std::make_unique<Env>();
  if (!instance->cluster.usable()) {
    ::dtrain::test::skip_test("store auth CLI tests skipped: " + instance->cluster.skip_reason());
    if (instance->cluster.failed()) FAIL("the test cluster could not be started: " << instance->cluster.skip_reason());
    return nullptr;
  }
  return instance.get();
}

std::vector<std::string> bench_argv(const Env& e, const std::string& run_dir, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      e.bin,           "bench", "allreduce",    "--backend", "gloo", "--hostfile", e.cluster.hostfile("hf-2x1", {1, 1}),
      "--master-port", "0",     "--output-dir", run_dir};
  for (auto& s : e.cluster.ssh_sets()) argv.push_back(s);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The TCP address:port the process `pid` listens on, from `ss` in this namespace ("" when none).
std::string listening_address(pid_t pid) {
  for (const auto& line : split_lines(shell("timeout 10 ss -ltnpH 2>/dev/null"))) {
    if (!contains(line, fmt::format("pid={},", pid))) continue;
    std::istringstream in(line);
    std::string state, recvq, sendq, local;
    in >> state >> recvq >> sendq >> local;
    return local;
  }
  return "";
}

// A TCP connection from the calling thread's namespace; -1 when refused or unreachable.
int tcp_connect(const std::string& addr, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` and reads until the server closes (bounded by the 5 s socket timeouts and
// a byte cap). True when the connection ended with EOF/reset, i.e. the server hung up.
bool sent_then_closed(int fd, const std::string& bytes) {
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) return true;
  char buf[4096];
  for (int i = 0; i < 64; ++i) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
  return false;
}

// What the attacker achieved, one line per attempt; run on a thread moved into `ns`.
std::string attack_from(const std::string& ns, const std::string& addr, uint16_t port, const std::string& stop_key) {
  int nsfd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (nsfd < 0) return "cannot open the namespace\n";
  const bool moved = ::setns(nsfd, CLONE_NEWNET) == 0;  // this thread only
  ::close(nsfd);
  if (!moved) return "cannot enter the namespace\n";
  std::string report;
  // With a guessed and with an absent token: refused before any request.
  for (const std::string& token : {rdzv::token_generate(), std::string()}) {
    try {
      rdzv::StoreClient c(addr, port, token, std::chrono::seconds(5));
      c.set(stop_key, "1");
      report += "ACCEPTED a client with a wrong token\n";
    } catch (const dtrain::CommError& e) {
      report += std::string(contains(e.what(), "authentication") ? "refused: " : "OTHER ERROR: ") + e.what() + "\n";
    }
  }
  // Requests without authenticating, and a version-1 HELLO that carried the token itself.
  namespace proto = rdzv::proto;
  const std::vector<std::pair<std::string, std::string>> raw = {
      {"SET stop", proto::Writer().u8(uint8_t(proto::Op::SET)).str(stop_key).str("1").finish()},
      {"GET stop", proto::Writer().u8(uint8_t(proto::Op::GET)).str(stop_key).u64(100).finish()},
      {"v1 HELLO + SET stop", proto::Writer().u8(uint8_t(proto::Op::HELLO)).str("").u32(1).finish() +
                                  proto::Writer().u8(uint8_t(proto::Op::SET)).str(stop_key).str("1").finish()},
  };
  for (const auto& [name, bytes] : raw) {
    int fd = tcp_connect(addr, port);
    if (fd < 0) {
      report += "UNREACHABLE for " + name + "\n";
      continue;
    }
    report += (sent_then_closed(fd, bytes) ? "closed: " : "LEFT OPEN: ") + name + "\n";
    ::close(fd);
  }
  return report;
}

}  // namespace

TEST_CASE("an attacker on a node without the token cannot stop the job; the store listens only where advertised") {
  Env* e = env();
  if (!e) return;
  const std::string run_dir = e->cluster.dir() + "/run-attack";
  Child launcher(bench_argv(*e, run_dir,
                            {"-b", "4M", "-e", "4M", "-n", "400", "-w", "1", "--set", "fault_tolerance.max_retries=0"}),
                 {{"DTRAIN_LOG_LEVEL", "debug"}});
  REQUIRE(launcher.started());
  REQUIRE_MESSAGE(launcher.wait_count(" of 2 connected on", 2, 60s), "the bench did not start:\n" << launcher.output());

  // Where the launcher's store listens: the advertised address only.
  const std::string bound = listening_address(launcher.pid());
  INFO("ss: " << bound);
  const auto colon = bound.rfind(':');
  REQUIRE(colon != std::string::npos);
  CHECK(bound.substr(0, colon) == e->cluster.launcher_addr());
  const uint16_t port = static_cast<uint16_t>(std::stoi(bound.substr(colon + 1)));
  const int loopback = tcp_connect("127.0.0.1", port);
  CHECK_MESSAGE(loopback < 0, "the store also answers on 127.0.0.1");
  if (loopback >= 0) ::close(loopback);

  const std::string launcher_json = read_text(run_dir + "/launcher.json");
  const auto id_at = launcher_json.find("\"job_id\":\"");
  REQUIRE(id_at != std::string::npos);
  const std::string job_id = launcher_json.substr(id_at + 10, launcher_json.find('"', id_at + 10) - id_at - 10);
  const std::string stop_key = rdzv::store_key(job_id, 0, "stop");

  std::string report;
  std::thread attacker([&] { report = attack_from(e->cluster.ns(1), e->cluster.launcher_addr(), port, stop_key); });
  attacker.join();
  const bool still_running = launcher.running();
  auto rc = launcher.wait(120s);
  const std::string out = launcher.output();
  INFO("attacker:\n" << report);
  INFO("output:\n" << out);
  CHECK(still_running);  // the attack happened while the job ran
  CHECK(std::count(report.begin(), report.end(), '\n') == 5);
  CHECK(!contains(report, "ACCEPTED"));
  CHECK(!contains(report, "LEFT OPEN"));
  CHECK(!contains(report, "UNREACHABLE"));
  CHECK(!contains(report, "OTHER ERROR"));
  REQUIRE_MESSAGE(rc.has_value(), "the job did not finish");
  CHECK(*rc == 0);
  CHECK(!contains(out, "round 0 failed"));
  CHECK(contains(out, "refused connection from " + e->cluster.addr(1)));
  MESSAGE("store bound to " << bound << "; attacker in node 1:\n" << report);
}

TEST_CASE("agents that cannot reach the store say why, and the launcher shows it") {
  Env* e = env();
  if (!e) return;
  // 127.0.0.1 is the launcher's loopback, not the nodes': every agent is refused.
  auto r = run(bench_argv(*e, e->cluster.dir() + "/run-unreachable",
                          {"-b", "1K", "-e", "1K", "-n", "1", "--master-addr", "127.0.0.1", "--set",
                           "fault_tolerance.max_retries=0", "--set", "fault_tolerance.heartbeat_timeout=3", "--set",
                           "fault_tolerance.heartbeat_interval=1", "--set", "fault_tolerance.store_connect_timeout=4"}),
               {}, 180s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc != 0);
  std::string fail_line;
  for (const auto& line : split_lines(r.out))
    if (contains(line, "round 0 failed")) fail_line = line;
  INFO("failure line: " << fail_line);
  CHECK(contains(fail_line, "its agent said"));
  CHECK(contains(fail_line, "127.0.0.1:"));
  CHECK(contains(fail_line, "connection refused"));
  // The agent gave up within fault_tolerance.store_connect_timeout (4 s), not its 30 s default.
  const auto at = fail_line.find("retried for ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stol(fail_line.substr(at + 12)) <= 4000);
  MESSAGE(fmt::format("unreachable store reported in {:.1f} s: {}", r.seconds, fail_line));
}

TEST_CASE("an unresolvable --master-addr fails at once, naming the address and the resolver's reason") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) {
    ::dtrain::test::skip_test("skipped: $DTRAIN_BIN is not set");
    return;
  }
  const std::string dir = make_temp_dir("dtrain-badaddr");
  REQUIRE(!dir.empty());
  auto r = run(
      {bin, "bench", "allreduce", "--backend", "gloo", "--nproc-per-node", "1", "--master-addr", "no-such-host.invalid",
       "--master-port", "0", "-b", "1K", "-e", "1K", "-n", "1", "--output-dir", dir + "/run"},
      {}, 30s);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc != 0);
  // "At once": before any node or rank was started (not a timing, which load stretches).
  CHECK(!contains(r.out, "round 0: starting"));
  CHECK(!contains(r.out, "preflight:"));
  CHECK(contains(r.out, "cannot resolve host 'no-such-host.invalid'"));
  // The resolver's own reason, as this machine's resolver words it.
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo("no-such-host.invalid", nullptr, nullptr, &res);
  if (res) ::freeaddrinfo(res);
  REQUIRE(gai != 0);
  CHECK(contains(r.out, ::gai_strerror(gai)));
  MESSAGE(fmt::format("unresolvable --master-addr reported in {:.2f} s", r.seconds));
}
