// One temporary directory per test object, removed with everything in it when the object
// goes: the one copy of the helper the test files used to define each for itself; and
// the whole-file read and write and the source-tree lookup they each defined beside it.
// mkdtemp gives a fresh, private name (no pid or random-number collisions between test
// binaries that ctest runs side by side).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace dtrain::test {

/// A whole file's bytes ("" when it cannot be read).
inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The source tree the test reads its assets from: $DTRAIN_SOURCE_DIR, else the working
/// directory (ctest runs the tests from the source root).
inline std::filesystem::path source_dir() {
  const char* d = std::getenv("DTRAIN_SOURCE_DIR");
  return d ? std::filesystem::path(d) : std::filesystem::current_path();
}

/// Writes `text` to p (binary, replacing the file).
inline void file_put(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

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
    file_put(p, text);
    return p;
  }
};

}  // namespace dtrain::test
