// append_record: whole records or none; AppendReport: one warning per failing period.
#include "core/append_record.h"

#include "core/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dtrain {

int append_record(int fd, std::string_view rec) {
  // Where the record begins: the end of the file under O_APPEND, else the file offset.
  const int flags = ::fcntl(fd, F_GETFL);
  off_t begin = -1;
  if (flags >= 0 && (flags & O_APPEND)) {
    struct stat st {};
    if (::fstat(fd, &st) == 0) begin = st.st_size;
  } else {
    begin = ::lseek(fd, 0, SEEK_CUR);
  }
  size_t off = 0;
  int err = 0;
  while (off < rec.size()) {
    const ssize_t n = ::write(fd, rec.data() + off, rec.size() - off);
    if (n < 0 && errno == EINTR) continue;
    // write() of a regular file returns 0 only when nothing more fits (errno is not set).
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    off += static_cast<size_t>(n);
  }
  if (err == 0) return 0;
  if (off > 0) {
    // Cut back to where the record began (nobody else writes the file while we hold it),
    // and put the offset there too: without O_APPEND the next record would otherwise
    // leave a hole of zeros.
    if (begin < 0) begin = ::lseek(fd, 0, SEEK_CUR) - static_cast<off_t>(off);
    if (begin >= 0 && ::ftruncate(fd, begin) == 0) ::lseek(fd, begin, SEEK_SET);
  }
  return err;
}

bool AppendReport::update(const std::string& path, int err) {
  if (err == 0) {
    if (failing_) log_info("{} can be written again: {} are recorded from here on", path, what_);
    failing_ = false;
    return true;
  }
  if (!failing_)
    log_warn(
        "cannot write {}: {}; training goes on, and {} are lost until it can be written again (reported once; "
        "the file keeps only whole records)",
        path, std::strerror(err), what_);
  failing_ = true;
  return false;
}

}  // namespace dtrain
