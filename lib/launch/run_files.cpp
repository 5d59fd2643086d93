// The launcher's run directory writes: report a failing file once, keep supervising,
// write delayed events in order once the disk takes them again.
#include "launch/run_files.h"

#include "core/error.h"
#include "core/log.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
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

}  // namespace

RunFiles::RunFiles(std::string run_dir)
    : events_path_((std::filesystem::path(run_dir) / "events.jsonl").string()) {}

RunFiles::~RunFiles() {
  for (auto& [path, fd] : fds_)
    if (fd >= 0) ::close(fd);
}

bool RunFiles::append_locked(const std::string& path, std::string_view text) {
  auto it = fds_.find(path);
  if (it == fds_.end()) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
      const int err = errno;
      failed_locked(path, fmt::format("cannot write {}: {}", path, std::strerror(err)));
      return false;
    }
    it = fds_.emplace(path, fd).first;
  }
  const int fd = it->second;
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0;
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
  // Half a record would spoil the next one written after it: cut it back (when that
  // fails too, readers skip the line that does not parse). The file is reopened next
  // time: the directory may have been replaced meanwhile.
  if (off > 0 && sized) (void)!::ftruncate(fd, st.st_size);
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

bool RunFiles::event(const nlohmann::json& ev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.size() >= kMaxPendingEvents) pending_.erase(pending_.begin());
  pending_.push_back(ev.dump() + "\n");
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
