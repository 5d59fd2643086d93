// The one doctest main shared by every test binary. A case that called
// dtrain::test::skip_test() (tests/skip.h) turns a passing run into exit code 77, which
// ctest reports as SKIPPED; failures keep doctest's non-zero code.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "skip.h"

#include <cstdio>

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || rc != 0) return rc;
  if (const int n = dtrain::test::skipped_cases(); n > 0) {
    std::printf("%d test case(s) skipped: exit code 77 (ctest: Skipped)\n", n);
    std::fflush(stdout);
    return 77;
  }
  return 0;
}
