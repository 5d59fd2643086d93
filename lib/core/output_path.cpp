// The output rule (output_path.h): paths resolved through symlinks once, compared with the
// command's inputs by device and inode, and written by temporary file + rename beside the
// resolved target, so a link stays a link and a directory keeps its inode and mode.
#include "core/output_path.h"

#include "core/check.h"
#include "core/input_file.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// `path` made absolute with every symlink resolved (the parts that exist), or the reason
// it cannot be (a symlink loop, a component that is a file).
std::string output_resolve(const std::string& path, std::string* problem) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(path), ec);
  if (!ec) abs = fs::weakly_canonical(abs, ec);
  if (ec) {
    *problem = ec.value() == ELOOP ? "is in a symlink loop (too many levels of symbolic links)"
                                   : fmt::format("cannot be resolved: {}", ec.message());
    return "";
  }
  std::string s = abs.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// The directory's entries (at most `limit` named), for messages.
std::string output_listing(const std::string& dir, size_t limit) {
  std::error_code ec;
  std::vector<std::string> names;
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (n++ < limit) names.push_back(e.path().filename().string());
  }
  std::string s;
  for (const auto& x : names) s += (s.empty() ? "" : ", ") + x;
  if (n > limit) s += fmt::format(" and {} more", n - limit);
  return s;
}

void output_fsync_dir(const std::string& d) {
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes every byte to fd; 0 or the errno of the failure (ENOSPC when nothing more fits).
int output_write_all(int fd, const std::string& bytes) {
  for (size_t off = 0; off < bytes.size();) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : ENOSPC;
    off += static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace

bool same_path(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {
  }, sb{};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  std::string pa, pb;
  const std::string ra = output_resolve(a, &pa), rb = output_resolve(b, &pb);
  return !ra.empty() && ra == rb;
}

OutputFile output_file_check(const std::string& path, const OutputRule& rule) {
  if (path.empty()) DT_THROW(UsageError, "{} is empty: give the file to write", rule.what);
  OutputFile o;
  o.given = path;
  std::string problem;
  o.target = output_resolve(path, &problem);
  if (!problem.empty()) DT_THROW(UsageError, "{} '{}' {}: give another path", rule.what, path, problem);
  for (const std::string& in : rule.inputs)
    if (same_path(o.target, in))
      DT_THROW(UsageError, "{} '{}' is {}: writing it would replace that input; give another path", rule.what, path,
               in == path ? "one of this command's inputs" : "'" + in + "', one of this command's inputs");
  struct stat st {};
  if (::stat(o.target.c_str(), &st) != 0) {
    const int e = errno;
    if (e != ENOENT)
      DT_THROW(UsageError, "{} '{}' cannot be examined: {}: give another path", rule.what, path, std::strerror(e));
    const std::string parent = fs::path(o.target).parent_path().string();
    struct stat ps {};
    if (!(::stat(parent.c_str(), &ps) == 0 && S_ISDIR(ps.st_mode)))
      DT_THROW(UsageError, "{} '{}': the directory {} does not exist: create it first or give another path", rule.what,
               path, parent);
    return o;
  }
  o.exists = true;
  if (S_ISDIR(st.st_mode))
    DT_THROW(UsageError, "{} '{}' is a directory: give a file name, e.g. {}/{}", rule.what, path, path, "out");
  if (!S_ISREG(st.st_mode)) {
    if (!(rule.in_place && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))))
      DT_THROW(UsageError, "{} '{}' exists and {}: writing would replace it; give a file name", rule.what, path,
               file_type_problem(st.st_mode));
    o.in_place = true;
    return o;
  }
  o.mode = st.st_mode & 07777;
  if (rule.force || (rule.own && rule.own(o.target))) return o;
  DT_THROW(UsageError, "{} '{}' exists and is not {}: refusing to replace it; give another path, or {} to replace it",
           rule.what, path, rule.own_kind.empty() ? "dtrain's own output" : rule.own_kind, rule.force_flag);
}

void output_file_write(const OutputFile& out, const std::string& bytes) {
  if (out.in_place) {
    const int fd = ::open(out.target.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) DT_THROW(IoError, "cannot write {}: {}", out.given, std::strerror(errno));
    int err = output_write_all(fd, bytes);
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) DT_THROW(IoError, "cannot write {}: {}", out.given, std::strerror(err));
    return;
  }
  const fs::path target(out.target);
  const std::string tmp =
      (target.parent_path() / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) DT_THROW(IoError, "cannot write {}: cannot create {}: {}", out.given, tmp, std::strerror(errno));
  int err = output_write_all(fd, bytes);
  if (err == 0 && out.exists && ::fchmod(fd, static_cast<mode_t>(out.mode)) != 0) err = errno;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), out.target.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot write {}: {}{}", out.given, std::strerror(err),
             out.exists ? " (the file there is unchanged)" : "");
  }
  output_fsync_dir(target.parent_path().string());
}

std::string output_dir_marker_text(const std::string& kind, const std::vector<std::string>& files, bool complete) {
  nlohmann::json j;
  j["written_by"] = "dtrain";
  j["kind"] = kind;
  j["complete"] = complete;
  j["files"] = files;
  return j.dump(1) + "\n";
}

std::vector<std::string> output_dir_marker_files(const std::string& dir, const std::string& marker,
                                                 const std::string& kind, bool* found) {
  if (found) *found = false;
  const std::string path = (fs::path(dir) / marker).string();
  if (!input_file_problem(path, 1 << 20).empty()) return {};
  try {
    const nlohmann::json j = nlohmann::json::parse(input_file_read(path, "marker", 1 << 20));
    if (!j.is_object() || j.value("written_by", "") != "dtrain" || j.value("kind", "") != kind) return {};
    std::vector<std::string> files;
    if (j.contains("files") && j["files"].is_array())
      for (const auto& f : j["files"])
        if (f.is_string()) {
          const std::string n = f.get<std::string>();
          // Entry names only: a marker can never make the export touch anything outside.
          if (!n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos) files.push_back(n);
        }
    if (found) *found = true;
    return files;
  } catch (const std::exception&) {
    return {};
  }
}

OutputDir output_dir_check(const std::string& path, const OutputDirRule& rule) {
  if (path.empty()) DT_THROW(UsageError, "{} is empty: give the directory to write", rule.what);
  OutputDir o;
  o.given = path;
  std::string problem;
  o.target = output_resolve(path, &problem);
  if (!problem.empty()) DT_THROW(UsageError, "{} '{}' {}: give another directory", rule.what, path, problem);
  for (const std::string& in : rule.inputs)
    if (same_path(o.target, in))
      DT_THROW(UsageError, "{} '{}' is {}: writing there would replace it; give a new or empty directory", rule.what,
               path, in == path ? "one of this command's inputs" : "'" + in + "', one of this command's inputs");
  struct stat st {};
  if (::stat(o.target.c_str(), &st) != 0) {
    const int e = errno;
    if (e != ENOENT)
      DT_THROW(UsageError, "{} '{}' cannot be examined: {}: give another directory", rule.what, path, std::strerror(e));
    return o;
  }
  o.exists = true;
  if (!S_ISDIR(st.st_mode))
    DT_THROW(UsageError,
             "{} '{}' exists and is not a directory: give a new or empty directory (or an earlier export's)", rule.what,
             path);
  bool found = false;
  output_dir_marker_files(o.target, rule.marker, rule.kind, &found);
  if (found || (rule.legacy_own && rule.legacy_own(o.target))) {
    o.own = true;
    return o;
  }
  std::error_code ec;
  const bool empty = fs::is_empty(o.target, ec);
  if (ec) DT_THROW(UsageError, "{} '{}' cannot be listed: {}: give another directory", rule.what, path, ec.message());
  if (!empty)
    DT_THROW(UsageError,
             "{} '{}' is not empty and holds no dtrain export (no {}; it holds {}): dtrain writes only into a new "
             "directory, an empty one or an earlier export's; give one of those",
             rule.what, path, rule.marker, output_listing(o.target, 5));
  return o;
}

}  // namespace dtrain
