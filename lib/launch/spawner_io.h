// Small pieces the local and SSH spawners share (internal to lib/launch): an owning fd,
// an eventfd to wake a reader thread's poll(), SIGPIPE handling for threads that write to
// pipes or sockets that may be closed under them, and the state a process's callers
// share with its I/O thread.
#pragma once

#include "launch/spawner.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
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

/// What a spawned process's callers share with its I/O thread, under one mutex: the
/// exit status once the thread publishes it, and the callers' requests, each of which
/// wakes the thread's poll() (wake_fd).
class ProcessState {
 public:
  using Clock = std::chrono::steady_clock;
  struct Requests {
    bool stop = false;         // the destructor: the I/O thread ends
    bool close_stdin = false;  // close_stdin(): EOF once the stdin data is written
    bool terminate = false;    // SSH terminate(): stdin EOF, the channel given up at the deadline
    Clock::time_point terminate_deadline{};
  };

  /// True until the status is published.
  bool running();
  /// Waits up to `timeout` (or until `deadline`) for the status; it once published.
  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout);
  std::optional<ExitStatus> wait_until(Clock::time_point deadline);
  /// Waits up to `timeout` for a status to be published, without looking at it.
  void wait_notified(std::chrono::milliseconds timeout);
  /// Runs f(status) under the mutex, so no status is published meanwhile.
  template <class F>
  decltype(auto) with_status(F&& f) {
    std::lock_guard lock(mu_);
    return f(std::as_const(status_));
  }
  /// Publishes the status and wakes every waiter (I/O thread).
  void finish(ExitStatus status);

  Requests requests();
  void request_stop();
  void request_close_stdin();
  /// Asks for termination by `deadline` (a second request keeps the first deadline): the
  /// deadline in effect, nullopt when the status is already known.
  std::optional<Clock::time_point> request_terminate(Clock::time_point deadline);

  int wake_fd() const { return wake_.fd(); }
  void drain_wake() { wake_.drain(); }

 private:
  Wakeup wake_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ExitStatus> status_;
  Requests requests_;
};

}  // namespace dtrain::launch::detail
