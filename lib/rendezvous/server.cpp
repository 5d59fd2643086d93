// StoreServer: Boost.Asio TCP key-value server on its own io thread, one C++20 coroutine
// per connection plus a watchdog coroutine that closes connections stalled mid-frame or
// slow to authenticate. Each connection authenticates by challenge-response and then
// MACs every frame (rendezvous/auth.h). Blocked GET/WAIT requests sleep on a timer that
// SET/ADD cancel (no polling); an async wait on the socket notices a peer that leaves.
#include "rendezvous/store.h"

#include "core/check.h"
#include "core/log.h"
#include "core/net_address.h"
#include "rendezvous/auth.h"
#include "rendezvous/protocol.h"
#include "rendezvous/warn_limit.h"

#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it
#include <boost/asio.hpp>

#include <atomic>
#include <charconv>
#include <netdb.h>
#include <sys/socket.h>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace dtrain::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using proto::Op;
using proto::Status;

namespace {

struct Entry {
  std::string value;
  Clock::time_point set_at;
};

// One blocked GET/WAIT. Shared with the socket-readable handler, which may run after the
// request has finished; timer is nulled then.
struct WaitState {
  asio::steady_timer* timer = nullptr;
  bool peer_event = false;
};

struct Conn {
  explicit Conn(tcp::socket s) : sock(std::move(s)), deadline(sock.get_executor()) {}
  tcp::socket sock;
  asio::steady_timer deadline;  // enforced by the watchdog; max() while idle or blocked
  enum class Phase { HELLO, AUTH, READY } phase = Phase::HELLO;
  bool authed = false;        // phase == READY: frames are sealed both ways
  proto::HandshakeKeys keys;  // between HELLO and AUTH
  proto::FrameAuth auth;      // after AUTH
  std::string peer;
};

enum class WaitResult { READY, TIMEOUT, PEER_GONE };

// An empty frame means "close without replying" (the peer is gone).
struct Reply {
  std::string frame;
  bool close = false;
};

Reply reply_ok() { return {proto::Writer().u8(uint8_t(Status::OK)).finish()}; }
Reply reply_status(Status s) { return {proto::Writer().u8(uint8_t(s)).finish()}; }
Reply reply_error(Status s, std::string_view msg, bool close) {
  return {proto::Writer().u8(uint8_t(s)).str(msg).finish(), close};
}

std::string peer_name(const tcp::socket& sock) {
  boost::system::error_code ec;
  auto ep = sock.remote_endpoint(ec);
  if (ec) return "unknown peer";
  return host_port_text(ep.address().to_string(), ep.port());
}

// Warnings an outsider can cause: this many of each kind per interval in full.
constexpr size_t kWarnBurst = 5;
constexpr std::chrono::milliseconds kWarnInterval{10000};

Clock::time_point deadline_after(uint64_t timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, proto::kMaxTimeoutMs));
}

void log_handler_failure(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    log_error("rendezvous: store connection handler failed: {}", ex.what());
  }
}

}  // namespace

// ----------------------------------------------------------------------------

struct StoreServer::Impl {
  // Everything a coroutine frame touches while being destroyed is declared before io.
  std::string token;
  ServerLimits limits;
  mutable std::mutex mu;  // guards data: heartbeats() reads it from other threads
  std::unordered_map<std::string, Entry> data;
  std::unordered_map<std::string, std::vector<WaitState*>> waiters;  // io thread only
  std::unordered_set<Conn*> conns;                                   // io thread only
  std::atomic<size_t> n_conns{0};
  std::atomic<size_t> n_waiters{0};
  bool stopping = false;  // io thread only
  // What outsiders cause (refused and closed connections) is logged through this: a
  // few lines per kind per interval, then a count (io thread only).
  WarnLimiter warn_limit{kWarnBurst, kWarnInterval, [](const std::string& line) { log_warn("{}", line); }};
  asio::steady_timer* warn_timer = nullptr;  // the flush loop's, while it runs (io thread only)
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  uint16_t port = 0;
  std::mutex stop_mu;
  std::thread thread;

  void peer_warn(const std::string& kind, const std::string& line) { warn_limit.warn(kind, line); }
  asio::awaitable<void> warn_flush_loop();
  asio::awaitable<void> accept_loop();
  asio::awaitable<void> session(std::shared_ptr<Conn> c);
  asio::awaitable<void> watchdog(std::shared_ptr<Conn> c);
  asio::awaitable<Reply> handle(Conn& c, const std::string& body);
  asio::awaitable<WaitResult> await_keys(Conn& c, std::vector<std::string> keys, Clock::time_point deadline);
  Reply handle_hello(Conn& c, proto::Reader& rd);
  Reply handle_auth(Conn& c, proto::Reader& rd);
  Reply handle_add(const std::string& key, int64_t delta);
  Reply handle_set(Conn& c, proto::Reader& rd);
  asio::awaitable<Reply> handle_get(Conn& c, proto::Reader& rd);
  asio::awaitable<Reply> handle_wait(Conn& c, proto::Reader& rd);
  Reply handle_check(Conn& c, proto::Reader& rd);
  Reply handle_delete(Conn& c, proto::Reader& rd);
  // Warns about the peer and answers with an error that closes the connection.
  Reply malformed(Conn& c, const char* what);
  bool keys_present(const std::vector<std::string>& keys) const;
  void wake(const std::string& key);
  void close_all();
};

void StoreServer::Impl::wake(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  for (WaitState* w : it->second)
    if (w->timer) w->timer->cancel();
}

bool StoreServer::Impl::keys_present(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& k : keys)
    if (!data.count(k)) return false;
  return true;
}

// Writes each interval's summary even when the flood has stopped (warn() alone would
// write it only with the next warning).
asio::awaitable<void> StoreServer::Impl::warn_flush_loop() {
  asio::steady_timer timer(io);
  warn_timer = &timer;
  while (!stopping) {
    timer.expires_after(kWarnInterval);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    warn_limit.flush(Clock::now(), stopping);
  }
  warn_timer = nullptr;
}

void StoreServer::Impl::close_all() {
  stopping = true;
  if (warn_timer) warn_timer->cancel();
  boost::system::error_code ec;
  acceptor.close(ec);
  for (Conn* c : conns) {
    c->sock.close(ec);
    c->deadline.cancel();
  }
  for (auto& [key, list] : waiters)
    for (WaitState* w : list)
      if (w->timer) w->timer->cancel();
}

// ----------------------------------------------------------------------------
// Accepting and the per-connection loop.

asio::awaitable<void> StoreServer::Impl::accept_loop() {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket sock = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping || ec == asio::error::operation_aborted) co_return;
    if (ec) {
      // EMFILE and friends: back off instead of spinning, keep serving existing clients.
      peer_warn("accept failed", fmt::format("rendezvous: accept failed: {}", ec.message()));
      asio::steady_timer pause(io, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    if (n_conns.load() >= limits.max_connections) {
      peer_warn("refused: too many connections",
                fmt::format("rendezvous: refused connection from {}: {} connections open (limit {})", peer_name(sock),
                            n_conns.load(), limits.max_connections));
      // Best effort: the refusal is a few bytes and fits in any socket buffer.
      const std::string f =
          reply_error(Status::ERROR, "server full: too many connections to the rendezvous store", true).frame;
      [[maybe_unused]] ssize_t r = ::send(sock.native_handle(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      sock.close(ec);
      continue;
    }
    ++n_conns;
    asio::co_spawn(io, session(std::make_shared<Conn>(std::move(sock))), log_handler_failure);
  }
}

asio::awaitable<void> StoreServer::Impl::watchdog(std::shared_ptr<Conn> c) {
  while (c->sock.is_open()) {
    if (c->deadline.expiry() <= Clock::now()) {
      const char* why =
          c->authed ? "frame stalled past the frame timeout" : "not authenticated within the hello timeout";
      peer_warn(why, fmt::format("rendezvous: closing connection from {}: {}", c->peer, why));
      boost::system::error_code ec;
      c->sock.close(ec);
      co_return;
    }
    boost::system::error_code ec;
    co_await c->deadline.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

asio::awaitable<void> StoreServer::Impl::session(std::shared_ptr<Conn> c) {
  struct Registration {
    Impl& s;
    Conn* c;
    Registration(Impl& s_, Conn* c_) : s(s_), c(c_) { s.conns.insert(c); }
    ~Registration() {
      s.conns.erase(c);
      --s.n_conns;
    }
  } registration(*this, c.get());
  if (stopping) co_return;
  c->peer = peer_name(c->sock);
  boost::system::error_code ec;
  c->sock.set_option(tcp::no_delay(true), ec);
  c->deadline.expires_after(limits.hello_timeout);
  asio::co_spawn(io, watchdog(c), log_handler_failure);
  try {
    for (;;) {
      unsigned char hdr[4];
      // An authenticated connection may idle between frames; a started frame must finish.
      if (c->authed) c->deadline.expires_at(Clock::time_point::max());
      co_await asio::async_read(c->sock, asio::buffer(hdr, 1), asio::use_awaitable);
      if (c->authed) c->deadline.expires_after(limits.frame_timeout);
      co_await asio::async_read(c->sock, asio::buffer(hdr + 1, 3), asio::use_awaitable);
      const uint32_t len = proto::load_be32(hdr);
      const uint32_t max_len = c->authed ? limits.max_frame_bytes : proto::kMaxHelloFrame;
      // Decided before handling: the reply to AUTH is the last unsealed frame.
      const bool sealed = c->authed;
      const uint32_t min_len = sealed ? uint32_t(proto::kMacBytes) + 1 : 1;
      Reply reply;
      if (len < min_len || len > max_len) {
        peer_warn("oversized frame", fmt::format("rendezvous: closing connection from {}: frame of {} bytes (limit {})",
                                                 c->peer, len, max_len));
        reply = reply_error(
            Status::ERROR, fmt::format("frame of {} bytes refused: frames must be {}..{} bytes", len, min_len, max_len),
            true);
      } else {
        std::string body(len, '\0');
        co_await asio::async_read(c->sock, asio::buffer(body), asio::use_awaitable);
        // A blocked GET/WAIT may legitimately take long: no frame deadline meanwhile.
        c->deadline.expires_at(Clock::time_point::max());
        if (sealed && !c->auth.open(len, body)) {
          // Forged, altered, replayed or reordered: nothing this peer sends can be trusted
          // any more, and an error reply would only help it probe. Other connections are
          // untouched.
          peer_warn("frame failed authentication",
                    fmt::format("rendezvous: closing connection from {}: a frame failed authentication (altered, "
                                "replayed or out of order)",
                                c->peer));
          break;
        }
        reply = co_await handle(*c, body);
      }
      if (reply.frame.empty()) break;
      if (sealed) reply.frame = c->auth.seal(std::move(reply.frame));
      // A peer that does not read its reply stalls the frame too.
      c->deadline.expires_after(limits.frame_timeout);
      co_await asio::async_write(c->sock, asio::buffer(reply.frame), asio::use_awaitable);
      if (reply.close) {
        c->sock.shutdown(tcp::socket::shutdown_send, ec);
        break;
      }
    }
  } catch (const boost::system::system_error& e) {
    // EOF, a reset, or the watchdog / stop() closed the socket: the connection just ends.
    log_debug("rendezvous: connection from {} ended: {}", c->peer, e.code().message());
  }
  c->sock.close(ec);
  c->deadline.cancel();
}

// ----------------------------------------------------------------------------
// Requests.

asio::awaitable<WaitResult> StoreServer::Impl::await_keys(Conn& c, std::vector<std::string> keys,
                                                          Clock::time_point deadline) {
  if (keys_present(keys)) co_return WaitResult::READY;
  asio::steady_timer timer(io);
  auto state = std::make_shared<WaitState>();
  state->timer = &timer;
  struct Registration {
    Impl& s;
    const std::vector<std::string>& keys;
    WaitState* w;
    Registration(Impl& s_, const std::vector<std::string>& k, WaitState* w_) : s(s_), keys(k), w(w_) {
      for (const auto& key : keys) s.waiters[key].push_back(w);
      ++s.n_waiters;
    }
    ~Registration() {
      for (const auto& key : keys) {
        auto it = s.waiters.find(key);
        if (it == s.waiters.end()) continue;
        std::erase(it->second, w);
        if (it->second.empty()) s.waiters.erase(it);
      }
      --s.n_waiters;
    }
  } registration(*this, keys, state.get());
  // The client sends nothing while blocked, so readable means EOF/reset (or a protocol
  // violation): either way this connection is done.
  c.sock.async_wait(tcp::socket::wait_read, [state](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    state->peer_event = true;
    if (state->timer) state->timer->cancel();
  });
  WaitResult result = WaitResult::TIMEOUT;
  for (;;) {
    if (keys_present(keys)) {
      result = WaitResult::READY;
      break;
    }
    if (state->peer_event || stopping || !c.sock.is_open()) {
      result = WaitResult::PEER_GONE;
      break;
    }
    if (Clock::now() >= deadline) break;
    timer.expires_at(deadline);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  state->timer = nullptr;
  boost::system::error_code ec;
  c.sock.cancel(ec);
  if (result == WaitResult::PEER_GONE) log_debug("rendezvous: {} left while blocked", c.peer);
  co_return result;
}

// HELLO carries the client's nonce; the reply carries ours. Neither reveals the token.
Reply StoreServer::Impl::handle_hello(Conn& c, proto::Reader& rd) {
  const std::string client_nonce = rd.str();
  const uint32_t version = rd.u32();
  if (!rd.ok() || !rd.at_end()) {
    peer_warn("malformed HELLO", fmt::format("rendezvous: refused connection from {}: malformed HELLO", c.peer));
    return reply_error(Status::ERROR, "malformed HELLO frame", true);
  }
  if (version != proto::kVersion) {
    peer_warn("protocol version",
              fmt::format("rendezvous: refused connection from {}: protocol version {}", c.peer, version));
    return reply_error(Status::ERROR,
                       fmt::format("protocol version {} not supported (server speaks {}): run the same dtrain "
                                   "version on every node",
                                   version, proto::kVersion),
                       true);
  }
  if (client_nonce.size() != proto::kNonceBytes) {
    peer_warn("malformed HELLO", fmt::format("rendezvous: refused connection from {}: HELLO nonce of {} bytes", c.peer,
                                             client_nonce.size()));
    return reply_error(Status::ERROR, "malformed HELLO frame: bad nonce", true);
  }
  const std::string server_nonce = proto::nonce_generate();
  c.keys = proto::handshake_keys(token, client_nonce, server_nonce);
  c.phase = Conn::Phase::AUTH;
  return {proto::Writer().u8(uint8_t(Status::OK)).str(server_nonce).finish()};
}

// AUTH carries the client's proof of the token; the reply carries ours, so the client
// also knows it talks to the launcher before it sends a request.
Reply StoreServer::Impl::handle_auth(Conn& c, proto::Reader& rd) {
  const std::string proof = rd.str();
  if (!rd.ok() || !rd.at_end()) {
    peer_warn("malformed AUTH", fmt::format("rendezvous: refused connection from {}: malformed AUTH", c.peer));
    return reply_error(Status::ERROR, "malformed AUTH frame", true);
  }
  if (!proto::mac_equal(proof, c.keys.client_proof)) {
    peer_warn("wrong job token", fmt::format("rendezvous: refused connection from {}: wrong job token", c.peer));
    return reply_error(Status::AUTH_FAILED, "authentication refused: wrong job token", true);
  }
  Reply ok{proto::Writer().u8(uint8_t(Status::OK)).str(c.keys.server_proof).finish()};
  c.auth = proto::FrameAuth(std::move(c.keys.session_key), proto::Dir::SERVER_TO_CLIENT);
  c.keys = {};
  c.phase = Conn::Phase::READY;
  c.authed = true;
  return ok;
}

Reply StoreServer::Impl::handle_add(const std::string& key, int64_t delta) {
  int64_t next = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = data.find(key);
    int64_t cur = 0;
    if (it != data.end()) {
      const std::string& v = it->second.value;
      auto [end, err] = std::from_chars(v.data(), v.data() + v.size(), cur);
      if (err != std::errc() || end != v.data() + v.size())
        return reply_error(Status::ERROR, fmt::format("ADD on key '{}': its value is not a decimal integer", key),
                           false);
    }
    if (__builtin_add_overflow(cur, delta, &next))
      return reply_error(Status::ERROR, fmt::format("ADD on key '{}': {} + {} overflows int64", key, cur, delta),
                         false);
    data[key] = Entry{std::to_string(next), Clock::now()};
  }
  wake(key);
  return {proto::Writer().u8(uint8_t(Status::OK)).i64(next).finish()};
}

Reply StoreServer::Impl::malformed(Conn& c, const char* what) {
  peer_warn("malformed frame", fmt::format("rendezvous: closing connection from {}: malformed {} frame", c.peer, what));
  return reply_error(Status::ERROR, fmt::format("malformed {} frame", what), true);
}

namespace {
void read_keys(proto::Reader& rd, std::vector<std::string>& keys) {
  const uint32_t n = rd.u32();
  if (n > rd.remaining() / 4) {  // each key takes at least its 4-byte length
    rd.fail();
    return;
  }
  keys.reserve(n);
  for (uint32_t i = 0; i < n && rd.ok(); ++i) keys.push_back(rd.str());
}
}  // namespace

Reply StoreServer::Impl::handle_set(Conn& c, proto::Reader& rd) {
  std::string key = rd.str();
  std::string value = rd.str();
  if (!rd.ok() || !rd.at_end()) return malformed(c, "SET");
  {
    std::lock_guard<std::mutex> lock(mu);
    data[key] = Entry{std::move(value), Clock::now()};
  }
  wake(key);
  return reply_ok();
}

asio::awaitable<Reply> StoreServer::Impl::handle_get(Conn& c, proto::Reader& rd) {
  std::string key = rd.str();
  const uint64_t timeout_ms = rd.u64();
  if (!rd.ok() || !rd.at_end()) co_return malformed(c, "GET");
  std::vector<std::string> keys{key};
  const WaitResult w = co_await await_keys(c, std::move(keys), deadline_after(timeout_ms));
  if (w == WaitResult::PEER_GONE) co_return Reply{};
  if (w == WaitResult::TIMEOUT) co_return reply_status(Status::NOT_FOUND);
  std::string frame;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = data.find(key);
    if (it != data.end()) frame = proto::Writer().u8(uint8_t(Status::OK)).str(it->second.value).finish();
  }
  if (frame.empty()) co_return reply_status(Status::NOT_FOUND);
  co_return Reply{std::move(frame)};
}

asio::awaitable<Reply> StoreServer::Impl::handle_wait(Conn& c, proto::Reader& rd) {
  std::vector<std::string> keys;
  read_keys(rd, keys);
  const uint64_t timeout_ms = rd.u64();
  if (!rd.ok() || !rd.at_end()) co_return malformed(c, "WAIT");
  const WaitResult w = co_await await_keys(c, std::move(keys), deadline_after(timeout_ms));
  if (w == WaitResult::PEER_GONE) co_return Reply{};
  co_return reply_status(w == WaitResult::READY ? Status::OK : Status::TIMEOUT);
}

Reply StoreServer::Impl::handle_check(Conn& c, proto::Reader& rd) {
  std::vector<std::string> keys;
  read_keys(rd, keys);
  if (!rd.ok() || !rd.at_end()) return malformed(c, "CHECK");
  const bool present = keys_present(keys);
  return Reply{proto::Writer().u8(uint8_t(Status::OK)).u8(present ? 1 : 0).finish()};
}

Reply StoreServer::Impl::handle_delete(Conn& c, proto::Reader& rd) {
  std::string key = rd.str();
  if (!rd.ok() || !rd.at_end()) return malformed(c, "DELETE");
  bool existed;
  {
    std::lock_guard<std::mutex> lock(mu);
    existed = data.erase(key) > 0;
  }
  return Reply{proto::Writer().u8(uint8_t(Status::OK)).u8(existed ? 1 : 0).finish()};
}

asio::awaitable<Reply> StoreServer::Impl::handle(Conn& c, const std::string& body) {
  proto::Reader rd(body);
  const uint8_t code = rd.u8();
  if (c.phase == Conn::Phase::HELLO) {
    if (code == uint8_t(Op::HELLO)) co_return handle_hello(c, rd);
    peer_warn("first frame not HELLO",
              fmt::format("rendezvous: refused connection from {}: first frame is not HELLO", c.peer));
    co_return reply_error(Status::ERROR, "first frame must be HELLO (authenticate first)", true);
  }
  if (c.phase == Conn::Phase::AUTH) {
    if (code == uint8_t(Op::AUTH)) co_return handle_auth(c, rd);
    peer_warn("second frame not AUTH",
              fmt::format("rendezvous: refused connection from {}: second frame is not AUTH", c.peer));
    co_return reply_error(Status::ERROR, "second frame must be AUTH (authenticate first)", true);
  }
  switch (static_cast<Op>(code)) {
    case Op::SET: co_return handle_set(c, rd);
    case Op::GET: co_return co_await handle_get(c, rd);
    case Op::ADD: {
      std::string key = rd.str();
      const int64_t delta = rd.i64();
      if (!rd.ok() || !rd.at_end()) co_return malformed(c, "ADD");
      co_return handle_add(key, delta);
    }
    case Op::WAIT: co_return co_await handle_wait(c, rd);
    case Op::CHECK: co_return handle_check(c, rd);
    case Op::DELETE: co_return handle_delete(c, rd);
    case Op::PING:
      if (!rd.at_end()) co_return malformed(c, "PING");
      co_return reply_ok();
    case Op::HELLO: co_return malformed(c, "repeated HELLO");
    case Op::AUTH: co_return malformed(c, "repeated AUTH");
  }
  peer_warn("unknown opcode", fmt::format("rendezvous: closing connection from {}: unknown opcode {}", c.peer, code));
  co_return reply_error(Status::ERROR, fmt::format("unknown opcode {}", code), true);
}

// ----------------------------------------------------------------------------
// Public API.

StoreServer::StoreServer(const std::string& bind_address, uint16_t port, std::string token, ServerLimits limits)
    : impl_(std::make_unique<Impl>()) {
  DT_ENFORCE(!token.empty(), UsageError, "the rendezvous store needs a non-empty job token");
  DT_ENFORCE_GT(limits.max_connections, 0u, UsageError, "rendezvous ServerLimits");
  DT_ENFORCE_GE(limits.max_frame_bytes, proto::kMaxHelloFrame, UsageError, "rendezvous ServerLimits");
  impl_->token = std::move(token);
  impl_->limits = limits;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(bind_address, ec);
  if (ec)
    DT_THROW(CommError, "rendezvous store: bind address '{}' is not an IP address ({}); use e.g. 0.0.0.0 or 127.0.0.1",
             bind_address, ec.message());
  const tcp::endpoint ep(address, port);
  auto& acc = impl_->acceptor;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    DT_THROW(CommError, "rendezvous store cannot listen on {}: {} ({})", host_port_text(bind_address, port),
             ec.message(),
             ec == boost::system::errc::address_not_available
                 ? "that address is not this machine's: give one of its addresses as --master-addr or "
                   "cluster.rendezvous.address, or leave it unset"
                 : "pick another port or free this one");
  impl_->port = acc.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->accept_loop(), log_handler_failure);
  asio::co_spawn(impl_->io, impl_->warn_flush_loop(), log_handler_failure);
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->io.run();
    } catch (const std::exception& e) {
      log_error("rendezvous: store io thread failed: {}", e.what());
    }
  });
  log_debug("rendezvous: store listening on {}", host_port_text(bind_address, impl_->port));
}

StoreServer::~StoreServer() { stop(); }

std::string store_listen_address(const std::string& advertised_text, bool remote_nodes) {
  const std::string advertised = address_unbracket(advertised_text);
  boost::system::error_code ec;
  asio::ip::make_address(advertised, ec);
  if (!ec) return advertised;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(advertised.c_str(), nullptr, &hints, &res);
  if (gai != 0)
    DT_THROW(CommError,
             "cannot resolve host '{}', the rendezvous address the nodes were to dial (--master-addr / "
             "cluster.rendezvous.address): {}",
             advertised, ::gai_strerror(gai));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  char text[NI_MAXHOST];
  DT_ENFORCE(::getnameinfo(res->ai_addr, res->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0,
             CommError, "cannot print the address that '{}' resolves to", advertised);
  // A name that is loopback only here (Debian's "127.0.1.1 <hostname>" in /etc/hosts)
  // while other nodes resolve it to this host's network address: listening on loopback
  // would shut them out, so the store listens on every interface of that family.
  const asio::ip::address resolved = asio::ip::make_address(text, ec);
  if (!ec && resolved.is_loopback() && remote_nodes) {
    log_warn(
        "--master-addr '{}' resolves to the loopback address {} on this host, which other nodes cannot reach: "
        "the rendezvous store listens on every interface (give this host's network address as --master-addr "
        "to restrict it)",
        advertised, text);
    return resolved.is_v6() ? "::" : "0.0.0.0";
  }
  return text;
}

uint16_t StoreServer::port() const { return impl_->port; }

void StoreServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (!impl_->thread.joinable()) return;
  asio::post(impl_->io, [impl = impl_.get()] { impl->close_all(); });
  impl_->thread.join();
}

std::map<std::string, Clock::time_point> StoreServer::heartbeats(const std::string& prefix) const {
  std::map<std::string, Clock::time_point> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [key, entry] : impl_->data)
    if (key.size() >= prefix.size() && key.compare(0, prefix.size(), prefix) == 0)
      out.emplace(key.substr(prefix.size()), entry.set_at);
  return out;
}

std::map<std::string, StoreServer::Stamped> StoreServer::entries(const std::string& prefix) const {
  std::map<std::string, Stamped> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [key, entry] : impl_->data)
    if (key.size() >= prefix.size() && key.compare(0, prefix.size(), prefix) == 0)
      out.emplace(key.substr(prefix.size()), Stamped{entry.value, entry.set_at});
  return out;
}

size_t StoreServer::connection_count() const { return impl_->n_conns.load(); }
size_t StoreServer::waiter_count() const { return impl_->n_waiters.load(); }

}  // namespace dtrain::rendezvous
