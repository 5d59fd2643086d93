// One temporary directory per test object, removed with everything in it when the object
// goes: the one copy of the helper the test files used to define each for itself.
// mkdtemp gives a fresh, private name (no pid or random-number collisions between test
// binaries that ctest runs side by side).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace dtrain::test {

struct TempDir {
  std::filesystem::path path;

  explicit TempDir(const std::string& stem = "test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("dtrain-" + stem + "-XXXXXX")).string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// Writes `text` to `name` below the directory (binary, replacing it); its path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const auto p = path / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
};

}  // namespace dtrain::test
