// Input files checked before a byte is read: the path is examined (stat, so a device is
// never even opened), then opened non-blocking (a FIFO cannot block the open) and examined
// again on the descriptor (what was swapped in meanwhile is what counts), and read with a
// bound that holds however the file grows.
#include "core/input_file.h"

#include "core/check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

namespace dtrain {

namespace {

constexpr const char* kLoop = "is, or passes through, a symbolic link loop (too many levels of symbolic links)";

std::string kind_problem(mode_t m) {
  if (S_ISDIR(m)) return "is a directory, not a file";
  if (S_ISFIFO(m)) return "is not a regular file (a FIFO)";
  if (S_ISCHR(m)) return "is not a regular file (a character device)";
  if (S_ISBLK(m)) return "is not a regular file (a block device)";
  if (S_ISSOCK(m)) return "is not a regular file (a socket)";
  return "is not a regular file";
}

// What an errno from resolving or opening path means for the user.
std::string errno_problem(const std::string& path, int err) {
  switch (err) {
    case ENOENT: {
      // A name that is there but leads nowhere is not "missing" to someone who sees it in ls.
      struct stat lst {};
      if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
        char target[PATH_MAX];
        const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
        return n > 0 ? fmt::format("is a broken symbolic link (to {})", std::string(target, static_cast<size_t>(n)))
                     : std::string("is a broken symbolic link");
      }
      return "does not exist";
    }
    case ENOTDIR: return "does not exist (a part of the path before it is not a directory)";
    case ELOOP: return kLoop;
    case EACCES:
    case EPERM: return fmt::format("is not readable: {}", std::strerror(err));
    default: return fmt::format("cannot be opened: {}", std::strerror(err));
  }
}

// "16777216 (16 MiB)": a bound as given and as read.
std::string bound_text(uint64_t max_bytes) {
  if (max_bytes >= (uint64_t{1} << 20) && max_bytes % (uint64_t{1} << 20) == 0)
    return fmt::format("{} ({} MiB)", max_bytes, max_bytes >> 20);
  if (max_bytes >= 1024 && max_bytes % 1024 == 0) return fmt::format("{} ({} KiB)", max_bytes, max_bytes >> 10);
  return std::to_string(max_bytes);
}

// What to do about a problem, by its kind (the problem texts are this file's own).
const char* problem_fix(const std::string& problem) {
  auto has = [&](const char* s) { return problem.find(s) != std::string::npos; };
  if (has("symbolic link loop")) return "fix or remove the link";
  if (has("broken symbolic link")) return "point the link at the file, or give the file's own path";
  if (has("is not a regular file") || has("is a directory")) return "give the path of a regular file";
  if (has("allowed for it") || has("grew past")) return "is it the right file?";
  if (has("is not readable") || has("cannot be examined")) return "check its permissions and those of its directories";
  return "check the path";
}

}  // namespace

// ----------------------------------------------------------------------------
InputFile::~InputFile() { close(); }

InputFile::InputFile(InputFile&& o) noexcept { *this = std::move(o); }

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    size_ = o.size_;
    fifo_ = o.fifo_;
  }
  return *this;
}

void InputFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int InputFile::release() { return std::exchange(fd_, -1); }

std::string InputFile::read_all(const std::string& what, uint64_t max_bytes) {
  DT_ENFORCE(fd_ >= 0 && !fifo_, InternalError, "InputFile::read_all: {} is not an open regular file", path_);
  std::string out;
  if (size_ <= max_bytes) out.reserve(static_cast<size_t>(size_));
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) DT_THROW(IoError, "cannot read {} '{}': {}", what, path_, std::strerror(errno));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes)
      DT_THROW(ConfigError, "{}",
               input_file_message(
                   path_, what,
                   fmt::format("grew past the {} bytes allowed for it while being read", bound_text(max_bytes))));
  }
  return out;
}

// ----------------------------------------------------------------------------
InputFile input_file_try_open(const std::string& path, uint64_t max_bytes, std::string* problem, InputAccept accept) {
  InputFile f;
  problem->clear();
  if (path.empty()) {
    *problem = "is empty (no path given)";
    return f;
  }
  const auto acceptable = [&](mode_t m) {
    return S_ISREG(m) || (accept == InputAccept::REGULAR_OR_FIFO && S_ISFIFO(m));
  };
  // The path first: a device is refused without being opened (opening one can act: a tape
  // rewinds, a watchdog arms).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *problem = errno_problem(path, errno);
    return f;
  }
  if (!acceptable(st.st_mode)) {
    *problem = kind_problem(st.st_mode);
    return f;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    *problem = errno_problem(path, errno);
    return f;
  }
  f.fd_ = fd;
  f.path_ = path;
  // Then the descriptor: what is read is what was checked.
  if (::fstat(fd, &st) != 0) {
    *problem = fmt::format("cannot be examined: {}", std::strerror(errno));
  } else if (!acceptable(st.st_mode)) {
    *problem = kind_problem(st.st_mode);
  } else if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    *problem = fmt::format("is {} bytes, more than the {} allowed for it", static_cast<long long>(st.st_size),
                           bound_text(max_bytes));
  } else {
    f.size_ = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    f.fifo_ = S_ISFIFO(st.st_mode);
    return f;
  }
  f.close();
  return f;
}

std::string input_file_problem(const std::string& path, uint64_t max_bytes) {
  std::string problem;
  input_file_try_open(path, max_bytes, &problem);
  return problem;
}

std::string input_file_message(const std::string& path, const std::string& what, const std::string& problem) {
  std::string where;
  if (!path.empty() && std::filesystem::path(path).is_relative()) {
    std::error_code ec;
    const auto cwd = std::filesystem::current_path(ec);
    if (!ec) where = fmt::format(" (relative to the working directory {})", cwd.string());
  }
  return fmt::format("{} '{}'{} {}: {}", what, path, where, problem, problem_fix(problem));
}

InputFile input_file_open(const std::string& path, const std::string& what, uint64_t max_bytes) {
  std::string problem;
  InputFile f = input_file_try_open(path, max_bytes, &problem);
  if (!problem.empty()) DT_THROW(ConfigError, "{}", input_file_message(path, what, problem));
  return f;
}

void input_file_check(const std::string& path, const std::string& what, uint64_t max_bytes) {
  input_file_open(path, what, max_bytes);
}

std::string input_file_read(const std::string& path, const std::string& what, uint64_t max_bytes) {
  return input_file_open(path, what, max_bytes).read_all(what, max_bytes);
}

// ----------------------------------------------------------------------------
bool input_present(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return true;
  const int e = errno;
  if (e == ENOENT || e == ENOTDIR) return false;
  const std::string problem = e == ELOOP ? std::string(kLoop) : fmt::format("cannot be examined: {}", std::strerror(e));
  DT_THROW(ConfigError, "{}", input_file_message(path, what, problem));
}

std::string input_dir_problem(const std::string& path) {
  if (path.empty()) return "is empty (no path given)";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR || e == ELOOP) return errno_problem(path, e);
    return fmt::format("cannot be examined: {}", std::strerror(e));
  }
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  return "";
}

void input_dir_check(const std::string& path, const std::string& what) {
  const std::string problem = input_dir_problem(path);
  if (!problem.empty()) DT_THROW(ConfigError, "{}", input_file_message(path, what, problem));
}

std::string path_resolve_problem(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) == 0) return "";
  const int e = errno;
  if (e == ELOOP) return kLoop;
  if (e == EACCES || e == EPERM) return fmt::format("cannot be examined: {}", std::strerror(e));
  if (e == ENAMETOOLONG) return fmt::format("cannot be used: {}", std::strerror(e));
  return "";
}

void input_fs_error(const std::filesystem::filesystem_error& e, const std::string& what) {
  const std::string path = e.path1().string();
  const int err = e.code().value();
  if (e.code().category() == std::generic_category() || e.code().category() == std::system_category()) {
    if (err == ELOOP) DT_THROW(ConfigError, "{}", input_file_message(path, what, kLoop));
    if (err == EACCES || err == EPERM || err == ENOTDIR || err == ENAMETOOLONG)
      DT_THROW(ConfigError, "{}",
               input_file_message(path, what, fmt::format("cannot be examined: {}", e.code().message())));
  }
  DT_THROW(IoError, "{} '{}': {}: check the path and the file system", what, path, e.code().message());
}

std::string file_type_problem(unsigned mode) { return kind_problem(static_cast<mode_t>(mode)); }

}  // namespace dtrain
