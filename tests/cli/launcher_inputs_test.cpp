// Launcher inputs and signals through the real binary, on this machine only (no SSH; IPv6
// over ::1, in a fresh network namespace when this one has no IPv6 loopback): IPv6
// hostfile lines and --master-addr, empty --include/--exclude, one machine listed twice,
// run directory paths over NAME_MAX/PATH_MAX, `dtrain status` of a non-run or a corrupt
// run, and SIGHUP/SIGTERM ending a job with a message, a final event and a resumable run.
#include "cli_harness.h"
#include "tiny_job.h"
#include "skip.h"

#include <fmt/format.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <climits>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2, kIo = 3, kInterrupted = 130;

// The tiny CPU job of rundir_safety_test.cpp with one checkpoint per step, so an
// interrupted run always has one to resume from.
std::string config_text() { return tiny_cpu_job(1); }

std::string bin_or_skip() {
  std::string bin = dtrain_bin();
  if (bin.empty())
    ::dtrain::test::skip_test(
        "skipped: $DTRAIN_BIN is not set or not executable (run through ctest after a full build)");
  return bin;
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// True when a TCP socket can bind [::1] here.
bool ipv6_loopback_here() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// argv as it runs with an IPv6 loopback: unchanged when this namespace has one, else in a
// new network namespace with lo up and IPv6 enabled on it (root only). Empty: cannot.
std::vector<std::string> with_ipv6_loopback(const std::vector<std::string>& argv) {
  if (ipv6_loopback_here()) return argv;
  if (::geteuid() != 0 || shell("command -v unshare").empty() || shell("command -v ip").empty()) return {};
  std::vector<std::string> out{
      "/usr/bin/env", "unshare",
      "-n",           "sh",
      "-c",           "ip link set lo up && sysctl -qw net.ipv6.conf.lo.disable_ipv6=0 && exec \"$0\" \"$@\""};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// Processes whose command line mentions `needle` (the run directory of a job: agents and
// ranks carry it in their arguments), other than this test.
std::vector<int> processes_mentioning(const std::string& needle) {
  std::vector<int> pids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::string cmd = read_text(e.path().string() + "/cmdline");
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (contains(cmd, needle)) pids.push_back(pid);
  }
  return pids;
}

}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("--include '' and --exclude '' are usage errors, not 'every host'") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  for (const std::string flag : {"--include", "--exclude"}) {
    CAPTURE(flag);
    for (const std::string cmd : {"launch", "bench"}) {
      CAPTURE(cmd);
      RunResult r = run({bin, cmd, flag, "", "--dry-run"}, {}, 60s);
      INFO(r.out);
      REQUIRE(!r.timed_out);
      CHECK(r.rc == kUsage);
      CHECK(contains(r.out, flag + " is empty"));
      CHECK(!contains(r.out, "world size"));  // no plan was printed
    }
    // Blanks only: an empty node spec, also exit 2.
    RunResult r = run({bin, "launch", flag, " ", "--dry-run"}, {}, 60s);
    INFO(r.out);
    CHECK(r.rc == kUsage);
    CHECK(contains(r.out, "empty node spec"));
  }
}

TEST_CASE("--nnodes: a malformed MIN:MAX or a MIN above the hosts there are is exit 2 saying what to give") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  const struct {
    std::string value, says;
  } cases[] = {{"x", "--nnodes 'x': give MIN:MAX (e.g. 2:4) or N"},
               {"0:2", "--nnodes '0:2': give MIN:MAX"},
               {"2:", "--nnodes '2:': give MIN:MAX"},
               {"3:2", "--nnodes '3:2': MIN 3 is above MAX 2"},
               {"2:3", "elastic.min_nodes (--nnodes MIN) is 2 but the hostfile selects only 1 host(s)"}};
  for (const auto& c : cases) {
    CAPTURE(c.value);
    RunResult r = run({bin, "launch", "--nnodes", c.value, "--dry-run"}, {}, 60s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == kUsage);
    CHECK(contains(r.out, c.says));
  }
  RunResult ok = run({bin, "launch", "--nnodes", "1:1", "--dry-run"}, {}, 60s);
  INFO(ok.out);
  CHECK(ok.rc == 0);
}

TEST_CASE("IPv6: ::1 in the hostfile and as --master-addr runs a local 2-rank job over IPv6") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  TempDir tmp("dtrain-cli-v6");
  REQUIRE(!tmp.path().empty());
  const std::string& dir = tmp.path();

  SUBCASE("bare ::1 hosts and master: the store and Gloo use IPv6") {
    const std::string hf = write_file(dir + "/hf", "::1 slots=2   # IPv6 loopback\n");
    auto argv =
        with_ipv6_loopback({bin, "bench", "allreduce", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--hostfile", hf,
                            "--master-addr", "::1", "--master-port", "0", "--output-dir", dir + "/run"});
    if (argv.empty()) {
      ::dtrain::test::skip_test("skipped: no IPv6 loopback here and no way to make one (needs root, unshare and ip)");
      return;
    }
    RunResult r = run(argv, {{"DTRAIN_LOG_LEVEL", "debug"}}, 90s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(table_rows(r.out).size() == 3);
    CHECK(contains(r.out, "rendezvous [::1]:"));
    // Each rank's Gloo device is on the address towards the master: ::1, not 127.0.0.1.
    CHECK(contains(r.out, "gloo address ::1"));
    CHECK(!contains(r.out, "gloo address 127.0.0.1"));
    CHECK(read_text(dir + "/run/hostfile") == "::1 slots=2\n");
  }
  SUBCASE("[::1] in brackets, in the hostfile and --master-addr; --include [::1]:1") {
    const std::string hf = write_file(dir + "/hf", "[::1] slots=2\n");
    RunResult plan = run({bin, "bench", "allreduce", "--hostfile", hf, "--include", "[::1]:1", "--master-addr", "[::1]",
                          "--master-port", "29511", "--output-dir", dir + "/plan", "--dry-run"},
                         {}, 60s);
    INFO(plan.out);
    REQUIRE(!plan.timed_out);
    CHECK(plan.rc == 0);
    CHECK(contains(plan.out, "master [::1]:29511"));
    CHECK(contains(plan.out, "MASTER_ADDR=::1"));
    CHECK(contains(plan.out, "'--devices' '1'"));
    CHECK(contains(plan.out, "world size 1,"));

    auto argv =
        with_ipv6_loopback({bin, "bench", "allreduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--hostfile", hf,
                            "--master-addr", "[::1]", "--master-port", "0", "--output-dir", dir + "/run"});
    if (argv.empty()) {
      ::dtrain::test::skip_test("skipped the run: no IPv6 loopback here and no way to make one");
      return;
    }
    RunResult r = run(argv, {}, 90s);
    INFO(r.out);
    REQUIRE(!r.timed_out);
    CHECK(r.rc == 0);
    CHECK(table_rows(r.out).size() == 1);
  }
  SUBCASE("a port in --master-addr is a usage error pointing at --master-port") {
    for (const std::string addr : {"[::1]:29500", "127.0.0.1:29500", "[node1]"}) {
      CAPTURE(addr);
      RunResult r = run({bin, "launch", "--master-addr", addr, "--dry-run"}, {}, 60s);
      INFO(r.out);
      CHECK(r.rc == kUsage);
      CHECK(contains(r.out, "--master-addr '"));
      CHECK(contains(r.out, "--master-port"));
    }
  }
  SUBCASE("host:port and a bracketed name are hostfile errors naming the line") {
    for (const std::string line : {"node1:22 slots=1", "[node1] slots=1", "[::1 slots=1", "fe80::1%bad/zone slots=1"}) {
      CAPTURE(line);
      const std::string hf = write_file(dir + "/bad", "localhost slots=1\n" + line + "\n");
      RunResult r = run({bin, "launch", "--hostfile", hf, "--dry-run"}, {}, 60s);
      INFO(r.out);
      CHECK(r.rc == kUsage);
      CHECK(contains(r.out, hf + ":2"));
    }
  }
}

TEST_CASE("one machine listed twice (localhost and 127.0.0.1 or ::1) is refused naming both lines") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  TempDir tmp("dtrain-cli-twice");
  REQUIRE(!tmp.path().empty());
  for (const std::string alias : {"127.0.0.1", "::1", "127.0.1.1"}) {
    CAPTURE(alias);
    const std::string hf = write_file(tmp.path() + "/hf", "# one box\nlocalhost slots=1\n" + alias + " slots=1\n");
    for (const bool dry : {true, false}) {
      std::vector<std::string> argv{bin, "launch", "--hostfile", hf, "--output-dir", tmp.path() + "/run"};
      if (dry) argv.push_back("--dry-run");
      RunResult r = run(argv, {}, 60s);
      INFO(r.out);
      REQUIRE(!r.timed_out);
      CHECK(r.rc == kUsage);
      CHECK(contains(r.out, hf + ":2 (\"localhost\")"));
      CHECK(contains(r.out, hf + ":3 (\"" + alias + "\")"));
      CHECK(contains(r.out, "same machine"));
      CHECK(contains(r.out, "localhost slots=2"));
      CHECK(!fs::exists(tmp.path() + "/run"));
    }
    // Selecting one of the two is fine.
    RunResult one = run({bin, "launch", "--hostfile", hf, "--include", "localhost", "--dry-run"}, {}, 60s);
    INFO(one.out);
    CHECK(one.rc == 0);
    CHECK(contains(one.out, "world size 1,"));
  }
}

TEST_CASE("a run directory path over NAME_MAX or PATH_MAX is exit 2 naming the limit, before anything is created") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  TempDir tmp("dtrain-cli-longdir");
  REQUIRE(!tmp.path().empty());
  const std::string cfg = write_file(tmp.path() + "/tiny.yaml", config_text());

  const std::string long_name = tmp.path() + "/" + std::string(300, 'a') + "/run";
  RunResult r = run({bin, "launch", "--config", cfg, "--output-dir", long_name}, {}, 60s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, "--output-dir"));
  CHECK(contains(r.out, "is 300 bytes long"));
  CHECK(contains(r.out, "NAME_MAX"));
  CHECK(!contains(r.out, "internal error"));

  std::string deep = tmp.path();
  while (deep.size() < PATH_MAX - 50) deep += "/" + std::string(200, 'b');
  RunResult d = run({bin, "launch", "--config", cfg, "--set", "training.output_dir=" + deep}, {}, 60s);
  INFO(d.out);
  REQUIRE(!d.timed_out);
  CHECK(d.rc == kUsage);
  CHECK(contains(d.out, "training.output_dir"));
  CHECK(contains(d.out, "PATH_MAX"));
  CHECK(contains(d.out, fmt::format("the path is {} bytes long", deep.size())));
  CHECK(!contains(d.out, "internal error"));
  // Nothing was created on the way.
  CHECK(!fs::exists(tmp.path() + "/" + std::string(200, 'b')));
}

TEST_CASE("dtrain status: a directory no run wrote is exit 2, corrupt run files are named with their line") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  TempDir tmp("dtrain-cli-status");
  REQUIRE(!tmp.path().empty());
  const std::string dir = tmp.path() + "/run";
  fs::create_directories(dir + "/unrelated");

  RunResult none = run({bin, "status", dir}, {}, 30s);
  INFO(none.out);
  CHECK(none.rc == kUsage);
  CHECK(contains(none.out, "not a dtrain run directory"));
  CHECK(contains(none.out, "events.jsonl"));
  CHECK(!contains(none.out, "not started"));

  // A run that wrote its config but has not started yet is one.
  write_file(dir + "/config.yaml", "training:\n  max_steps: 1\n");
  RunResult fresh = run({bin, "status", dir}, {}, 30s);
  INFO(fresh.out);
  CHECK(fresh.rc == 0);
  CHECK(contains(fresh.out, "not started"));

  // A last line without its newline is a record being written: not corruption.
  write_file(dir + "/events.jsonl", "{\"time_ms\":1,\"event\":\"round_start\",\"round\":0}\n{\"time_ms\":2,\"ev");
  RunResult partial = run({bin, "status", dir}, {}, 30s);
  INFO(partial.out);
  CHECK(partial.rc == 0);

  write_file(
      dir + "/events.jsonl",
      "{\"time_ms\":1,\"event\":\"round_start\",\"round\":0}\nGARBAGE{{\n{\"time_ms\":3,\"event\":\"finished\"}\n");
  RunResult bad_events = run({bin, "status", dir}, {}, 30s);
  INFO(bad_events.out);
  CHECK(bad_events.rc == kIo);
  CHECK(contains(bad_events.out, dir + "/events.jsonl:2"));
  CHECK(contains(bad_events.out, "corrupt"));
  CHECK(contains(bad_events.out, "GARBAGE{{"));

  write_file(dir + "/events.jsonl", "{\"time_ms\":1,\"event\":\"round_start\",\"round\":0}\n");
  write_file(dir + "/launcher.json", "{\"pid\": 12,\n \"host\": ");
  RunResult bad_launcher = run({bin, "status", dir}, {}, 30s);
  INFO(bad_launcher.out);
  CHECK(bad_launcher.rc == kIo);
  CHECK(contains(bad_launcher.out, dir + "/launcher.json:2"));
  CHECK(contains(bad_launcher.out, "corrupt"));

  fs::remove(dir + "/launcher.json");
  write_file(dir + "/nodes.json", "[1, 2]\n");
  RunResult bad_nodes = run({bin, "status", dir}, {}, 30s);
  INFO(bad_nodes.out);
  CHECK(bad_nodes.rc == kIo);
  CHECK(contains(bad_nodes.out, dir + "/nodes.json is corrupt"));
}

TEST_CASE("SIGHUP and SIGTERM stop the launcher like Ctrl-C: message, every node down, final event, resumable") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  for (const int sig : {SIGHUP, SIGTERM}) {
    const std::string name = sig == SIGHUP ? "SIGHUP" : "SIGTERM";
    CAPTURE(name);
    TempDir tmp("dtrain-cli-signal");
    REQUIRE(!tmp.path().empty());
    const std::string cfg = write_file(tmp.path() + "/tiny.yaml", config_text());
    const std::string run_dir = tmp.path() + "/run";
    Child job({bin, "launch", "--config", cfg, "--output-dir", run_dir, "--nproc-per-node", "2", "--master-port", "0",
               "--set", "training.max_steps=100000"});
    REQUIRE(job.started());
    // Two checkpoints written: the ranks are training and there is one to resume from.
    REQUIRE_MESSAGE(job.wait_output("checkpoint: saved checkpoints/step2", 120s), job.output());
    REQUIRE(!processes_mentioning(run_dir).empty());

    ::kill(job.pid(), sig);  // the launcher only, as a closing terminal would
    auto rc = job.wait(60s);
    INFO(job.output());
    REQUIRE(rc.has_value());
    CHECK(*rc == kInterrupted);
    CHECK(contains(job.output(), "interrupted by " + name));
    CHECK(contains(job.output(), "every node stopped"));

    // Every agent and rank is gone (bounded wait: the launcher waited for them already).
    for (int i = 0; i < 100 && !processes_mentioning(run_dir).empty(); ++i) std::this_thread::sleep_for(50ms);
    CHECK(processes_mentioning(run_dir).empty());

    auto lines = split_lines(read_text(run_dir + "/events.jsonl"));
    REQUIRE(!lines.empty());
    CHECK(contains(lines.back(), "\"event\":\"failure\""));
    CHECK(contains(lines.back(), "\"node\":null"));
    CHECK(contains(lines.back(), "\"interrupted\":true"));
    CHECK(contains(lines.back(), name));

    RunResult st = run({bin, "status", run_dir}, {}, 30s);
    INFO(st.out);
    CHECK(st.rc == 0);
    CHECK(contains(st.out, "state      interrupted"));
    CHECK(contains(st.out, "dtrain resume " + run_dir));

    if (sig == SIGHUP) {
      std::string latest = read_text(run_dir + "/checkpoints/latest");
      REQUIRE(latest.rfind("step", 0) == 0);
      const long step = std::stol(latest.substr(4));
      RunResult again =
          run({bin, "resume", run_dir, "--set", fmt::format("training.max_steps={}", step + 2), "--master-port", "0"},
              {}, 120s);
      INFO(again.out);
      REQUIRE(!again.timed_out);
      CHECK(again.rc == 0);
      CHECK(contains(again.out, fmt::format("resumed from step {}", step)));
    }
  }
}
