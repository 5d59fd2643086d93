// Skipping a test that cannot run here (no $DTRAIN_BIN, no root/sshd/tc, no node asset...):
// skip_test() prints the reason and records it; the shared doctest main (doctest_main.cpp)
// then ends the binary with exit code 77, which ctest reports as SKIPPED, unless a case
// failed (the failure wins). skip_binary() ends the binary with 77 at once.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace dtrain::test {

inline int& skipped_cases() {
  static int n = 0;
  return n;
}

// The calling case cannot run: say why; the binary will not end PASSED. The caller returns.
inline void skip_test(const std::string& reason) {
  ++skipped_cases();
  std::printf("%s\n", reason.c_str());
  std::fflush(stdout);
}

// Nothing left in this binary can run: end it now as SKIPPED.
[[noreturn]] inline void skip_binary(const std::string& reason) {
  std::printf("%s\n", reason.c_str());
  std::fflush(stdout);
  std::exit(77);
}

}  // namespace dtrain::test
