// Input files: tells a permanent problem with a data file (missing, a directory, not
// readable) from a read failure, so ranks stop with a config error instead of retrying.
#include "data/input_file.h"

#include "core/check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dtrain::data {

std::string input_file_problem(const std::string& path) {
  if (path.empty()) return "is empty (no path given)";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return "does not exist";
    return fmt::format("cannot be read: {}", std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (::access(path.c_str(), R_OK) != 0) return fmt::format("is not readable: {}", std::strerror(errno));
  return "";
}

void input_file_check(const std::string& path, const std::string& what) {
  const std::string problem = input_file_problem(path);
  if (problem.empty()) return;
  std::string where;
  if (!path.empty() && std::filesystem::path(path).is_relative()) {
    std::error_code ec;
    const auto cwd = std::filesystem::current_path(ec);
    if (!ec) where = fmt::format(" (relative to the working directory {})", cwd.string());
  }
  DT_THROW(ConfigError, "{} '{}'{} {}: check the path", what, path, where, problem);
}

std::string input_file_read(const std::string& path, const std::string& what) {
  input_file_check(path, what);
  std::ifstream in(path, std::ios::binary);
  DT_ENFORCE(in.good(), IoError, "cannot open {} '{}': check the path", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  DT_ENFORCE(!in.bad(), IoError, "error reading {} '{}'", what, path);
  return ss.str();
}

}  // namespace dtrain::data
