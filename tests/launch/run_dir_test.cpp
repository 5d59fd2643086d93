// Run directory path limits: a component over NAME_MAX, a path that leaves no room for
// the files the job writes inside it under PATH_MAX, and paths that are fine.
#include "launch/run_dir.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <climits>
#include <string>

using namespace dtrain;
using namespace dtrain::launch;

namespace {

std::string check_error(const std::string& dir) {
  try {
    run_dir_check_path(dir, "--output-dir");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("run_dir_check_path: NAME_MAX per component, PATH_MAX minus the inner files for the whole") {
  CHECK(check_error("/tmp/runs/tiny-sft").empty());
  CHECK(check_error("/tmp/" + std::string(NAME_MAX, 'n')).empty());

  std::string m = check_error("/tmp/" + std::string(NAME_MAX + 1, 'n') + "/run");
  CHECK(contains(m, "--output-dir"));
  CHECK(contains(m, "is 256 bytes long"));
  CHECK(contains(m, "limit of 255 bytes per name (NAME_MAX)"));

  const size_t room = PATH_MAX - 1 - RUN_DIR_INNER_PATH_MAX;
  std::string ok = "/tmp";
  while (ok.size() + 101 <= room) ok += "/" + std::string(100, 'p');
  ok += "/" + std::string(room - ok.size() - 1, 'q');
  REQUIRE(ok.size() == room);
  CHECK(check_error(ok).empty());
  m = check_error(ok + "r");
  CHECK(contains(m, std::to_string(room + 1) + " bytes long"));
  CHECK(contains(m, "PATH_MAX"));
  CHECK(contains(m, "at most " + std::to_string(room) + " bytes"));
}
