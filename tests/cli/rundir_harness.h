// The run-directory tests' pieces (rundir_lock_test, rundir_adopt_test): a scratch directory
// with the tiny CPU job's config and a job token, the environment of a lone `dtrain run`
// rank 0, a live launch holding a run directory, and the check that a second launcher was
// refused by the run directory's lock.
#pragma once

#include "cli_harness.h"
#include "external_harness.h"
#include "tiny_job.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace dtrain::cli_test {

struct RunDirScratch {
  TempDir tmp;
  std::string config = tmp.path() + "/tiny.yaml";  // 4 steps, a checkpoint every 2
  std::string token = tmp.path() + "/token";       // for `dtrain run`'s rendezvous
  std::string run_dir = tmp.path() + "/run";
  explicit RunDirScratch(const std::string& stem) : tmp(stem) {
    std::ofstream(config) << tiny_cpu_job(2);
    std::ofstream(token) << "rundir-test-token-0123456789abcdef\n";
    ::chmod(token.c_str(), 0600);
  }
  // An empty directory dtrain did not create, mode 1777 (a shared scratch directory).
  std::string shared_1777() const {
    const std::string shared = tmp.path() + "/shared";
    std::filesystem::create_directories(shared);
    REQUIRE(::chmod(shared.c_str(), 01777) == 0);
    return shared;
  }
};

// A lone `dtrain run` rank 0 (WORLD_SIZE 1) on a free loopback port (the kernel's pick).
inline std::map<std::string, std::string> lone_rank_env() {
  return {{"RANK", "0"},
          {"WORLD_SIZE", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(free_port())}};
}

// A local launch that trains on run_dir until killed (no checkpoints), once its round 0 started.
struct LiveLaunch : Child {
  LiveLaunch(const std::string& bin, const std::string& config, const std::string& run_dir)
      : Child({bin, "launch", "--config", config, "--output-dir", run_dir, "--master-port", "0", "--set",
               "training.max_steps=100000", "--set", "training.save_steps=0"}) {
    REQUIRE(started());
    REQUIRE_MESSAGE(wait_output("round 0:", 60s), output());
  }
};

// Refused at once (exit 2) because another launcher holds the run directory, naming the
// holder's pid.
inline void expect_lock_refused(const RunResult& r, pid_t holder) {
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 2);
  CHECK(contains(r.out, "is in use by another dtrain launcher"));
  CHECK(contains(r.out, fmt::format("pid {} on host ", holder)));
}

// A run into an empty 1777 directory dtrain did not create (RunDirScratch::shared_1777)
// finished and adopted it: its mode left as it was, its marker saying so, its files private.
inline void expect_adopted(const RunResult& r, const std::string& shared) {
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(mode_of(shared) == 01777);
  CHECK(contains(r.out, "dtrain did not create it, so it leaves its mode as it is"));
  CHECK(contains(read_text(shared + "/.dtrain-run"), "\"created\":false"));
  CHECK(mode_of(shared + "/config.yaml") == 0600);
}

}  // namespace dtrain::cli_test
