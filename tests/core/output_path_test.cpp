// The output rule (core/output_path.h) on its own: identity through links, the file rule
// (inputs, own kind, --force, devices, directories, loops), the write (rename beside the
// target, mode kept, link kept, nothing left on failure) and the directory rule.
#include "core/output_path.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path path;
  Dir() {
    std::string t = (fs::temp_directory_path() / "dtrain-output-path-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

OutputRule png_rule() {
  OutputRule r;
  r.what = "plot -o";
  r.own = [](const std::string& t) { return slurp(t).rfind("OWN", 0) == 0; };
  r.own_kind = "a dtrain plot";
  return r;
}

}  // namespace

TEST_CASE("same_path: one file through a symlink or a hard link, not a namesake elsewhere") {
  Dir d;
  const std::string a = d.file("a", "x");
  fs::create_symlink(a, d / "sym");
  fs::create_hard_link(a, d / "hard");
  fs::create_directory(d / "sub");
  CHECK(same_path(a, d / "sym"));
  CHECK(same_path(a, d / "hard"));
  CHECK(same_path(d / "sub/../a", a));
  CHECK_FALSE(same_path(a, d.file("b", "x")));
  CHECK(same_path(d / "new", d / "sub/../new"));  // neither exists: the same resolved path
  CHECK_FALSE(same_path(a, d / "new"));
}

TEST_CASE("output_file_check: inputs, directories, devices, loops and foreign files are refused") {
  Dir d;
  const std::string in = d.file("metrics.jsonl", "m");
  OutputRule r = png_rule();
  r.inputs = {in};
  fs::create_symlink(in, d / "in-link");
  CHECK(refusal([&] { output_file_check(d / "in-link", r); }).find("one of this command's inputs") !=
        std::string::npos);
  r.force = true;  // --force never licenses an input
  CHECK(refusal([&] { output_file_check(in, r); }) != "");
  r.force = false;
  CHECK(refusal([&] { output_file_check(d.path.string(), r); }).find("is a directory") != std::string::npos);
  CHECK(refusal([&] { output_file_check("/dev/null", r); }).find("not a regular file") != std::string::npos);
  fs::create_symlink(d / "loop", d / "loop");
  CHECK(refusal([&] { output_file_check(d / "loop", r); }).find("symlink loop") != std::string::npos);
  CHECK(refusal([&] { output_file_check(d / "missing/x.png", r); }).find("does not exist") != std::string::npos);
  const std::string mine = d.file("notes.txt", "mine");
  CHECK(refusal([&] { output_file_check(mine, r); }).find("--force") != std::string::npos);
  r.force = true;
  CHECK(output_file_check(mine, r).exists);
  // Own output and devices written in place where the rule allows them.
  r.force = false;
  CHECK(output_file_check(d.file("old.png", "OWN plot"), r).exists);
  r.in_place = true;
  const OutputFile dev = output_file_check("/dev/null", r);
  CHECK(dev.in_place);
  output_file_write(dev, "bytes");
}

TEST_CASE("output_file_write: through a symlink, the old mode kept, nothing left when the write fails") {
  Dir d;
  const std::string target = d.file("plot.png", "OWN old");
  ::chmod(target.c_str(), 0600);
  fs::create_symlink(target, d / "link.png");
  const OutputFile o = output_file_check(d / "link.png", png_rule());
  CHECK(o.target == fs::canonical(target).string());
  output_file_write(o, "OWN new");
  CHECK(fs::is_symlink(d / "link.png"));
  CHECK(slurp(target) == "OWN new");
  struct stat st {};
  REQUIRE(::stat(target.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  // /dev/full as an in-place target: the error names the file and the reason.
  OutputRule r = png_rule();
  r.in_place = true;
  try {
    output_file_write(output_file_check("/dev/full", r), "x");
    FAIL("no error writing /dev/full");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("No space left on device") != std::string::npos);
  }
  // A read-only directory: the temporary cannot be created, the old file stays.
  if (::geteuid() != 0) {
    ::chmod(d.path.c_str(), 0500);
    CHECK_THROWS_AS(output_file_write(o, "OWN newer"), IoError);
    ::chmod(d.path.c_str(), 0700);
    CHECK(slurp(target) == "OWN new");
  }
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(d.path)) entries.push_back(e.path().filename().string());
  CHECK(entries.size() == 2);  // plot.png and link.png: no temporary left
}

TEST_CASE("output_dir_check: new, empty and own directories pass; inputs and foreign contents do not") {
  Dir d;
  OutputDirRule r;
  r.what = "export -o";
  r.marker = ".marker.json";
  r.kind = "hf-export";
  fs::create_directory(d / "base");
  d.file("base/model.safetensors", "precious");
  r.inputs = {d / "base"};
  fs::create_directory_symlink(d / "base", d / "base-link");
  CHECK(refusal([&] { output_dir_check(d / "base-link", r); }).find("inputs") != std::string::npos);
  fs::create_directory(d / "user");
  d.file("user/a.txt", "a");
  const std::string why = refusal([&] { output_dir_check(d / "user", r); });
  CHECK(why.find("not empty") != std::string::npos);
  CHECK(why.find("a.txt") != std::string::npos);
  CHECK(refusal([&] { output_dir_check(d.file("f", "x"), r); }).find("not a directory") != std::string::npos);
  CHECK_FALSE(output_dir_check(d / "new", r).exists);
  fs::create_directory(d / "empty");
  CHECK(output_dir_check(d / "empty", r).exists);
  // A marker of this kind makes a directory own; another kind's or a garbled one does not.
  fs::create_directory(d / "own");
  d.file("own/.marker.json", output_dir_marker_text("hf-export", {"model.safetensors", "../x", "a/b"}, true));
  CHECK(output_dir_check(d / "own", r).own);
  bool found = false;
  CHECK(output_dir_marker_files(d / "own", ".marker.json", "hf-export", &found) ==
        std::vector<std::string>{"model.safetensors"});  // names only: never a path outside
  CHECK(found);
  d.file("user/.marker.json", output_dir_marker_text("run", {}, true));
  CHECK(refusal([&] { output_dir_check(d / "user", r); }) != "");
  d.file("user/.marker.json", "{not json");
  CHECK(refusal([&] { output_dir_check(d / "user", r); }) != "");
  r.legacy_own = [](const std::string& t) { return fs::exists(fs::path(t) / "a.txt"); };
  CHECK(output_dir_check(d / "user", r).own);
}
