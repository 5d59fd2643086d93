// What the `dtrain run` tests over loopback share: torchrun's environment for one rank, a
// free loopback port, and the argv of a `dtrain run` with the test's token and timeouts.
#pragma once

#include "cli_harness.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace dtrain::cli_test {

inline constexpr const char* kExternalToken = "0123456789abcdef0123456789abcdef";

/// The dtrain binary, or the whole test binary skipped (exit 77) naming `suite`.
inline std::string external_bin(const char* suite) {
  if (dtrain_bin().empty()) {
    std::printf("%s skipped: $DTRAIN_BIN is not set or not executable (run through ctest)\n", suite);
    std::fflush(stdout);
    std::exit(77);
  }
  return dtrain_bin();
}

/// torchrun's variables for rank `rank` of `world` on loopback, the token in the environment.
inline std::map<std::string, std::string> torchrun_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"DTRAIN_TEST_TOKEN", kExternalToken}};
}

/// `dtrain run` into run_dir: the token from DTRAIN_TEST_TOKEN, the given join timeout,
/// 1 s heartbeats (5 s timeout), 20 steps; `more` appended.
inline std::vector<std::string> external_run_argv(const std::string& bin, const std::string& run_dir, int join_timeout,
                                                  const std::vector<std::string>& more = {}) {
  std::vector<std::string> argv = {bin,
                                   "run",
                                   "--output-dir",
                                   run_dir,
                                   "--set",
                                   "cluster.rendezvous.token_env=DTRAIN_TEST_TOKEN",
                                   "--set",
                                   fmt::format("cluster.rendezvous.join_timeout={}", join_timeout),
                                   "--set",
                                   "fault_tolerance.heartbeat_interval=1",
                                   "--set",
                                   "fault_tolerance.heartbeat_timeout=5",
                                   "--set",
                                   "training.max_steps=20"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

}  // namespace dtrain::cli_test
