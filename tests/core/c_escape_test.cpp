// c_escape: the one C-style escaping of the dry-run environment, YAML strings and
// hostfile lines quoted in errors.
#include "core/c_escape.h"

#include <doctest/doctest.h>

#include <string>

using dtrain::c_escape;

TEST_CASE("c_escape: control bytes and backslashes, one printable line") {
  CHECK(c_escape("plain value") == "plain value");
  CHECK(c_escape("a\nb\tc\rd\\e") == "a\\nb\\tc\\rd\\\\e");
  CHECK(c_escape(std::string("\x01\x7f\0", 3)) == "\\x01\\x7f\\x00");
  CHECK(c_escape("é 'q' \"d\" $x") == "é 'q' \"d\" $x");
}

TEST_CASE("c_escape: quotes and non-ASCII on request") {
  CHECK(c_escape("say \"hi\"", {.quotes = true}) == "say \\\"hi\\\"");
  CHECK(c_escape("é", {.non_ascii = true}) == "\\xc3\\xa9");
  CHECK(c_escape("é\"", {.quotes = true, .non_ascii = true}) == "\\xc3\\xa9\\\"");
}
