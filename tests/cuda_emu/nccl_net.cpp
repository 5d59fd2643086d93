// CUDA execution engine (test-only): the NCCL subset's sockets and bootstrap. Ids name a
// root (a thread of the process that made the id) that trades the ranks' listen
// addresses; interface choice follows NCCL_SOCKET_IFNAME as NCCL reads it.
#include "nccl_net.h"

#include "engine.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace cuda_emu::nccl {

std::atomic<bool> g_exiting{false};

// ----------------------------------------------------------------------------
// Errors and environment.
namespace {
std::mutex g_err_mu;
std::string g_last_error;
}  // namespace

std::string last_error() {
  std::lock_guard<std::mutex> lock(g_err_mu);
  return g_last_error;
}

bool debug_warn() {
  static const bool on = [] {
    const char* e = std::getenv("NCCL_DEBUG");
    return e && (strcasecmp(e, "WARN") == 0 || strcasecmp(e, "INFO") == 0 || strcasecmp(e, "TRACE") == 0);
  }();
  return on;
}

ncclResult_t fail(ncclResult_t r, const std::string& msg) {
  {
    std::lock_guard<std::mutex> lock(g_err_mu);
    g_last_error = msg;
  }
  if (debug_warn()) std::fprintf(stderr, "NCCL WARN %s\n", msg.c_str());
  return r;
}

std::chrono::milliseconds wait_limit() {
  const char* e = std::getenv("NCCL_EMU_TIMEOUT_MS");
  const long long v = e ? std::atoll(e) : 0;
  return std::chrono::milliseconds(v > 0 ? v : 300000);
}

uint64_t random64() {
  static std::mutex mu;
  static std::mt19937_64 rng([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
           static_cast<uint64_t>(getpid());
  }());
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

// Identifies this process to the root, which refuses two ranks of one process on one
// device (their collectives would queue behind each other on the same executor).
uint64_t process_token() {
  static const uint64_t t = random64();
  return t;
}

// ----------------------------------------------------------------------------
// Sockets: non-blocking everywhere, waits in short poll slices.

std::string addr_str(const Addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  in_addr ia{};
  ia.s_addr = a.ip;
  inet_ntop(AF_INET, &ia, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(a.port));
}

static sockaddr_in sockaddr_of(const Addr& a) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = a.ip;
  sa.sin_port = a.port;
  return sa;
}

ncclResult_t sock_error(int err, const std::string& what, std::string* out) {
  *out = what + ": " + std::strerror(err);
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
    case ECONNREFUSED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENOTCONN: return ncclRemoteError;
    default: return ncclSystemError;
  }
}

static ncclResult_t wait_fd(int fd, short events, const Waiter& w, std::string* err) {
  int ms = 0;
  if (ncclResult_t r = w.slice(&ms, err)) return r;
  pollfd p{fd, events, 0};
  if (::poll(&p, 1, ms) < 0 && errno != EINTR) return sock_error(errno, "poll", err);
  return ncclSuccess;
}

ncclResult_t io_full(int fd, void* buf, size_t n, bool sending, Waiter& w, const std::string& what, std::string* err) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = sending ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      w.progress();
    } else if (k == 0) {
      *err = what + ": connection closed by the peer";
      return ncclRemoteError;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (ncclResult_t r = wait_fd(fd, sending ? POLLOUT : POLLIN, w, err)) return *err = what + ": " + *err, r;
    } else if (errno != EINTR) {
      return sock_error(errno, what, err);
    }
  }
  return ncclSuccess;
}

ncclResult_t tcp_connect(const Addr& a, bool retry_refused, Waiter& w, Fd* out, std::string* err) {
  const std::string what = "connect to " + addr_str(a);
  for (;;) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return sock_error(errno, "socket", err);
    const sockaddr_in sa = sockaddr_of(a);
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
    int e = rc == 0 ? 0 : errno;
    while (e == EINPROGRESS || e == EINTR) {
      if (ncclResult_t r = wait_fd(fd.get(), POLLOUT, w, err)) return *err = what + ": " + *err, r;
      pollfd p{fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, 0) <= 0) continue;
      socklen_t len = sizeof e;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
    }
    if (e == 0) {
      const int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *out = std::move(fd);
      w.progress();
      return ncclSuccess;
    }
    if (!retry_refused || e != ECONNREFUSED) return sock_error(e, what, err);
    int ms = 0;
    if (ncclResult_t r = w.slice(&ms, err)) return *err = what + ": " + *err, r;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

ncclResult_t tcp_listen(const Addr& want, Fd* out, Addr* bound, std::string* err) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return sock_error(errno, "socket", err);
  const int one = 1;
  if (want.port != 0) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const sockaddr_in sa = sockaddr_of(want);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
    return sock_error(errno, "bind " + addr_str(want), err);
  if (::listen(fd.get(), 128) != 0) return sock_error(errno, "listen", err);
  sockaddr_in got{};
  socklen_t len = sizeof got;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &len) != 0)
    return sock_error(errno, "getsockname", err);
  bound->ip = got.sin_addr.s_addr;
  bound->port = got.sin_port;
  *out = std::move(fd);
  return ncclSuccess;
}

ncclResult_t tcp_accept(int lfd, Waiter& w, Fd* out, std::string* err) {
  for (;;) {
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      out->reset(fd);
      w.progress();
      return ncclSuccess;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return sock_error(errno, "accept", err);
    if (ncclResult_t r = wait_fd(lfd, POLLIN, w, err)) return *err = "accept: " + *err, r;
  }
}

// The interface NCCL would pick: NCCL_SOCKET_IFNAME (comma list of name prefixes; a
// leading '^' excludes them, '=' asks for exact names), else the first up IPv4
// interface that is neither loopback nor docker, then docker, then loopback.
ncclResult_t iface_pick(Addr* out, std::string* err) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return sock_error(errno, "getifaddrs", err);
  struct If {
    std::string name;
    uint32_t ip;
    bool loopback;
  };
  std::vector<If> ifs;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP))
      ifs.push_back({i->ifa_name, reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr,
                     (i->ifa_flags & IFF_LOOPBACK) != 0});
  ::freeifaddrs(list);
  auto take = [&](const If& i) {
    out->ip = i.ip;
    out->port = 0;
    return ncclSuccess;
  };
  const char* env = std::getenv("NCCL_SOCKET_IFNAME");
  if (env && *env) {
    std::string spec(env);
    const bool exclude = spec[0] == '^';
    if (exclude) spec.erase(0, 1);
    const bool exact = !spec.empty() && spec[0] == '=';
    if (exact) spec.erase(0, 1);
    std::vector<std::string> names;
    for (size_t pos = 0; pos <= spec.size();) {
      const size_t comma = std::min(spec.find(',', pos), spec.size());
      if (comma > pos) names.push_back(spec.substr(pos, comma - pos));
      pos = comma + 1;
    }
    for (const If& i : ifs) {
      bool hit = false;
      for (const auto& n : names) hit = hit || (exact ? i.name == n : i.name.compare(0, n.size(), n) == 0);
      if (hit != exclude) return take(i);
    }
    *err = std::string("no up IPv4 interface matches NCCL_SOCKET_IFNAME=") + env;
    return ncclSystemError;
  }
  for (int pass = 0; pass < 3; ++pass)
    for (const If& i : ifs) {
      const bool docker = i.name.compare(0, 6, "docker") == 0;
      if ((pass == 0 && !i.loopback && !docker) || (pass == 1 && docker) || (pass == 2 && i.loopback)) return take(i);
    }
  *err = "no up IPv4 interface";
  return ncclSystemError;
}

// ----------------------------------------------------------------------------
// Ids and the bootstrap root.

ncclResult_t id_parse_env(const char* env, IdBlob* id, std::string* err) {
  const std::string s(env);
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos) return *err = "NCCL_COMM_ID must be <ipv4 or host>:<port>", ncclInvalidArgument;
  const std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return *err = "NCCL_COMM_ID: cannot resolve " + s, ncclInvalidArgument;
  const auto* sa = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  id->root.ip = sa->sin_addr.s_addr;
  id->root.port = sa->sin_port;
  ::freeaddrinfo(res);
  id->tag = ID_TAG;
  id->from_env = 1;
  id->magic = std::hash<std::string>{}(s) | 1;  // every process derives the same magic
  return ncclSuccess;
}

// Roots are threads of the process that made the id; each exits once every rank has
// registered or the registration failed, and the exit hook joins the rest.
namespace {
struct RootRegistry {
  std::mutex mu;
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> roots;
  void reap() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = roots.begin(); it != roots.end();) {
      if (it->second->load()) {
        it->first.join();
        it = roots.erase(it);
      } else {
        ++it;
      }
    }
  }
};
}  // namespace
static RootRegistry& roots() {
  static auto* r = new RootRegistry();  // outlives every static destructor; the exit hook empties it
  return *r;
}

static void root_send_reply(int fd, ncclResult_t result, const std::string& detail, const std::vector<Addr>* table) {
  RootReply rep{};
  rep.tag = WIRE_TAG;
  rep.result = result;
  std::snprintf(rep.detail, sizeof rep.detail, "%s", detail.c_str());
  Waiter w(std::chrono::milliseconds(2000), nullptr);
  std::string err;
  if (io_full(fd, &rep, sizeof rep, true, w, "root reply", &err) == ncclSuccess && table)
    io_full(fd, const_cast<Addr*>(table->data()), table->size() * sizeof(Addr), true, w, "root table", &err);
}

static void root_serve(Fd lfd, uint64_t magic) {
  struct Joining {
    Fd fd;
    Hello h{};
    size_t got = 0;
  };
  std::vector<Joining> joining;
  std::vector<Fd> ranks;  // by rank, once registered
  std::vector<Hello> hellos;
  std::vector<Addr> table;
  int nranks = -1, registered = 0;
  Waiter w(wait_limit(), nullptr);
  auto fail_all = [&](ncclResult_t r, const std::string& why) {
    if (debug_warn()) std::fprintf(stderr, "NCCL WARN bootstrap root: %s\n", why.c_str());
    for (auto& f : ranks)
      if (f.get() >= 0) root_send_reply(f.get(), r, why, nullptr);
    for (auto& j : joining) root_send_reply(j.fd.get(), r, why, nullptr);
  };
  for (;;) {
    std::vector<pollfd> pfds{{lfd.get(), POLLIN, 0}};
    for (auto& j : joining) pfds.push_back({j.fd.get(), POLLIN, 0});
    for (auto& f : ranks)
      if (f.get() >= 0) pfds.push_back({f.get(), POLLIN, 0});
    int ms = 0;
    std::string err;
    if (w.slice(&ms, &err) != ncclSuccess) return fail_all(ncclSystemError, "bootstrap root: " + err);
    ::poll(pfds.data(), pfds.size(), ms);
    for (;;) {
      const int fd = ::accept4(lfd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      joining.push_back({Fd(fd)});
    }
    // A registered rank that goes away dooms the communicator.
    for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
      if (ranks[r].get() < 0) continue;
      char c;
      const ssize_t k = ::recv(ranks[r].get(), &c, 1, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ranks[r].reset();
        return fail_all(ncclRemoteError, "rank " + std::to_string(r) + " left before every rank joined");
      }
    }
    for (size_t i = 0; i < joining.size();) {
      Joining& j = joining[i];
      const ssize_t k = ::recv(j.fd.get(), reinterpret_cast<char*>(&j.h) + j.got, sizeof j.h - j.got, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        joining.erase(joining.begin() + static_cast<long>(i));
        continue;
      }
      if (k > 0) j.got += static_cast<size_t>(k);
      if (j.got < sizeof j.h) {
        ++i;
        continue;
      }
      w.progress();
      Fd fd = std::move(j.fd);
      const Hello h = j.h;
      joining.erase(joining.begin() + static_cast<long>(i));
      if (h.tag != WIRE_TAG || h.magic != magic) {  // a stray connection, not one of ours
        root_send_reply(fd.get(), ncclInvalidUsage, "unique id mismatch", nullptr);
        continue;
      }
      if (nranks < 0) {
        nranks = h.nranks;
        ranks.resize(std::max(nranks, 0));
        hellos.resize(ranks.size());
        table.resize(ranks.size());
      }
      std::string why;
      ncclResult_t bad = ncclSuccess;
      if (h.nranks != nranks) {
        bad = ncclInvalidUsage;
        why = "rank " + std::to_string(h.rank) + " says nranks " + std::to_string(h.nranks) +
              ", an earlier rank said " + std::to_string(nranks);
      } else if (h.rank < 0 || h.rank >= nranks) {
        bad = ncclInvalidArgument;
        why = "rank " + std::to_string(h.rank) + " out of range for nranks " + std::to_string(nranks);
      } else if (ranks[h.rank].get() >= 0) {
        bad = ncclInvalidUsage;
        why = "rank " + std::to_string(h.rank) + " joined twice";
      } else {
        for (int r = 0; r < nranks; ++r)
          if (ranks[r].get() >= 0 && hellos[r].process == h.process && hellos[r].device == h.device) {
            bad = ncclInvalidUsage;
            why = "duplicate GPU: ranks " + std::to_string(r) + " and " + std::to_string(h.rank) +
                  " of one process both use CUDA device " + std::to_string(h.device);
          }
      }
      if (bad != ncclSuccess) {
        root_send_reply(fd.get(), bad, why, nullptr);
        return fail_all(bad, why);
      }
      hellos[h.rank] = h;
      table[h.rank] = h.listen;
      ranks[h.rank] = std::move(fd);
      if (++registered == nranks) {
        lfd.reset();
        for (auto& f : ranks) {
          root_send_reply(f.get(), ncclSuccess, "", &table);
          f.reset();
        }
        return;
      }
    }
  }
}

ncclResult_t root_start(const Addr& at, uint64_t magic, Addr* bound, std::string* err) {
  Fd lfd;
  if (ncclResult_t r = tcp_listen(at, &lfd, bound, err)) return r;
  auto done = std::make_shared<std::atomic<bool>>(false);
  RootRegistry& reg = roots();
  reg.reap();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.roots.emplace_back(std::thread([fd = lfd.release(), magic, done]() mutable {
                           root_serve(Fd(fd), magic);
                           done->store(true);
                         }),
                         done);
  return ncclSuccess;
}

// Runs before the runtime's static teardown joins the device executors (registered
// after the runtime's state exists), so a collective blocked on the network lets go.
static void exit_hook() {
  g_exiting.store(true);
  RootRegistry& reg = roots();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& r : reg.roots) r.first.join();
  reg.roots.clear();
}
void exit_hook_install() {
  static std::once_flag once;
  std::call_once(once, [] {
    cuda_emu::device_count();
    std::atexit(exit_hook);
  });
}

}  // namespace cuda_emu::nccl
