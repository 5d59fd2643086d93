// UniqueFd, Wakeup and the SIGPIPE helpers used by the spawners' reader threads.
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

}  // namespace dtrain::launch::detail
