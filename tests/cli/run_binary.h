// Runs the dtrain binary (DTRAIN_BIN) as a subprocess with a time limit and captures
// its combined output and exit code, for tests that go through the real CLI.
#pragma once

#include <doctest/doctest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include "skip.h"

namespace dtrain::test {

struct RunResult {
  int code = -1;
  std::string out;
};

inline std::string shq(const std::string& s) {
  std::string r = "'";
  for (char c : s) {
    if (c == '\'') r += "'\\''";
    else r += c;
  }
  return r + "'";
}

inline const char* dtrain_bin() {
  const char* b = std::getenv("DTRAIN_BIN");
  return b && *b ? b : nullptr;
}

// True when $DTRAIN_BIN is set; otherwise says the CLI tests are skipped.
inline bool have_bin() {
  if (dtrain_bin()) return true;
  ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping CLI tests");
  return false;
}
inline bool has(const std::string& out, const std::string& needle) { return out.find(needle) != std::string::npos; }

// args are passed through sh with single quotes; cwd is the test's (repo root).
inline RunResult run_dtrain(const std::string& args, int timeout_s = 60, const std::string& env = "") {
  RunResult r;
  const char* bin = dtrain_bin();
  if (!bin) return r;
  std::string cmd = env + " timeout -k 5 " + std::to_string(timeout_s) + " " + shq(bin) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace dtrain::test
