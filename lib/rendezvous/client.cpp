// StoreClient: blocking TCP client of the rendezvous store. Non-blocking socket plus
// poll() deadlines, so every call is bounded; connect retries until its timeout because
// the launcher's server may come up a moment after the agents (but not for a host name
// that does not exist); then challenge-response authentication and sealed frames.
#include "rendezvous/store.h"

#include "core/check.h"
#include "core/log.h"
#include "core/net_address.h"
#include "rendezvous/auth.h"
#include "rendezvous/protocol.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace dtrain::rendezvous {

using Clock = std::chrono::steady_clock;
using proto::Op;
using proto::Status;
using std::chrono::milliseconds;

namespace {

// Replies larger than this are treated as a corrupt stream, not allocated.
constexpr uint32_t kMaxReplyFrame = 1u << 30;

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// poll() one fd until deadline; false on timeout.
bool poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the following send/recv report the error
  }
}

std::string errno_text(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

// Timeouts are clamped to [0, 7 days] so deadline arithmetic cannot overflow.
milliseconds clamp_timeout(milliseconds t) {
  return std::clamp(t, milliseconds(0), milliseconds(static_cast<long long>(proto::kMaxTimeoutMs)));
}

std::string quoted(const std::string& key) { return "'" + key + "'"; }

std::string keys_text(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += fmt::format(", ... ({} keys)", keys.size());
  return out;
}

}  // namespace

// ----------------------------------------------------------------------------
// Connection setup.

StoreClient::StoreClient(const std::string& host, uint16_t port, const std::string& token, milliseconds connect_timeout)
    : endpoint_(host_port_text(address_unbracket(host), port)) {
  try {
    connect_until(Clock::now() + clamp_timeout(connect_timeout), address_unbracket(host), port);
    hello(token);
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::connect_until(Clock::time_point deadline, const std::string& host, uint16_t port) {
  const auto start = Clock::now();
  std::string last = "no attempt made";
  milliseconds backoff(20);
  const std::string service = std::to_string(port);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    if (gai != 0) {
      last = fmt::format("cannot resolve host '{}': {}", host, ::gai_strerror(gai));
      // The name does not exist: waiting cannot fix that, and the user should hear it now
      // rather than when the launcher gives up on this node's heartbeats.
      if (gai == EAI_NONAME || gai == EAI_FAIL)
        DT_THROW(CommError,
                 "cannot connect to the rendezvous store at {}: {}; check the rendezvous address (--master-addr)",
                 endpoint_, last);
    } else {
      std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
          last = errno_text(errno);
          continue;
        }
        int err = 0;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
          err = errno;
          if (err == EINPROGRESS) {
            // At least a few ms per attempt even when the overall deadline is (almost) up.
            const auto attempt_deadline = std::max(deadline, Clock::now() + milliseconds(5));
            if (!poll_until(fd, POLLOUT, attempt_deadline)) {
              err = ETIMEDOUT;
            } else {
              socklen_t len = sizeof(err);
              if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
            }
          }
        }
        if (err == 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          fd_ = fd;
          return;
        }
        ::close(fd);
        last = errno_text(err);
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
      DT_THROW(CommError,
               "cannot connect to the rendezvous store at {}: {} (retried for {} ms); check that the "
               "launcher is running and the address/port are reachable from this node",
               endpoint_, last, waited);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

// Challenge-response (protocol in store.h): only nonces and HMAC proofs cross the wire.
void StoreClient::hello(const std::string& token) {
  auto refused = [&](uint8_t status, const std::string& body) {
    proto::Reader rd(body);
    const std::string msg = rd.str();
    ::close(fd_);
    fd_ = -1;
    broken_ = "not authenticated";
    if (status == uint8_t(Status::AUTH_FAILED))
      DT_THROW(CommError,
               "rendezvous store at {} refused authentication ({}): this process was given a different job "
               "token than the launcher's",
               endpoint_, msg);
    DT_THROW(CommError, "rendezvous store at {} refused the connection: status {}", endpoint_, status);
  };
  const std::string client_nonce = proto::nonce_generate();
  uint8_t status = 0;
  std::string body = request(proto::Writer().u8(uint8_t(Op::HELLO)).str(client_nonce).u32(proto::kVersion).finish(),
                             "HELLO", "", milliseconds(0), &status);
  if (status != uint8_t(Status::OK)) refused(status, body);
  proto::Reader hello_rd(body);
  const std::string server_nonce = hello_rd.str();
  if (!hello_rd.ok() || !hello_rd.at_end() || server_nonce.size() != proto::kNonceBytes)
    fail("malformed reply to HELLO (is this a dtrain rendezvous store of the same version?)");
  proto::HandshakeKeys keys = proto::handshake_keys(token, client_nonce, server_nonce);
  body = request(proto::Writer().u8(uint8_t(Op::AUTH)).str(keys.client_proof).finish(), "AUTH", "", milliseconds(0),
                 &status);
  if (status != uint8_t(Status::OK)) refused(status, body);
  proto::Reader auth_rd(body);
  const std::string server_proof = auth_rd.str();
  if (!auth_rd.ok() || !auth_rd.at_end() || !proto::mac_equal(server_proof, keys.server_proof))
    fail(
        "authentication failed: the server did not prove that it holds the job token (something other than "
        "this job's launcher answers at this address)");
  auth_ = std::make_unique<proto::FrameAuth>(std::move(keys.session_key), proto::Dir::CLIENT_TO_SERVER);
}

// ----------------------------------------------------------------------------
// Framing over the socket.

void StoreClient::fail(const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  broken_ = what;
  DT_THROW(CommError, "rendezvous store at {}: {}", endpoint_, what);
}

void StoreClient::send_all(const std::string& data, Clock::time_point deadline, const char* op) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!poll_until(fd_, POLLOUT, deadline))
        fail(fmt::format("timed out sending {} ({} of {} bytes sent)", op, off, data.size()));
      continue;
    }
    fail(
        fmt::format("connection lost while sending {}: {} (the server may have stopped, or refused a "
                    "frame of {} bytes)",
                    op, errno_text(errno), data.size()));
  }
}

void StoreClient::recv_all(char* buf, size_t n, Clock::time_point deadline, const char* op) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd_, buf + off, n - off, 0);
    if (r > 0) {
      off += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) fail(fmt::format("the server closed the connection during {} (store stopped or job torn down)", op));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!poll_until(fd_, POLLIN, deadline)) fail(fmt::format("no reply to {} in time: server unresponsive", op));
      continue;
    }
    fail(fmt::format("connection lost during {}: {}", op, errno_text(errno)));
  }
}

std::string StoreClient::request(const std::string& frame, const char* op, const std::string& key, milliseconds extra,
                                 uint8_t* status) {
  if (fd_ < 0)
    DT_THROW(CommError, "rendezvous store at {}: connection unusable after an earlier failure: {}", endpoint_, broken_);
  const auto deadline = Clock::now() + request_timeout_ + extra;
  send_all(auth_ ? auth_->seal(frame) : frame, deadline, op);
  unsigned char hdr[4];
  recv_all(reinterpret_cast<char*>(hdr), 4, deadline, op);
  const uint32_t len = proto::load_be32(hdr);
  const uint32_t min_len = auth_ ? uint32_t(proto::kMacBytes) + 1 : 1;
  if (len < min_len || len > kMaxReplyFrame) fail(fmt::format("corrupt reply to {} (frame length {})", op, len));
  std::string payload(len, '\0');
  recv_all(payload.data(), len, deadline, op);
  if (auth_ && !auth_->open(len, payload))
    fail(fmt::format("the reply to {} failed authentication (altered or injected on the way)", op));
  *status = static_cast<uint8_t>(payload[0]);
  std::string body = payload.substr(1);
  if (*status == uint8_t(Status::ERROR)) {
    proto::Reader rd(body);
    const std::string msg = rd.str();
    DT_THROW(CommError, "rendezvous store at {} rejected {}{}: {}", endpoint_, op,
             key.empty() ? std::string() : " " + key, msg);
  }
  return body;
}

// ----------------------------------------------------------------------------
// Operations.

void StoreClient::set_request_timeout(milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  request_timeout_ = std::max(clamp_timeout(timeout), milliseconds(1));
}

void StoreClient::set(const std::string& key, std::string_view value) {
  const std::string frame = proto::Writer().u8(uint8_t(Op::SET)).str(key).str(value).finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  request(frame, "SET", quoted(key), milliseconds(0), &status);
  if (status != uint8_t(Status::OK)) fail(fmt::format("unexpected status {} for SET '{}'", status, key));
}

std::string StoreClient::get(const std::string& key, milliseconds timeout) {
  timeout = clamp_timeout(timeout);
  const uint64_t ms = static_cast<uint64_t>(timeout.count());
  const std::string frame = proto::Writer().u8(uint8_t(Op::GET)).str(key).u64(ms).finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  std::string body = request(frame, "GET", quoted(key), timeout, &status);
  if (status == uint8_t(Status::NOT_FOUND))
    DT_THROW(CommError,
             "get('{}') timed out after {} ms on the rendezvous store at {}: no process set that key "
             "(a peer may have failed or not started)",
             key, ms, endpoint_);
  proto::Reader rd(body);
  std::string value = rd.str();
  if (status != uint8_t(Status::OK) || !rd.ok() || !rd.at_end()) fail(fmt::format("malformed reply to GET '{}'", key));
  return value;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  const std::string frame = proto::Writer().u8(uint8_t(Op::ADD)).str(key).i64(delta).finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  std::string body = request(frame, "ADD", quoted(key), milliseconds(0), &status);
  proto::Reader rd(body);
  const int64_t v = rd.i64();
  if (status != uint8_t(Status::OK) || !rd.ok() || !rd.at_end()) fail(fmt::format("malformed reply to ADD '{}'", key));
  return v;
}

bool StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  timeout = clamp_timeout(timeout);
  const uint64_t ms = static_cast<uint64_t>(timeout.count());
  proto::Writer w;
  w.u8(uint8_t(Op::WAIT)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const std::string frame = w.u64(ms).finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  request(frame, "WAIT", keys_text(keys), timeout, &status);
  if (status == uint8_t(Status::OK)) return true;
  if (status == uint8_t(Status::TIMEOUT)) return false;
  fail(fmt::format("unexpected status {} for WAIT", status));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  proto::Writer w;
  w.u8(uint8_t(Op::CHECK)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const std::string frame = w.finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  std::string body = request(frame, "CHECK", keys_text(keys), milliseconds(0), &status);
  proto::Reader rd(body);
  const uint8_t present = rd.u8();
  if (status != uint8_t(Status::OK) || !rd.ok() || !rd.at_end()) fail("malformed reply to CHECK");
  return present != 0;
}

bool StoreClient::del(const std::string& key) {
  const std::string frame = proto::Writer().u8(uint8_t(Op::DELETE)).str(key).finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  std::string body = request(frame, "DELETE", quoted(key), milliseconds(0), &status);
  proto::Reader rd(body);
  const uint8_t existed = rd.u8();
  if (status != uint8_t(Status::OK) || !rd.ok() || !rd.at_end())
    fail(fmt::format("malformed reply to DELETE '{}'", key));
  return existed != 0;
}

void StoreClient::ping() {
  const std::string frame = proto::Writer().u8(uint8_t(Op::PING)).finish();
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  request(frame, "PING", "", milliseconds(0), &status);
  if (status != uint8_t(Status::OK)) fail(fmt::format("unexpected status {} for PING", status));
}

}  // namespace dtrain::rendezvous
