// Run directory safety: its mode, the launcher lock (flock + holder record) and atomic
// file replacement.
#include "launch/run_dir.h"

#include "core/check.h"
#include "core/log.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace fs = std::filesystem;

namespace dtrain::launch {

namespace {

std::string host_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return stamp;
}

std::string fd_read_all(int fd) {
  std::string out;
  char buf[512];
  for (off_t off = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    off += n;
    if (out.size() > 64 * 1024) break;  // a record is one short line
  }
  return out;
}

// "pid 4242 on host node1 (started 2026-01-02T03:04:05Z)" from a record, or the raw text.
std::string holder_text(const std::string& record) {
  const auto j = nlohmann::json::parse(record, nullptr, false);
  if (!j.is_object() || !j.contains("pid") || !j.contains("host"))
    return record.empty() ? std::string("a launcher that has not written its record yet")
                          : "an unreadable record: " + nlohmann::json(record.substr(0, 200)).dump();
  auto text = [&](const char* k) {
    if (!j.contains(k)) return std::string("?");
    return j.at(k).is_string() ? j.at(k).get<std::string>() : j.at(k).dump();
  };
  return fmt::format("pid {} on host {} (started {})", text("pid"), text("host"), text("started"));
}

// A path as an error message can show it: long ones cut in the middle.
std::string path_shown(const std::string& p) {
  return p.size() <= 120 ? p : p.substr(0, 80) + "..." + p.substr(p.size() - 30);
}

}  // namespace

// ---------------------------------------------------------------------------

void run_dir_check_path(const std::string& dir, const std::string& what) {
  // NAME_MAX of the file system the directory will be created on: ask the nearest
  // existing ancestor (a long component cannot exist, so the walk ends above it).
  fs::path probe = fs::path(dir);
  std::error_code ec;
  while (probe.has_parent_path() && probe != probe.parent_path() && !fs::is_directory(probe, ec))
    probe = probe.parent_path();
  long name_max = ::pathconf(probe.c_str(), _PC_NAME_MAX);
  if (name_max <= 0) name_max = NAME_MAX;
  long path_max = ::pathconf(probe.c_str(), _PC_PATH_MAX);
  if (path_max <= 0 || path_max > PATH_MAX) path_max = PATH_MAX;

  for (const fs::path& part : fs::path(dir)) {
    const std::string name = part.string();
    if (static_cast<long>(name.size()) > name_max)
      DT_THROW(ConfigError,
               "{} '{}': the path component '{}' is {} bytes long, over the file system's limit of {} bytes per "
               "name (NAME_MAX); choose a shorter run directory name",
               what, path_shown(dir), path_shown(name), name.size(), name_max);
  }
  // path_max counts the terminating NUL.
  const long room = path_max - 1 - static_cast<long>(RUN_DIR_INNER_PATH_MAX);
  if (static_cast<long>(dir.size()) > room)
    DT_THROW(ConfigError,
             "{} '{}': the path is {} bytes long; the files the job writes inside it (up to {} more bytes) would pass "
             "the limit of {} bytes per path (PATH_MAX), so it may be at most {} bytes; choose a shorter path",
             what, path_shown(dir), dir.size(), RUN_DIR_INNER_PATH_MAX, path_max - 1, room);
}

mode_t run_dir_mode_parse(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(text.c_str(), &end, 8);
  DT_ENFORCE(!text.empty() && errno == 0 && end && *end == '\0' && v <= 0777 && (v & 0700) == 0700, ConfigError,
             "training.run_dir_mode '{}': expected an octal mode such as 0700 that lets the owner read, write and "
             "enter the directory",
             text);
  return static_cast<mode_t>(v);
}

void run_dir_create(const std::string& dir, mode_t mode) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DT_ENFORCE(!ec, IoError, "cannot create run directory {}: {}", dir, ec.message());
  // Set explicitly: mkdir's mode is filtered by the umask, and an existing directory
  // keeps whatever it had.
  DT_ENFORCE(::chmod(dir.c_str(), mode) == 0, IoError, "cannot set the permissions of run directory {} to {:04o}: {}",
             dir, static_cast<unsigned>(mode), std::strerror(errno));
}

void run_dir_write_file(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode & 0666);
  DT_ENFORCE(fd >= 0, IoError, "cannot write {}: {}", tmp, std::strerror(errno));
  ::fchmod(fd, mode & 0666);  // the umask must not loosen or tighten it
  // A failed write leaves no tmp file: on a full disk it would hold on to the space.
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot {} {}: {}", what, tmp, std::strerror(err));
  };
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    // write() of a regular file returns 0 only when nothing more fits (errno is not set).
    if (w <= 0) fail("write", w < 0 ? errno : ENOSPC);
    p += w;
    left -= static_cast<size_t>(w);
  }
  // Some filesystems (NFS) report a full disk only when the data is flushed.
  if (::fsync(fd) != 0 && errno != EINVAL) fail("write", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DT_THROW(IoError, "cannot write {}: {}", tmp, std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    DT_THROW(IoError, "cannot rename {} to {}: {}", tmp, path, ec.message());
  }
}

bool run_dir_partial_checkpoint_name(const std::string& name) {
  // The rule of train/checkpoint.cpp (tmp-step<k>, k the step number).
  if (name.size() <= 8 || name.rfind("tmp-step", 0) != 0) return false;
  return std::all_of(name.begin() + 8, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> run_dir_remove_partial_checkpoints(const std::string& dir) {
  std::vector<std::string> removed;
  const fs::path root = fs::path(dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code type_ec;
    // symlink_status: a symlink named like ours is not ours to follow.
    const auto st = fs::symlink_status(e.path(), type_ec);
    const bool partial_dir = run_dir_partial_checkpoint_name(name) && fs::is_directory(st);
    const bool latest_tmp = name == "latest.tmp" && fs::is_regular_file(st);
    if (!partial_dir && !latest_tmp) continue;
    std::error_code rm_ec;
    fs::remove_all(e.path(), rm_ec);
    if (rm_ec) {
      log_warn("cannot remove {}, left by a checkpoint save that did not complete: {}", e.path().string(),
               rm_ec.message());
      continue;
    }
    log_info("removed {}, left by a checkpoint save that did not complete", e.path().string());
    removed.push_back(e.path().string());
  }
  return removed;
}

// ---------------------------------------------------------------------------

RunDirLock RunDirLock::acquire(const std::string& dir, std::string* note) {
  const std::string path = (fs::path(dir) / "launcher.lock").string();
  // Close-on-exec: agents and ranks must not inherit (and so prolong) the lock.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  DT_ENFORCE(fd >= 0, IoError, "cannot open the run directory lock {}: {}", path, std::strerror(errno));
  int r;
  do r = ::flock(fd, LOCK_EX | LOCK_NB);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    const std::string holder = holder_text(fd_read_all(fd));
    ::close(fd);
    DT_ENFORCE(err == EWOULDBLOCK, IoError, "cannot lock {}: {}", path, std::strerror(err));
    DT_THROW(UsageError,
             "run directory {} is in use by another dtrain launcher: {}. One launcher owns a run directory at a "
             "time: wait for it to end (or stop it), or use another --output-dir",
             dir, holder);
  }
  // Ours. A record that is still there was left by a launcher that ended without
  // clearing it (killed or crashed): the kernel dropped its lock, so it is stale.
  const std::string old = fd_read_all(fd);
  std::string said;
  if (!old.empty())
    said = fmt::format("run directory {}: taking over a stale lock record of {}, which ended without releasing it "
                       "(killed or crashed)",
                       dir, holder_text(old));
  const std::string rec =
      nlohmann::json{{"host", host_name()}, {"pid", static_cast<long long>(::getpid())}, {"started", utc_now()},
                     {"started_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count()}}
          .dump() +
      "\n";
  // The flock is what excludes other launchers; the record only names the holder. On a
  // full disk it may not fit: the launch goes on (and may free space: partial
  // checkpoints go first), an empty record reads "has not written its record yet".
  ssize_t w = -1;
  if (::ftruncate(fd, 0) != 0 || (w = ::pwrite(fd, rec.data(), rec.size(), 0)) != static_cast<ssize_t>(rec.size())) {
    const int err = w < 0 ? errno : ENOSPC;  // a short write sets no errno: the rest did not fit
    (void)!::ftruncate(fd, 0);
    said += fmt::format("{}cannot write the run directory lock record {}: {} (the lock holds without it)",
                        said.empty() ? "" : "; ", path, std::strerror(err));
  } else {
    ::fsync(fd);
  }
  if (note) *note = said;
  return RunDirLock(fd, path);
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  // The file stays (unlinking it would let a launcher that opened the old inode and one
  // that creates a new file both "hold" the lock); an empty record means "released".
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::close(fd_);
}

}  // namespace dtrain::launch
