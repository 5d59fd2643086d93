// The one doctest main shared by every test binary. A case that called
// dtrain::test::skip_test() (tests/skip.h) turns a passing run into exit code 77, which
// ctest reports as SKIPPED; failures keep doctest's non-zero code.
//
// DTRAIN_TEST_FILE=tests/<module>/<name>_test.cpp (set by ctest for each test file of a
// unity batch binary, CMakeLists.txt's dtrain_add_test_batch) runs only that file's cases;
// a file with no case in this binary is an error, never a pass. DTRAIN_TEST_SHARD=K/N
// (set by ctest for a suite split into N entries) runs the K-th of N contiguous slices of
// the suite's (or that file's) cases in file order: together the N slices run every case
// exactly once, and a slice with no case is an error, never a pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "skip.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Parses "K/N" (1 <= K <= N); false for anything else.
bool shard_parse(const char* s, int* k, int* n) {
  char* end = nullptr;
  const long a = std::strtol(s, &end, 10);
  if (end == s || *end != '/') return false;
  const char* t = end + 1;
  const long b = std::strtol(t, &end, 10);
  if (end == t || *end != '\0' || a < 1 || b < 1 || a > b || b > 1000) return false;
  *k = static_cast<int>(a);
  *n = static_cast<int>(b);
  return true;
}

bool ends_with(const char* s, const std::string& suffix) {
  const size_t n = std::strlen(s);
  return n >= suffix.size() && std::memcmp(s + n - suffix.size(), suffix.data(), suffix.size()) == 0;
}

// The registered cases of the files ending in `suffix` (every file when empty); with
// `runnable`, only those not marked doctest::skip (what --first/--last count).
int count_cases(const std::string& suffix, bool runnable) {
  int n = 0;
  for (const auto& tc : doctest::detail::getRegisteredTests())
    if ((!runnable || !tc.m_skip) && (suffix.empty() || ends_with(tc.m_file.c_str(), suffix))) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  // The cases this run may select from: the whole binary, or one test file's.
  std::string file_suffix;
  if (const char* env = std::getenv("DTRAIN_TEST_FILE"); env != nullptr && *env != '\0') {
    const std::string file = env;
    ::unsetenv("DTRAIN_TEST_FILE");
    file_suffix = "/" + file;
    const int cases = count_cases(file_suffix, false);
    if (cases == 0) {
      std::fprintf(stderr, "DTRAIN_TEST_FILE=%s: no test case of this binary is in that file\n", file.c_str());
      return 2;
    }
    context.setOption("source-file", ("*" + file_suffix).c_str());
    // doctest counts the other files' cases as "skipped" in its summary.
    std::printf(
        "DTRAIN_TEST_FILE=%s: the %d test case(s) of that file (doctest's \"skipped\" below counts the "
        "other files' cases of this batch binary)\n",
        file.c_str(), cases);
    std::fflush(stdout);
  }
  if (const char* env = std::getenv("DTRAIN_TEST_SHARD"); env != nullptr && *env != '\0') {
    // Not passed on: a suite that runs test binaries itself (the GPU check's rehearsal)
    // must run them whole.
    const std::string shard = env;
    ::unsetenv("DTRAIN_TEST_SHARD");
    int k = 0, n = 0;
    if (!shard_parse(shard.c_str(), &k, &n)) {
      std::fprintf(stderr, "DTRAIN_TEST_SHARD='%s': expected K/N with 1 <= K <= N\n", shard.c_str());
      return 2;
    }
    // doctest's --first/--last count the cases that pass the filters (none are set by
    // ctest) in the run order, by file and line.
    const int cases = count_cases(file_suffix, true);
    const int first = (k - 1) * cases / n + 1, last = k * cases / n;
    if (first > last) {
      std::fprintf(stderr, "DTRAIN_TEST_SHARD=%s: slice %d of %d of %d test case(s) is empty; use fewer slices\n",
                   shard.c_str(), k, n, cases);
      return 2;
    }
    context.setOption("first", first);
    context.setOption("last", last);
    std::printf("DTRAIN_TEST_SHARD=%s: test cases %d-%d of %d\n", shard.c_str(), first, last, cases);
    std::fflush(stdout);
  }
  const int rc = context.run();
  if (context.shouldExit() || rc != 0) return rc;
  if (const int n = dtrain::test::skipped_cases(); n > 0) {
    std::printf("%d test case(s) skipped: exit code 77 (ctest: Skipped)\n", n);
    std::fflush(stdout);
    return 77;
  }
  return 0;
}
