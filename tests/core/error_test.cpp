// Check macros: messages carry both values, file:line and the error context.
#include "core/check.h"

#include <doctest/doctest.h>

#include <cerrno>
#include <fcntl.h>

using namespace dtrain;

TEST_CASE("DT_ENFORCE_EQ prints both values, the location and the context") {
  set_error_context("host=n1 rank=3");
  int a = 3, b = 4;
  try {
    DT_ENFORCE_EQ(a, b, ConfigError, "sizes differ for {}", "x");
    FAIL("no throw");
  } catch (const ConfigError& e) {
    std::string m = e.what();
    CHECK(m.find("sizes differ for x") != std::string::npos);
    CHECK(m.find("a = 3") != std::string::npos);
    CHECK(m.find("b = 4") != std::string::npos);
    CHECK(m.find("tests/core/error_test.cpp:") != std::string::npos);
    CHECK(m.find("host=n1 rank=3") != std::string::npos);
    CHECK(e.exit_code() == 2);
  }
  set_error_context("");
}

TEST_CASE("DT_SYS_CHECK reports errno") {
  try {
    DT_SYS_CHECK(::open("/nonexistent/dtrain/file", O_RDONLY));
    FAIL("no throw");
  } catch (const IoError& e) {
    std::string m = e.what();
    CHECK(m.find("No such file") != std::string::npos);
    CHECK(e.code() == Exit::IO);
  }
}

TEST_CASE("DT_ENFORCE passes through when the condition holds") {
  CHECK_NOTHROW(DT_ENFORCE(1 + 1 == 2, InternalError, "math"));
  CHECK_THROWS_AS(DT_CHECK(false), InternalError);
}
