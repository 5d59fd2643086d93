// Small POSIX pieces the local and SSH spawners share (internal to lib/launch): an
// owning fd, an eventfd to wake a reader thread's poll(), and SIGPIPE handling for
// threads that write to pipes or sockets that may be closed under them.
#pragma once

#include <chrono>
#include <utility>

namespace dtrain::launch::detail {

/// Owns one file descriptor (closed on destruction); -1 is empty.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// An eventfd a thread polls on; notify() from any thread makes it readable.
class Wakeup {
 public:
  Wakeup();
  int fd() const { return fd_.get(); }
  void notify();
  void drain();  ///< called by the polling thread after it saw the fd readable

 private:
  UniqueFd fd_;
};

/// Blocks SIGPIPE in the calling thread, so a write to a closed pipe or socket fails
/// with EPIPE instead of killing the process; call at the start of I/O threads.
void block_sigpipe_in_this_thread();
/// Discards a SIGPIPE left pending in this thread by a failed write.
void discard_pending_sigpipe();

/// Milliseconds from now until `deadline` for poll(), clamped to [0, cap_ms].
int poll_timeout_ms(std::chrono::steady_clock::time_point deadline, int cap_ms);

}  // namespace dtrain::launch::detail
