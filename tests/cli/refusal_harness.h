// The pieces of the CLI tests that feed the real binary bad input and check it is refused:
// the binary (or a skip), a temporary directory holding the tiny CPU job's config, the
// check that a command was refused at once with exit 2, and an edit of a checkpoint manifest.
#pragma once

#include "cli_harness.h"
#include "skip.h"
#include "tiny_job.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::cli_test {

constexpr int kUsage = 2;  // main.cpp footer: 2 usage/config error

// $DTRAIN_BIN, or "" after marking the test skipped (what: the suite, for the message).
inline std::string bin_or_skip(const std::string& what) {
  std::string b = dtrain_bin();
  if (b.empty()) ::dtrain::test::skip_test(what + " skipped: $DTRAIN_BIN is not set or not executable");
  return b;
}

// A temporary directory with the tiny CPU job's config in it (4 steps, a checkpoint every
// save_steps) and room for a run directory.
struct TinyTmp {
  TempDir dir{"dtrain-tiny"};
  std::string config = dir.path() + "/tiny.yaml";
  std::string run = dir.path() + "/run";
  explicit TinyTmp(int save_steps = 2) { std::ofstream(config) << tiny_cpu_job(save_steps); }
  std::string path(const std::string& name) const { return dir.path() + "/" + name; }
  // A one-host hostfile naming 198.51.100.7 (TEST-NET-2: never contacted).
  std::string unreachable_hostfile() const {
    const std::string p = path("hosts");
    std::ofstream(p) << "198.51.100.7 slots=1\n";
    return p;
  }
  // A FIFO in the directory that nothing writes to (a reader of it would block for ever).
  std::string fifo(const std::string& name) const {
    const std::string p = path(name);
    REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
    return p;
  }
};

// `dtrain launch` or `dtrain doctor` (cmd) of the tiny job on a one-host hostfile naming
// 198.51.100.7 (TEST-NET-2: never contacted, so a check of the SSH settings must come
// before any connection), with one more --set; bounded should the check not come first.
inline RunResult run_unreachable(const std::string& bin, const TinyTmp& t, const std::string& cmd,
                                 const std::string& set) {
  std::vector<std::string> argv = {
      bin,     cmd, "--hostfile", t.unreachable_hostfile(), "--output-dir", t.run,
      "--set", set, "--set",      "doctor.timeout=5",       "--set",        "cluster.ssh.connect_timeout=5"};
  if (cmd == "launch")
    argv.insert(argv.end(), {"--config", t.config, "--master-port", "0", "--set", "fault_tolerance.max_retries=0"});
  return run(argv, {}, 60s);
}

// Exit 2 at once with every needle in the output: never a crash, a hang or a started round.
inline void expect_refused(const RunResult& r, const std::vector<std::string>& needles) {
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == kUsage);
  for (const auto& n : needles) CHECK_MESSAGE(contains(r.out, n), "missing: " << n);
  CHECK(!contains(r.out, "bad_alloc"));
  CHECK(!contains(r.out, "internal error"));
  CHECK(!contains(r.out, "round 0: starting"));
}

// Rewrites the JSON file at path (a checkpoint's manifest.json) with change applied.
inline void edit_manifest(const std::string& path, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json m = nlohmann::json::parse(read_text(path));
  change(m);
  std::ofstream(path, std::ios::trunc) << m.dump();
}

}  // namespace dtrain::cli_test
