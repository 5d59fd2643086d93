// run_dir_check_safe / run_dir_check_adoptable / run_dir_create (issue 33, item 1): the
// rules alone, without writing anywhere but a temporary directory: system paths (also
// through a symlink), which existing directories may be adopted, the marker, and that the
// mode of a directory dtrain did not create is left alone.
#include "launch/run_dir.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace dtrain;
using namespace dtrain::launch;
namespace fs = std::filesystem;

namespace {

struct Tmp {
  fs::path path;
  Tmp() {
    std::string t = (fs::temp_directory_path() / "dtrain-adopt-unit-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~Tmp() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 077777;
  return st.st_mode & 07777;
}

std::string refusal(const std::string& dir) {
  try {
    run_dir_check_adoptable(dir, "--output-dir");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("system paths are refused, also through a symlink and below the system trees") {
  for (const char* d : {"/", "/proc", "/proc/1", "/sys/kernel", "/dev", "/dev/shm/x", "/etc", "/etc/dtrain/run",
                        "/usr/local/runs", "/bin", "/lib", "/var", "/tmp", "/home", "/root", "//", "/etc/../usr"}) {
    CAPTURE(d);
    CHECK(refusal(d).find("refused") != std::string::npos);
  }
  Tmp t;
  fs::create_symlink("/", t.path / "to-root");
  fs::create_symlink("/etc", t.path / "to-etc");
  CHECK(refusal((t.path / "to-root").string()).find("(through a symlink)") != std::string::npos);
  CHECK(refusal((t.path / "to-etc" / "sub").string()).find("inside the system directory /etc") != std::string::npos);
  // $HOME itself, not what is below it.
  const char* old_home = std::getenv("HOME");
  const std::string saved = old_home ? old_home : "";
  ::setenv("HOME", t.path.c_str(), 1);
  CHECK(refusal(t.path.string()).find("your home directory ($HOME) itself") != std::string::npos);
  CHECK(refusal((t.path / "runs" / "a").string()).empty());
  if (old_home) ::setenv("HOME", saved.c_str(), 1);
  else ::unsetenv("HOME");
  // Below /var and /tmp is allowed (only those directories themselves are refused).
  CHECK(refusal("/var/tmp/dtrain-never-created/run").empty());
}

TEST_CASE("what may be adopted: missing, empty, marked, an older dtrain's run; nothing else") {
  Tmp t;
  CHECK(refusal((t.path / "new" / "run").string()).empty());
  fs::create_directories(t.path / "empty");
  CHECK(refusal((t.path / "empty").string()).empty());

  const fs::path foreign = t.path / "foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "config.yaml") << "mine\n";
  const std::string why = refusal(foreign.string());
  CHECK(why.find("is not a dtrain run directory") != std::string::npos);
  CHECK(why.find("config.yaml") != std::string::npos);  // shows what is there

  const fs::path legacy = t.path / "legacy";
  fs::create_directories(legacy / "checkpoints");
  std::ofstream(legacy / "config.yaml") << "x: 1\n";
  CHECK(refusal(legacy.string()).empty());
  const fs::path locked = t.path / "locked";
  fs::create_directories(locked);
  std::ofstream(locked / "launcher.lock") << "";
  CHECK(refusal(locked.string()).empty());

  std::ofstream(t.path / "a-file") << "x";
  CHECK(refusal((t.path / "a-file").string()).find("not a directory") != std::string::npos);
}

TEST_CASE("run_dir_create: its own directory gets the mode and a created marker; an adopted one keeps its mode") {
  Tmp t;
  const fs::path mine = t.path / "mine";
  run_dir_create(mine.string(), 0750);
  CHECK(mode_of(mine) == 0750);
  std::ifstream m1(mine / RUN_DIR_MARKER);
  std::string rec((std::istreambuf_iterator<char>(m1)), {});
  CHECK(rec.find("\"created\":true") != std::string::npos);
  ::chmod(mine.c_str(), 0755);
  run_dir_create(mine.string(), 0700);  // dtrain's own: its mode follows the config
  CHECK(mode_of(mine) == 0700);

  const fs::path shared = t.path / "shared";
  fs::create_directories(shared);
  ::chmod(shared.c_str(), 01777);
  run_dir_create(shared.string(), 0700);
  CHECK(mode_of(shared) == 01777);
  std::ifstream m2(shared / RUN_DIR_MARKER);
  std::string rec2((std::istreambuf_iterator<char>(m2)), {});
  CHECK(rec2.find("\"created\":false") != std::string::npos);
  run_dir_create(shared.string(), 0700);  // again: still not dtrain's to change
  CHECK(mode_of(shared) == 01777);

  const fs::path foreign = t.path / "foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "notes") << "mine\n";
  ::chmod(foreign.c_str(), 0755);
  CHECK_THROWS_AS(run_dir_create(foreign.string(), 0700), UsageError);
  CHECK(mode_of(foreign) == 0755);
  CHECK(!fs::exists(foreign / RUN_DIR_MARKER));
}
