// An outsider's flood of idle connections must not flood the log: the store writes the
// first few warnings of each kind and one summary per interval with the counts (the
// probe's 4,200 idle connections gave 16,561 lines in 45 s). Bounded here: 120 idle
// loopback connections against a store with a 2 s hello timeout and room for 80.
#include "rendezvous/store.h"

#include "core/log.h"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::rendezvous;
using namespace std::chrono_literals;

namespace {

int connect_idle(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The counts the summary lines give for `kind`, added up over every interval.
size_t summarised(const std::string& text, const std::string& kind) {
  size_t total = 0;
  const std::regex re("(\\d+) " + kind);
  size_t start = 0;
  for (size_t nl; start < text.size(); start = nl + 1) {
    nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(start, nl - start);
    std::smatch m;
    if (line.find("more such connection warning(s)") != std::string::npos && std::regex_search(line, m, re))
      total += std::stoul(m[1].str());
  }
  return total;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a flood of idle connections gives a few warning lines and a summary with the counts") {
  char path[] = "/tmp/dtrain_rdzv_flood_XXXXXX";
  const int log_fd = ::mkstemp(path);
  REQUIRE(log_fd >= 0);
  ::unlink(path);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(log_fd, 2);
  constexpr int kConns = 120;
  size_t refused_or_closed = 0;
  {
    ServerLimits limits;
    limits.hello_timeout = 2s;
    limits.max_connections = 80;
    StoreServer server("127.0.0.1", 0, "flood-test-token-0123456789", limits);
    std::vector<int> fds;
    for (int i = 0; i < kConns; ++i)
      if (int fd = connect_idle(server.port()); fd >= 0) fds.push_back(fd);
    // Every connection is refused (past 80) or closed at the hello timeout: each socket
    // reads EOF (or a reset) in the end. Bounded wait.
    std::vector<bool> ended(fds.size(), false);
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (refused_or_closed < fds.size() && std::chrono::steady_clock::now() < deadline) {
      std::vector<pollfd> pfds;
      for (int fd : fds) pfds.push_back({fd, POLLIN, 0});
      ::poll(pfds.data(), pfds.size(), 100);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (ended[i] || !(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[256];
        const ssize_t n = ::recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          ended[i] = true;
          ++refused_or_closed;
        }
      }
    }
    for (int fd : fds) ::close(fd);
  }  // the store's stop writes the last interval's summary
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string logged;
  char buf[4096];
  ::lseek(log_fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(log_fd, buf, sizeof buf)) > 0;) logged.append(buf, static_cast<size_t>(n));
  ::close(log_fd);
  INFO("log:\n" << logged);
  REQUIRE(refused_or_closed == kConns);
  const size_t refused = count(logged, "refused connection from 127.0.0.1");
  const size_t closed = count(logged, "closing connection from 127.0.0.1");
  // Before: one line per connection (40 refused + 80 closed).
  CHECK(refused <= 5);
  CHECK(closed <= 5);
  CHECK(refused >= 1);
  CHECK(closed >= 1);
  // Nothing lost: the summary counts the rest of each kind.
  CHECK(count(logged, "more such connection warning(s)") >= 1);
  const size_t accepted = kConns - (refused + summarised(logged, "refused: too many connections"));
  CHECK(accepted <= 80);
  CHECK(closed + summarised(logged, "not authenticated within the hello timeout") == accepted);
  MESSAGE((refused + closed) << " connection lines and " << count(logged, "more such connection warning(s)")
                             << " summary line(s) for " << kConns << " idle connections");
}
