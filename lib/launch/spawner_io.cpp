// UniqueFd, Wakeup, the SIGPIPE helpers and ProcessState used by the spawners' reader
// threads.
#include "launch/spawner_io.h"

#include "core/check.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <ctime>

namespace dtrain::launch::detail {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Wakeup::Wakeup() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  DT_SYS_CHECK(fd);
  fd_.reset(fd);
}

void Wakeup::notify() {
  std::uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the thread will wake anyway.
  [[maybe_unused]] ssize_t r = ::write(fd_.get(), &one, sizeof one);
}

void Wakeup::drain() {
  std::uint64_t value;
  [[maybe_unused]] ssize_t r = ::read(fd_.get(), &value, sizeof value);
}

void block_sigpipe_in_this_thread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void discard_pending_sigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  timespec zero{0, 0};
  int saved = errno;
  while (::sigtimedwait(&set, nullptr, &zero) > 0) {
  }
  errno = saved;
}

int poll_timeout_ms(std::chrono::steady_clock::time_point deadline, int cap_ms) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  if (left < 0) return 0;
  // Round up so a poll never returns just before the deadline and spins.
  return static_cast<int>(std::min<long long>(left + 1, cap_ms));
}

// ---------------------------------------------------------------------------
// ProcessState

bool ProcessState::running() {
  std::lock_guard lock(mu_);
  return !status_;
}

std::optional<ExitStatus> ProcessState::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return status_.has_value(); });
  return status_;
}

std::optional<ExitStatus> ProcessState::wait_until(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return status_.has_value(); });
  return status_;
}

void ProcessState::wait_notified(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout);
}

void ProcessState::finish(ExitStatus status) {
  {
    std::lock_guard lock(mu_);
    status_ = std::move(status);
  }
  cv_.notify_all();
}

ProcessState::Requests ProcessState::requests() {
  std::lock_guard lock(mu_);
  return requests_;
}

void ProcessState::request_stop() {
  {
    std::lock_guard lock(mu_);
    requests_.stop = true;
  }
  wake_.notify();
}

void ProcessState::request_close_stdin() {
  {
    std::lock_guard lock(mu_);
    requests_.close_stdin = true;
  }
  wake_.notify();
}

std::optional<ProcessState::Clock::time_point> ProcessState::request_terminate(Clock::time_point deadline) {
  {
    std::lock_guard lock(mu_);
    if (status_) return std::nullopt;
    if (!requests_.terminate) {
      requests_.terminate = true;
      requests_.terminate_deadline = deadline;
    }
    deadline = requests_.terminate_deadline;
  }
  wake_.notify();
  return deadline;
}

}  // namespace dtrain::launch::detail
