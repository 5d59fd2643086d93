// Small files checked on the descriptor (fstat after a non-blocking open) and then read
// with a bound: type and size are known before the read, and a file that grows meanwhile
// still cannot make the read unbounded.
#include "core/small_file.h"

#include "core/check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dtrain {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "is a directory, not a file";
  if (S_ISFIFO(m)) return "is not a regular file (a FIFO)";
  if (S_ISCHR(m)) return "is not a regular file (a character device)";
  if (S_ISBLK(m)) return "is not a regular file (a block device)";
  if (S_ISSOCK(m)) return "is not a regular file (a socket)";
  return "is not a regular file";
}

// The open descriptor (or -1 with *problem set) of a regular file within the cap.
int open_checked(const std::string& path, size_t max_bytes, std::string* problem) {
  if (path.empty()) {
    *problem = "is empty (no path given)";
    return -1;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    *problem = fmt::format("cannot be opened: {}", std::strerror(errno));
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *problem = fmt::format("cannot be examined: {}", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    *problem = kind_of(st.st_mode);
  } else if (static_cast<unsigned long long>(st.st_size) > max_bytes) {
    *problem =
        fmt::format("is {} bytes, more than the {} allowed for it", static_cast<long long>(st.st_size), max_bytes);
  } else {
    return fd;
  }
  ::close(fd);
  return -1;
}

}  // namespace

std::string small_file_problem(const std::string& path, size_t max_bytes) {
  std::string problem;
  int fd = open_checked(path, max_bytes, &problem);
  if (fd >= 0) ::close(fd);
  return problem;
}

std::string small_file_read(const std::string& path, size_t max_bytes, const std::string& what) {
  std::string problem;
  int fd = open_checked(path, max_bytes, &problem);
  if (fd < 0) DT_THROW(ConfigError, "{} {} {}", what, path, problem);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      DT_THROW(ConfigError, "{} {} cannot be read: {}", what, path, std::strerror(e));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      DT_THROW(ConfigError, "{} {} grew past the {} bytes allowed for it while being read", what, path, max_bytes);
    }
  }
  ::close(fd);
  return out;
}

}  // namespace dtrain
