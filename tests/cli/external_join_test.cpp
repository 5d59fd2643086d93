// `dtrain run` at join, through the binary on loopback (and, for two rank 0s on two
// nodes, the namespace cluster): a rank that never joins ends the job at
// cluster.rendezvous.join_timeout naming it (not after a hard-coded 300 s); a rank
// started twice is refused naming both processes; processes with different configs stop
// at join naming the keys (never a Gloo abort), with the failure in events.jsonl; the
// launcher environment is validated (overflowing Slurm counts, GROUP_RANK past the node
// count, two launchers that disagree, --nproc-per-node past 1024, a token file others can
// read); a loopback store address with ranks on other nodes is said up front.
#include "cli_harness.h"
#include "external_harness.h"
#include "run_readers.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

using namespace dtrain::cli_test;

namespace {

constexpr const char* kToken = kExternalToken;

std::string bin() { return external_bin("dtrain run join tests"); }

std::vector<std::string> run_argv(const std::string& run_dir, const std::vector<std::string>& more = {}) {
  return external_run_argv(bin(), run_dir, 3, more);
}

std::string host_name_of_test() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::vector<std::string> failure_whys(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const auto& line : split_lines(read_text(run_dir + "/events.jsonl")))
    if (contains(line, "\"event\":\"failure\"")) out.push_back(line);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Item 9: every wait ends at the configured timeouts, naming who is missing.

TEST_CASE("dtrain run: a lone rank 0 of WORLD_SIZE=2 or 4 ends at join_timeout naming the ranks that never joined") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    TempDir dir("dtrain-join");
    const int port = free_port();
    auto r = run(run_argv(dir.path() + "/run"), torchrun_env(0, world, port), 60s);
    INFO("output:\n" << r.out);
    // Before: rank 0 sat in a 300 s GET holding the client its watch needed.
    REQUIRE_MESSAGE(!r.timed_out, "rank 0 did not end within 60 s (join_timeout is 3 s)");
    CHECK(r.rc == 5);
    const std::string missing = world == 2 ? "rank(s) 1 did not join" : "rank(s) 1, 2, 3 did not join";
    CHECK(contains(r.out, missing + " within cluster.rendezvous.join_timeout (3 s)"));
    const auto fails = failure_whys(dir.path() + "/run");
    REQUIRE(fails.size() == 1);
    CHECK(contains(fails[0], missing));
    MESSAGE(
        fmt::format("lone rank 0 of WORLD_SIZE={}: exit {} after {:.1f} s (join_timeout 3 s)", world, r.rc, r.seconds));
  }
}

TEST_CASE("dtrain run: a rank whose rank 0 never comes ends at join_timeout naming the store") {
  TempDir dir("dtrain-join");
  auto r = run(run_argv(dir.path() + "/run"), torchrun_env(1, 2, free_port()), 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 5);
  CHECK(contains(r.out, "within cluster.rendezvous.join_timeout"));
  MESSAGE(fmt::format("rank 1 without a rank 0: exit {} after {:.1f} s (join_timeout 3 s)", r.rc, r.seconds));
}

// ---------------------------------------------------------------------------
// Item 17 (and the third hang of item 9): the launcher's environment is checked.

TEST_CASE("dtrain run: RANK and OMPI_COMM_WORLD_RANK that disagree are refused at once, naming both") {
  TempDir dir("dtrain-join");
  auto env = torchrun_env(0, 2, free_port());
  env["OMPI_COMM_WORLD_RANK"] = "1";
  env["OMPI_COMM_WORLD_SIZE"] = "2";
  auto r = run(run_argv(dir.path() + "/run"), env, 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "RANK=0 WORLD_SIZE=2"));
  CHECK(contains(r.out, "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2"));
  CHECK(!std::filesystem::exists(dir.path() + "/run"));  // refused before anything was written
  MESSAGE(fmt::format("RANK=0 with OMPI_COMM_WORLD_RANK=1: exit {} after {:.1f} s", r.rc, r.seconds));

  // mpirun starting one torchrun per node is not a conflict: its rank is the node index.
  auto nested = torchrun_env(3, 4, free_port());
  nested["LOCAL_WORLD_SIZE"] = "2";
  nested["LOCAL_RANK"] = "1";
  nested["GROUP_RANK"] = "1";
  nested["OMPI_COMM_WORLD_RANK"] = "1";
  nested["OMPI_COMM_WORLD_SIZE"] = "2";
  auto n = run(run_argv(dir.path() + "/nested", {"--set", "cluster.rendezvous.join_timeout=1"}), nested, 60s);
  INFO("nested output:\n" << n.out);
  CHECK(contains(n.out, "dtrain run: rank 3 of 4"));
  CHECK(!contains(n.out, "disagree"));
}

TEST_CASE("dtrain run: overflowing or impossible launcher variables are usage errors naming the variable") {
  TempDir dir("dtrain-join");
  SUBCASE("SLURM_TASKS_PER_NODE='99999999999(x2)'") {
    auto r = run(run_argv(dir.path() + "/run"),
                 {{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"},
                  {"SLURM_NNODES", "2"},
                  {"SLURM_NODEID", "0"},
                  {"SLURM_TASKS_PER_NODE", "99999999999(x2)"},
                  {"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", std::to_string(free_port())},
                  {"DTRAIN_TEST_TOKEN", kToken}},
                 60s);
    INFO("output:\n" << r.out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, "SLURM_TASKS_PER_NODE='99999999999(x2)'"));
    CHECK(!contains(r.out, "1215752191"));
  }
  SUBCASE("GROUP_RANK=99999 with WORLD_SIZE=1") {
    auto env = torchrun_env(0, 1, free_port());
    env["GROUP_RANK"] = "99999";
    auto r = run(run_argv(dir.path() + "/run"), env, 60s);
    INFO("output:\n" << r.out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, "GROUP_RANK='99999' must be an integer in [0, 0]"));
  }
  SUBCASE("--nproc-per-node 100000 (dtrain launch caps ranks per host at 1024)") {
    auto r = run({bin(), "run", "--nproc-per-node", "100000"}, torchrun_env(0, 1, free_port()), 60s);
    INFO("output:\n" << r.out);
    CHECK(r.rc == 2);
    CHECK(contains(r.out, "--nproc-per-node must be from 1 to 1024"));
  }
}

TEST_CASE("dtrain run: a token file that others can read gets a warning naming it and the fix") {
  TempDir dir("dtrain-join");
  const std::string token_file = dir.path() + "/token";
  std::ofstream(token_file) << kToken << "\n";
  for (mode_t mode : {0644, 0640, 0600}) {
    CAPTURE(mode);
    ::chmod(token_file.c_str(), mode);
    auto r = run({bin(), "run", "--output-dir", dir.path() + "/run", "--set",
                  "cluster.rendezvous.token_file=" + token_file, "--set", "cluster.rendezvous.join_timeout=1"},
                 torchrun_env(1, 2, free_port()), 60s);
    INFO("output:\n" << r.out);
    REQUIRE(!r.timed_out);
    if (mode == 0600) {
      CHECK(!contains(r.out, "is readable by"));
    } else {
      CHECK(contains(r.out, fmt::format("token_file {} is readable by {} (mode {:04o})", token_file,
                                        mode == 0644 ? "every user" : "its group", mode)));
      CHECK(contains(r.out, "chmod 600"));
    }
  }
}

// ---------------------------------------------------------------------------
// Item 19: a loopback store address with ranks on other nodes is said before any wait.

TEST_CASE("a loopback --master-addr with remote hosts is warned about before anything starts") {
  TempDir dir("dtrain-join");
  const std::string hostfile = dir.path() + "/hostfile";
  std::ofstream(hostfile) << "192.0.2.10 slots=1\n192.0.2.11 slots=1\n";  // TEST-NET-1: never this machine
  auto r = run({bin(), "launch", "--hostfile", hostfile, "--master-addr", "127.0.0.1", "--dry-run", "--output-dir",
                dir.path() + "/run"},
               {}, 60s);
  INFO("output:\n" << r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out,
                 "--master-addr '127.0.0.1' is a loopback address, but 192.0.2.10, 192.0.2.11 are not this "
                 "machine"));
  // Local hosts only: nothing to say.
  auto local = run({bin(), "launch", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--dry-run", "--output-dir",
                    dir.path() + "/run2"},
                   {}, 60s);
  CHECK(!contains(local.out, "is a loopback address"));

  // dtrain run: a process on node 1 of 2 told to dial 127.0.0.1.
  auto run_r = run(run_argv(dir.path() + "/run3", {"--set", "cluster.rendezvous.join_timeout=1"}),
                   torchrun_env(1, 2, free_port()), 60s);
  INFO("dtrain run output:\n" << run_r.out);
  CHECK(contains(run_r.out,
                 "the store address 127.0.0.1 is a loopback address, but torchrun places this job's "
                 "ranks on 2 nodes"));
}

// ---------------------------------------------------------------------------
// Item 10: one rank, two processes.

TEST_CASE("dtrain run: a second process with RANK=1 is refused naming both; the job ends at once") {
  TempDir dir("dtrain-join");
  const std::string run_dir = dir.path() + "/run";
  const int port = free_port();
  Child rank0(run_argv(run_dir, {"--set", "cluster.rendezvous.join_timeout=30"}), torchrun_env(0, 3, port));
  REQUIRE(rank0.wait_output("dtrain run: rank 0 of 3", 30s));
  Child first(run_argv(run_dir, {"--set", "cluster.rendezvous.join_timeout=30"}), torchrun_env(1, 3, port));
  REQUIRE(first.wait_output("dtrain run: rank 1 joined the job's store", 30s));
  Child second(run_argv(run_dir, {"--set", "cluster.rendezvous.join_timeout=30"}), torchrun_env(1, 3, port));
  auto rc2 = second.wait(30s);
  INFO("second rank 1:\n" << second.output());
  INFO("first rank 1:\n" << first.output());
  INFO("rank 0:\n" << rank0.output());
  REQUIRE_MESSAGE(rc2.has_value(), "the second rank 1 did not end within 30 s");
  CHECK(*rc2 == 2);
  const std::string want = fmt::format("rank 1 was started twice: by {} (pid {}) and again by {} (pid {})",
                                       host_name_of_test(), first.pid(), host_name_of_test(), second.pid());
  CHECK(contains(second.output(), want));
  // The others stop on it (join_timeout is 30 s: they do not wait for it).
  auto rc0 = rank0.wait(20s), rc1 = first.wait(20s);
  REQUIRE(rc0.has_value());
  REQUIRE(rc1.has_value());
  CHECK(*rc0 != 0);
  CHECK(*rc1 != 0);
  CHECK(contains(rank0.output(), "the job stops: " + want));
  const auto fails = failure_whys(run_dir);
  REQUIRE(fails.size() == 1);
  CHECK(contains(fails[0], "rank 1 was started twice"));
  MESSAGE(
      fmt::format("duplicate RANK=1: refused in {:.1f} s; rank 0 and the first rank 1 ended {:.1f} s after "
                  "the start of rank 0",
                  second.seconds(), rank0.seconds()));
}

// ---------------------------------------------------------------------------
// Item 8: one config per set.

TEST_CASE("dtrain run: processes with different configs stop at join naming the keys; the failure is recorded") {
  struct Case {
    std::vector<std::string> sets0, sets1;
    std::string key;
  };
  for (const Case& c : {Case{{"--set", "training.max_steps=40"},
                             {"--set", "training.max_steps=20"},
                             "training.max_steps (rank 0: 40, rank 1: 20)"},
                        Case{{}, {"--set", "model.d_model=64"}, "model.d_model (rank 0: 128, rank 1: 64)"}}) {
    CAPTURE(c.key);
    TempDir dir("dtrain-join");
    const std::string run_dir = dir.path() + "/run";
    const int port = free_port();
    Child rank0(run_argv(run_dir, c.sets0), torchrun_env(0, 2, port));
    Child rank1(run_argv(run_dir, c.sets1), torchrun_env(1, 2, port));
    auto rc1 = rank1.wait(60s);
    auto rc0 = rank0.wait(30s);
    INFO("rank 0:\n" << rank0.output());
    INFO("rank 1:\n" << rank1.output());
    REQUIRE(rc1.has_value());
    REQUIRE(rc0.has_value());
    // Before: rank 1 trained on and rank 0 aborted in Gloo (exit 134) with no event.
    CHECK(*rc1 == 2);
    CHECK(contains(rank1.output(), "this process's config differs from rank 0's"));
    CHECK(contains(rank1.output(), c.key));
    CHECK(*rc0 != 0);
    CHECK(*rc0 < 128);  // an exit, not a signal
    CHECK(!contains(rank0.output() + rank1.output(), "EnforceNotMet"));
    const auto fails = failure_whys(run_dir);
    REQUIRE(fails.size() == 1);
    CHECK(contains(fails[0], "config differs from rank 0's"));
    MESSAGE(fmt::format("{}: rank 1 exit {} after {:.1f} s, rank 0 exit {}", c.key, *rc1, rank1.seconds(), *rc0));
  }
}
