// The launcher's run directory writes: report a failing file once, keep supervising,
// write delayed events in order once the disk takes them again.
#include "launch/run_files.h"

#include "core/error.h"
#include "core/log.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dtrain::launch {

namespace {

// Events kept in memory while events.jsonl cannot be written: a job has a few per round,
// so this bound is only reached by a launcher that retried for a very long time.
constexpr size_t kMaxPendingEvents = 10000;

// Truncates the file after its last newline (nothing when it ends with one or is empty).
void events_tail_cut(int fd) {
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size <= 0) return;
  char c = 0;
  if (::pread(fd, &c, 1, size - 1) != 1 || c == '\n') return;
  off_t keep = 0;
  char buf[4096];
  for (off_t at = size; at > 0 && keep == 0;) {
    const off_t from = std::max<off_t>(0, at - static_cast<off_t>(sizeof buf));
    const ssize_t n = ::pread(fd, buf, static_cast<size_t>(at - from), from);
    if (n <= 0) return;
    for (ssize_t i = n - 1; i >= 0; --i)
      if (buf[i] == '\n') {
        keep = from + i + 1;
        break;
      }
    at = from;
  }
  (void)!::ftruncate(fd, keep);
}

}  // namespace

RunFiles::RunFiles(std::string run_dir) : events_path_((std::filesystem::path(run_dir) / "events.jsonl").string()) {}

RunFiles::~RunFiles() {
  for (auto& [path, fd] : fds_)
    if (fd >= 0) ::close(fd);
}

bool RunFiles::append_locked(const std::string& path, std::string_view text) {
  auto it = fds_.find(path);
  if (it == fds_.end()) {
    // events.jsonl is also read: its unterminated tail is cut on open (events_tail_cut).
    const int mode = path == events_path_ ? O_RDWR : O_WRONLY;
    const int fd = ::open(path.c_str(), mode | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
      const int err = errno;
      failed_locked(path, fmt::format("cannot write {}: {}", path, std::strerror(err)));
      return false;
    }
    // A launcher killed mid-event left a record without its newline: cut it off, or the
    // next event would be appended to it and both would read as one corrupt line.
    if (path == events_path_) events_tail_cut(fd);
    it = fds_.emplace(path, fd).first;
  }
  const int fd = it->second;
  size_t off = 0;
  int err = 0;
  while (off < text.size()) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    // write() of a regular file returns 0 only when nothing more fits (errno is not set).
    if (w <= 0) {
      err = w < 0 ? errno : ENOSPC;
      break;
    }
    off += static_cast<size_t>(w);
  }
  if (err == 0) {
    succeeded_locked(path);
    return true;
  }
  // Half a record would spoil the next one written after it: cut it back (O_APPEND left
  // the offset at the end; when the cut fails too, the next open of events.jsonl cuts the
  // unterminated tail). The file is reopened next time: the directory may have been
  // replaced meanwhile.
  if (off > 0) {
    const off_t end = ::lseek(fd, 0, SEEK_END);
    if (end >= static_cast<off_t>(off)) (void)!::ftruncate(fd, end - static_cast<off_t>(off));
  }
  ::close(fd);
  fds_.erase(it);
  failed_locked(path, fmt::format("cannot write {}: {}", path, std::strerror(err)));
  return false;
}

void RunFiles::failed_locked(const std::string& path, const std::string& message) {
  auto it = failing_.find(path);
  if (it != failing_.end()) {
    it->second = message;
    return;
  }
  failing_.emplace(path, message);
  log_warn("{}; the launcher goes on supervising the job (reported once for this file)", message);
}

void RunFiles::succeeded_locked(const std::string& path) {
  if (failing_.erase(path) > 0) log_info("{} can be written again", path);
}

bool RunFiles::write_pending_locked(size_t fresh) {
  size_t done = 0;
  while (done < pending_.size() && append_locked(events_path_, pending_[done])) ++done;
  const size_t delayed = std::min(done, pending_.size() - fresh);
  if (delayed > 0) log_info("{}: wrote {} delayed event(s)", events_path_, delayed);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  return pending_.empty();
}

bool RunFiles::event(const report::Event& ev) {
  // Stamped now, not when a full disk lets it in: the record says when it happened.
  const std::string line = report::event_json(ev).dump() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.size() >= kMaxPendingEvents) pending_.erase(pending_.begin());
  pending_.push_back(line);
  return write_pending_locked(1);
}

bool RunFiles::flush_events() {
  std::lock_guard<std::mutex> lock(mu_);
  return write_pending_locked(0);
}

bool RunFiles::append(const std::string& path, std::string_view text) {
  std::lock_guard<std::mutex> lock(mu_);
  return append_locked(path, text);
}

bool RunFiles::attempt(const std::string& path, const std::function<void()>& write) {
  std::string why;
  try {
    write();
  } catch (const Error& e) {
    why = e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (why.empty()) {
    succeeded_locked(path);
    return true;
  }
  failed_locked(path, why);
  return false;
}

size_t RunFiles::events_pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

std::string RunFiles::failing() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [path, message] : failing_) out += (out.empty() ? "" : "; ") + message;
  return out;
}

}  // namespace dtrain::launch
