// docs/config-reference.md is the schema's own text (scripts/config_reference.sh writes
// it from `dtrain launch --help-config`): a key added, removed or re-documented in
// lib/config/schema.cpp without regenerating the file fails here.
#include "config/train_config.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

TEST_CASE("docs/config-reference.md holds exactly what --help-config prints") {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  const std::filesystem::path root = src && *src ? std::filesystem::path(src) : std::filesystem::current_path();
  std::ifstream in(root / "docs" / "config-reference.md");
  REQUIRE_MESSAGE(in.good(), "no docs/config-reference.md under ", root.string());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::string open = "```text\n", close = "```\n";
  const size_t a = doc.find(open);
  REQUIRE(a != std::string::npos);
  const size_t b = doc.rfind(close);
  REQUIRE(b != std::string::npos);
  REQUIRE(b > a);
  const std::string table = doc.substr(a + open.size(), b - a - open.size());
  const std::string want = dtrain::config::config_help();
  INFO("docs/config-reference.md is stale: run scripts/config_reference.sh (after building dtrain)");
  CHECK(table == want);
}
