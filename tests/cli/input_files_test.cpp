// Input files dtrain reads on the user's word, through the real binary (issue 33, items 6
// and 11, what their first fixes left): a cluster.ssh.known_hosts that is /dev/zero, a FIFO
// or a directory is refused before any connection (it hung the SSH session, as the
// identity file did), and every field of a checkpoint manifest is typed, the tensors of
// each buffer included, so a damaged one is skipped for the previous complete checkpoint.
#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <functional>

using namespace dtrain::cli_test;
namespace fs = std::filesystem;

namespace {

constexpr int kUsage = 2;  // main.cpp footer: 2 usage/config error

std::string bin_or_skip() {
  std::string b = dtrain_bin();
  if (b.empty()) ::dtrain::test::skip_test("input file tests skipped: $DTRAIN_BIN is not set or not executable");
  return b;
}

struct Tmp {
  TempDir dir{"dtrain-inputs"};
  std::string config = dir.path() + "/tiny.yaml";
  Tmp() { std::ofstream(config) << tiny_cpu_job(2); }
  std::string path(const std::string& name) const { return dir.path() + "/" + name; }
};

void edit_manifest(const std::string& path, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json m = nlohmann::json::parse(read_text(path));
  change(m);
  std::ofstream(path, std::ios::trunc) << m.dump();
}

}  // namespace

// ---------------------------------------------------------------------------
// Item 11: the known_hosts file

TEST_CASE("a known_hosts file that is /dev/zero, a FIFO or a directory fails launch and doctor before any connection") {
  const std::string bin = bin_or_skip();
  if (bin.empty()) return;
  Tmp t;
  // TEST-NET-2: the check comes before any connection to it.
  std::ofstream(t.path("hosts")) << "198.51.100.7 slots=1\n";
  const std::string fifo = t.path("known.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directory(t.path("known.dir"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/dev/zero", "is not a regular file (a character device)"},
      {fifo, "is not a regular file (a FIFO)"},
      {t.path("known.dir"), "is a directory"},
  };
  for (const auto& [file, why] : cases) {
    for (const std::string cmd : {"launch", "doctor"}) {
      CAPTURE(file);
      CAPTURE(cmd);
      std::vector<std::string> argv = {bin, cmd, "--hostfile", t.path("hosts"), "--output-dir", t.path("run"),
                                       "--set", "cluster.ssh.known_hosts=" + file, "--set", "doctor.timeout=5",
                                       "--set", "cluster.ssh.connect_timeout=5"};
      if (cmd == "launch")
        argv.insert(argv.end(), {"--config", t.config, "--master-port", "0", "--set", "fault_tolerance.max_retries=0"});
      auto r = run(argv, {}, 60s);
      INFO("output:\n" << r.out);
      REQUIRE(!r.timed_out);  // before: the session read /dev/zero until memory ran out, a FIFO forever
      CHECK(r.rc == kUsage);
      CHECK(contains(r.out, "cluster.ssh.known_hosts: " + file + " " + why));
      CHECK(!contains(r.out, "bad_alloc"));
      CHECK(!contains(r.out, "round 0: starting"));
    }
  }
  // A known_hosts that does not exist yet is still fine (accept-new creates it): the job
  // gets past validation to the connection, which fails on its own terms.
  auto r = run({bin, "launch", "--dry-run", "--hostfile", t.path("hosts"), "--config", t.config, "--output-dir",
                t.path("run"), "--set", "cluster.ssh.known_hosts=" + t.path("absent/known_hosts")},
               {}, 60s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(!contains(r.out, "cluster.ssh.known_hosts"));
}
