// The input rule (core/input_file.h): a regular file within its bound is opened and read;
// a FIFO, a device, a directory, a socket, a symbolic link loop (one link or two), a broken
// link and a file over the bound are each refused before a byte is read, never blocking,
// with a ConfigError naming the path and saying what to do.
#include "core/input_file.h"

#include "core/error.h"
#include "../temp_dir.h"

#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The ConfigError input_file_read throws for path (fails the test when there is none).
std::string refusal(const std::string& path, uint64_t max_bytes = kInputMetaMaxBytes) {
  try {
    input_file_read(path, "test input", max_bytes);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for " << path);
  return "";
}

}  // namespace

TEST_CASE("a regular file within its bound is read whole; at the bound too") {
  test::TempDir dir("input");
  const std::string p = dir.write("a.json", "{\"x\": 1}\n").string();
  CHECK(input_file_problem(p) == "");
  CHECK(input_file_read(p, "test input", 9) == "{\"x\": 1}\n");
  InputFile f = input_file_open(p, "test input", 9);
  CHECK(f.is_open());
  CHECK(f.size() == 9);
  CHECK(!f.is_fifo());
  // Through a link, too: the rule is about what is read, not how it is named.
  fs::create_symlink(p, dir.path / "link.json");
  CHECK(input_file_read((dir.path / "link.json").string(), "test input", 9) == "{\"x\": 1}\n");
}

TEST_CASE("a FIFO, /dev/zero, a directory and a socket are refused by kind, without blocking") {
  test::TempDir dir("input");
  const std::string fifo = (dir.path / "f.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string zero_link = (dir.path / "zero").string();
  fs::create_symlink("/dev/zero", zero_link);
  const std::string sock = (dir.path / "s.sock").string();
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(sock.size() < sizeof addr.sun_path);
  std::strcpy(addr.sun_path, sock.c_str());
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);

  const std::pair<std::string, std::string> cases[] = {
      {fifo, "is not a regular file (a FIFO): give the path of a regular file"},
      {zero_link, "is not a regular file (a character device)"},
      {"/dev/zero", "is not a regular file (a character device)"},
      {dir.path.string(), "is a directory, not a file"},
      {sock, "is not a regular file (a socket)"},
  };
  for (const auto& [path, why] : cases) {
    CAPTURE(path);
    const std::string msg = refusal(path);
    CHECK(has(msg, "test input '" + path + "' "));
    CHECK(has(msg, why));
    CHECK(input_file_problem(path) != "");
  }
  ::close(s);
}

TEST_CASE("a pipe is let through only where the caller reads one with its own bound") {
  test::TempDir dir("input");
  const std::string fifo = (dir.path / "f.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string problem;
  InputFile f = input_file_try_open(fifo, 100, &problem, InputAccept::REGULAR_OR_FIFO);
  CHECK(problem == "");
  CHECK(f.is_open());
  CHECK(f.is_fifo());
  // A device is still refused there.
  InputFile z = input_file_try_open("/dev/zero", 100, &problem, InputAccept::REGULAR_OR_FIFO);
  CHECK(!z.is_open());
  CHECK(problem == "is not a regular file (a character device)");
}

TEST_CASE("symbolic link loops, of one link or two, and broken links are named as such") {
  test::TempDir dir("input");
  const fs::path self = dir.path / "self", a = dir.path / "a", b = dir.path / "b";
  fs::create_symlink("self", self);
  fs::create_symlink("b", a);
  fs::create_symlink("a", b);
  fs::create_symlink("nowhere.json", dir.path / "broken");
  for (const fs::path& p : {self, a, self / "config.json"}) {
    CAPTURE(p);
    const std::string msg = refusal(p.string());
    CHECK(has(msg, "'" + p.string() + "' is, or passes through, a symbolic link loop"));
    CHECK(has(msg, "fix or remove the link"));
  }
  const std::string broken = refusal((dir.path / "broken").string());
  CHECK(has(broken, "is a broken symbolic link (to nowhere.json)"));
  CHECK(has(refusal((dir.path / "missing.json").string()), "does not exist: check the path"));

  // Presence: the last link itself counts (its open then says what is wrong with it); a
  // loop on the way cannot be told apart from anything, so it is named.
  CHECK(input_present(self.string(), "test input"));
  CHECK(input_present((dir.path / "broken").string(), "test input"));
  CHECK(!input_present((dir.path / "missing.json").string(), "test input"));
  CHECK(!input_present((dir.path / "missing" / "x.json").string(), "test input"));
  CHECK_THROWS_WITH_AS(
      input_present((self / "config.json").string(), "model file"),
      doctest::Contains(("model file '" + (self / "config.json").string() + "' is, or passes through").c_str()),
      ConfigError);

  // Directories and paths to be created.
  CHECK(input_dir_problem(dir.path.string()) == "");
  CHECK(has(input_dir_problem(self.string()), "symbolic link loop"));
  CHECK(input_dir_problem((dir.path / "missing").string()) == "does not exist");
  CHECK_THROWS_WITH_AS(input_dir_check(a.string(), "run directory"),
                       doctest::Contains(("run directory '" + a.string() + "' is, or passes through").c_str()),
                       ConfigError);
  CHECK(has(path_resolve_problem((self / "sub").string()), "symbolic link loop"));
  CHECK(path_resolve_problem((dir.path / "new" / "sub").string()) == "");
}

TEST_CASE("a file over its bound is refused before it is read; the bound is said in MiB or KiB") {
  test::TempDir dir("input");
  const fs::path big = dir.path / "big.json";
  { std::ofstream(big) << "{}"; }
  fs::resize_file(big, (uint64_t{2} << 20) + 1);  // sparse: no disk, no memory
  const std::string msg = refusal(big.string(), uint64_t{2} << 20);
  CHECK(has(msg, "is 2097153 bytes, more than the 2097152 (2 MiB) allowed for it: is it the right file?"));
  CHECK(has(input_file_problem(big.string(), 4096), "(4 KiB)"));
  CHECK(input_file_problem(big.string()) == "");  // no bound: data, weights, shards
}

TEST_CASE("a filesystem_error about a link loop becomes a ConfigError naming the path") {
  test::TempDir dir("input");
  const fs::path self = dir.path / "self";
  fs::create_symlink("self", self);
  try {
    (void)fs::exists(self / "x");
    FAIL("no filesystem_error");
  } catch (const fs::filesystem_error& e) {
    CHECK_THROWS_WITH_AS(input_fs_error(e, "path"),
                         doctest::Contains(("path '" + (self / "x").string() + "' is, or passes through").c_str()),
                         ConfigError);
  }
}

TEST_CASE("an unreadable file is a ConfigError saying so") {
  if (::geteuid() == 0) return;  // root reads anything
  test::TempDir dir("input");
  const auto p = dir.write("secret.json", "{}");
  fs::permissions(p, fs::perms::none);
  CHECK(has(refusal(p.string()), "is not readable: Permission denied: check its permissions"));
}
