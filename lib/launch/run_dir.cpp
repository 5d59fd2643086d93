// Run directory safety: which directories may be created or adopted, its mode and
// marker, the launcher lock (flock + holder record) and atomic file replacement.
#include "launch/run_dir.h"

#include "core/check.h"
#include "core/env.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/unix_time.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>

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

// ---------------------------------------------------------------------------
// Which directories dtrain may write into.

namespace {

// Top-level directories a run must never be, and those nothing may be created below.
constexpr const char* kSystemDirs[] = {"/",      "/bin",    "/boot",  "/dev", "/etc", "/home", "/lib",  "/lib32",
                                       "/lib64", "/libx32", "/media", "/mnt", "/opt", "/proc", "/root", "/run",
                                       "/sbin",  "/snap",   "/srv",   "/sys", "/tmp", "/usr",  "/var",  "/var/tmp"};
constexpr const char* kSystemTrees[] = {"/proc", "/sys",  "/dev", "/etc",   "/usr",   "/bin",
                                        "/sbin", "/boot", "/lib", "/lib32", "/lib64", "/libx32"};

// The f_type of the kernel's own file systems (linux/magic.h), where nothing is data.
struct KernelFs {
  long magic;
  const char* name;
};
constexpr KernelFs kKernelFs[] = {{0x9fa0, "proc"},        {0x62656572, "sysfs"},      {0x1cd1, "devpts"},
                                  {0x27e0eb, "cgroup"},    {0x63677270, "cgroup2"},    {0x64626720, "debugfs"},
                                  {0x74726163, "tracefs"}, {0x73636673, "securityfs"}, {0xcafe4a11, "bpf"},
                                  {0x6165676c, "pstore"},  {0x62656570, "configfs"},   {0xde5e81e4, "efivarfs"}};

bool path_within(const fs::path& p, const std::string& root) {
  const std::string s = p.string();
  return s == root || (s.size() > root.size() && s.compare(0, root.size(), root) == 0 && s[root.size()] == '/');
}

// Why `p` (absolute, lexically normal, no trailing slash) is a system location, or "".
std::string system_reason(const fs::path& p) {
  const std::string s = p.string();
  for (const char* d : kSystemDirs)
    if (s == d) return fmt::format("{} is a system directory", s);
  for (const char* t : kSystemTrees)
    if (path_within(p, t)) return fmt::format("{} is inside the system directory {}", s, t);
  if (const char* home = env_get("HOME"); home && *home) {
    std::error_code ec;
    fs::path h = fs::weakly_canonical(fs::path(home), ec);
    if (ec) h = fs::path(home).lexically_normal();
    std::string hs = h.string();
    while (hs.size() > 1 && hs.back() == '/') hs.pop_back();
    if (s == hs) return fmt::format("{} is your home directory ($HOME) itself", s);
  }
  return "";
}

fs::path normal_absolute(const std::string& dir) {
  fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return fs::path(s);
}

// The directory's entries, at most `limit` of them ("" on an error: `err` says which).
std::vector<std::string> dir_entries(const fs::path& dir, size_t limit, std::error_code& err) {
  std::vector<std::string> out;
  for (fs::directory_iterator it(dir, err), end; !err && it != end && out.size() < limit; it.increment(err))
    out.push_back(it->path().filename().string());
  return out;
}

// The marker's record: "created" true when dtrain made the directory.
std::string marker_record(bool created) {
  return nlohmann::json{{"dtrain_run_dir", 1}, {"created", created}, {"host", host_name()}, {"time", utc_now()}}
             .dump() +
         "\n";
}

// -1: no marker; 0: a marker of a directory dtrain adopted; 1: one dtrain created.
int marker_created(const fs::path& dir) {
  const fs::path m = dir / RUN_DIR_MARKER;
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(m, ec))) return -1;
  // The input rule, bounded: a marker is one short record (a longer one is not dtrain's).
  std::string why;
  InputFile f = input_file_try_open(m.string(), 4096, &why);
  if (!why.empty()) return 0;
  const auto j = nlohmann::json::parse(f.read_all("run directory marker", 4096), nullptr, false);
  return j.is_object() && j.contains("created") && j.at("created").is_boolean() && j.at("created").get<bool>() ? 1 : 0;
}

}  // namespace

void run_dir_check_safe(const std::string& dir, const std::string& what) {
  DT_ENFORCE(!dir.empty(), ConfigError, "{} is empty: give the run directory's path", what);
  // A link loop on the way (LOOP/sub) would otherwise surface as a filesystem_error from
  // whichever call looks first.
  if (const std::string problem = path_resolve_problem(dir); !problem.empty())
    DT_THROW(ConfigError, "{} '{}' {}: fix the path or its links, or give another run directory path", what, dir,
             problem);
  const fs::path p = normal_absolute(dir);
  std::string why = system_reason(p);
  if (why.empty()) {
    // The same with symlinks resolved (/lib -> /usr/lib, a link to /).
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(p, ec);
    if (!ec && c != p) {
      why = system_reason(normal_absolute(c.string()));
      if (!why.empty()) why = fmt::format("{} (through a symlink): {}", p.string(), why);
    }
  }
  if (why.empty()) {
    // The file system of the nearest existing ancestor: a kernel file system holds no data.
    fs::path probe = p;
    std::error_code ec;
    while (probe.has_parent_path() && probe != probe.parent_path() && !fs::exists(probe, ec))
      probe = probe.parent_path();
    struct statfs st {};
    if (::statfs(probe.c_str(), &st) == 0)
      for (const KernelFs& k : kKernelFs)
        if (static_cast<long>(st.f_type) == k.magic)
          why = fmt::format("{} is on a {} file system (the kernel's, at {})", p.string(), k.name, probe.string());
  }
  if (!why.empty())
    DT_THROW(ConfigError,
             "{} '{}': refused: {}. dtrain writes its run (config, logs, checkpoints) into the run directory and "
             "makes it private; give a directory of its own, e.g. --output-dir runs/my-run",
             what, dir, why);
}

void run_dir_check_adoptable(const std::string& dir, const std::string& what) {
  run_dir_check_safe(dir, what);
  const fs::path p = normal_absolute(dir);
  std::error_code ec;
  const auto st = fs::status(p, ec);
  if (!fs::exists(st)) return;  // created by dtrain
  DT_ENFORCE(fs::is_directory(st), UsageError, "{} '{}': exists and is not a directory; give a new run directory path",
             what, dir);
  if (marker_created(p) >= 0) return;
  std::error_code lec;
  const std::vector<std::string> names = dir_entries(p, 64, lec);
  DT_ENFORCE(!lec, IoError, "{} '{}': cannot list the directory: {}", what, dir, lec.message());
  if (names.empty()) return;
  auto has_file = [&](const char* n) { return fs::is_regular_file(fs::symlink_status(p / n, ec)); };
  // A run of a dtrain from before the marker: its config with its events or checkpoints,
  // or the lock file alone (a launcher that stopped before writing anything else).
  const bool legacy = (has_file("config.yaml") &&
                       (has_file("events.jsonl") || fs::is_directory(fs::symlink_status(p / "checkpoints", ec)))) ||
                      (names.size() == 1 && names[0] == "launcher.lock" && has_file("launcher.lock"));
  if (legacy) return;
  std::string shown;
  for (size_t i = 0; i < names.size() && i < 5; ++i) shown += (i ? ", " : "") + names[i];
  if (names.size() > 5) shown += ", ...";
  DT_THROW(
      UsageError,
      "{} '{}': refused: the directory is not empty ({}) and is not a dtrain run directory (it has no {} marker, "
      "nor an earlier run's config.yaml with events.jsonl or checkpoints/). dtrain writes only into a directory it "
      "creates, an empty one or a run directory of its own, so nothing of yours is replaced; give a new path, "
      "e.g. {}/run",
      what, dir, shown, RUN_DIR_MARKER, dir);
}

namespace {

// Creates p (its parents first): true when this call made it (then its mode is set and
// its marker written), false when it already existed. IoError otherwise.
bool run_dir_make(const fs::path& p, const std::string& dir, mode_t mode) {
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  DT_ENFORCE(!ec, IoError, "cannot create the parent directories of run directory {}: {}", dir, ec.message());
  if (::mkdir(p.c_str(), 0700) != 0) {
    DT_ENFORCE(errno == EEXIST, IoError, "cannot create run directory {}: {}", dir, std::strerror(errno));
    return false;
  }
  // Ours: its mode is set explicitly (mkdir's is filtered by the umask).
  DT_ENFORCE(::chmod(p.c_str(), mode) == 0, IoError, "cannot set the permissions of run directory {} to {:04o}: {}",
             dir, static_cast<unsigned>(mode), std::strerror(errno));
  run_dir_write_file((p / RUN_DIR_MARKER).string(), marker_record(true), 0600);
  return true;
}

// Adopts the existing directory p under run_dir_check_adoptable's rules: the mode of one
// dtrain created is set, one it did not create keeps its mode, a missing marker is written.
void run_dir_adopt(const fs::path& p, const std::string& dir, mode_t mode) {
  run_dir_check_adoptable(dir, "run directory");
  const int created = marker_created(p);
  if (created == 1) {
    // dtrain made it: a run created under an older, looser rule becomes private.
    DT_ENFORCE(::chmod(p.c_str(), mode) == 0, IoError, "cannot set the permissions of run directory {} to {:04o}: {}",
               dir, static_cast<unsigned>(mode), std::strerror(errno));
    return;
  }
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0 && (st.st_mode & 07777 & ~mode) != 0)
    log_warn(
        "run directory {} has mode {:04o}, looser than training.run_dir_mode {:04o}: dtrain did not create it, so "
        "it leaves its mode as it is (its files are still written {:04o}); chmod it yourself if others must not "
        "read the run",
        dir, static_cast<unsigned>(st.st_mode & 07777), static_cast<unsigned>(mode),
        static_cast<unsigned>(mode & 0666));
  if (created < 0) run_dir_write_file((p / RUN_DIR_MARKER).string(), marker_record(false), 0600);
}

}  // namespace

void run_dir_create(const std::string& dir, mode_t mode) {
  run_dir_check_adoptable(dir, "run directory");
  const fs::path p = normal_absolute(dir);
  // It exists (another process may have made it a moment ago): the same rules again.
  if (!run_dir_make(p, dir, mode)) run_dir_adopt(p, dir, mode);
}

RunDirLock run_dir_create_locked(const std::string& dir, mode_t mode, std::string* note) {
  run_dir_check_adoptable(dir, "run directory");
  const fs::path p = normal_absolute(dir);
  run_dir_make(p, dir, mode);
  // An existing directory is changed only under its lock: a live launch's or `dtrain
  // run`'s directory is refused (naming the holder) before its mode or marker is touched.
  RunDirLock lock = RunDirLock::acquire(dir, note);
  run_dir_adopt(p, dir, mode);
  return lock;
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
  // The rule of train/checkpoint_files.cpp (tmp-step<k>, k the step number).
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
    said = fmt::format(
        "run directory {}: taking over a stale lock record of {}, which ended without releasing it "
        "(killed or crashed)",
        dir, holder_text(old));
  const std::string rec = nlohmann::json{{"host", host_name()},
                                         {"pid", static_cast<long long>(::getpid())},
                                         {"started", utc_now()},
                                         {"started_ms", unix_ms()}}
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
