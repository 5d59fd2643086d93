// Store robustness: authentication, malformed/oversized/garbage/half-sent/stalled frames
// on raw sockets, connection caps, clean-up of blocked peers that leave, server stop and
// late start, and that the token never reaches a log line.
#include "rendezvous/auth.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store.h"

#include "core/error.h"
#include "core/log.h"
#include "eventually.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <fcntl.h>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace dtrain;
using namespace dtrain::rendezvous;
using dtrain::rendezvous::test::eventually;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// A raw TCP connection to the server for sending hand-made bytes.
class RawConn {
 public:
  explicit RawConn(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~RawConn() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Returns false when the peer already closed.
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  // Sends a whole frame, sealed with the session's MAC once hello() succeeded.
  bool send_frame(const std::string& frame) { return send(auth_.active() ? auth_.seal(frame) : frame); }
  // Reads one reply frame (its tag checked and stripped once authenticated): nullopt on
  // EOF/reset or timeout.
  std::optional<std::string> read_frame(std::chrono::milliseconds timeout = 5s) {
    std::string hdr;
    if (!read_exact(hdr, 4, timeout)) return std::nullopt;
    const uint32_t len = proto::load_be32(reinterpret_cast<const unsigned char*>(hdr.data()));
    std::string body;
    if (len == 0 || len > (1u << 20) || !read_exact(body, len, timeout)) return std::nullopt;
    if (auth_.active()) REQUIRE_MESSAGE(auth_.open(len, body), "a server reply failed authentication");
    return body;
  }
  // True when the server closes the connection within timeout (reading away any bytes).
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    char buf[256];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }
  // The client side of the challenge-response; afterwards frames are sealed.
  void hello(const std::string& token) {
    const std::string nonce = proto::nonce_generate();
    REQUIRE(send(proto::Writer().u8(uint8_t(proto::Op::HELLO)).str(nonce).u32(proto::kVersion).finish()));
    auto r = read_frame();
    REQUIRE(r.has_value());
    proto::Reader hello_rd(*r);
    REQUIRE(hello_rd.u8() == uint8_t(proto::Status::OK));
    auto keys = proto::handshake_keys(token, nonce, hello_rd.str());
    REQUIRE(send(proto::Writer().u8(uint8_t(proto::Op::AUTH)).str(keys.client_proof).finish()));
    r = read_frame();
    REQUIRE(r.has_value());
    proto::Reader auth_rd(*r);
    REQUIRE(auth_rd.u8() == uint8_t(proto::Status::OK));
    REQUIRE(proto::mac_equal(auth_rd.str(), keys.server_proof));
    auth_ = proto::FrameAuth(keys.session_key, proto::Dir::CLIENT_TO_SERVER);
  }

 private:
  bool read_exact(std::string& out, size_t n, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    out.resize(n);
    size_t off = 0;
    while (off < n) {
      pollfd p{fd_, POLLIN, 0};
      const int ms =
          static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (ms <= 0 || ::poll(&p, 1, ms) <= 0) return false;
      ssize_t r = ::recv(fd_, out.data() + off, n - off, 0);
      if (r <= 0) return false;
      off += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_ = -1;
  proto::FrameAuth auth_;
};

std::string frame_of(std::string payload) {
  std::string f(4, '\0');
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
  return f + payload;
}

uint8_t status_of(const std::optional<std::string>& reply) {
  REQUIRE(reply.has_value());
  return static_cast<uint8_t>((*reply)[0]);
}

struct Fixture {
  explicit Fixture(ServerLimits limits = {})
      : server("127.0.0.1", 0, token, limits), good("127.0.0.1", server.port(), token, 5s) {
    good.set("stable", "yes");
  }
  // The well-behaved client still works after whatever the test did.
  void check_serving() {
    CHECK(good.get("stable", 1s) == "yes");
    StoreClient fresh("127.0.0.1", server.port(), token, 5s);
    fresh.set("fresh", "ok");
    CHECK(good.get("fresh", 1s) == "ok");
  }
  std::string token = token_generate();
  StoreServer server;
  StoreClient good;
};

std::string uint16_text(uint16_t port) { return std::to_string(port); }

// A port that nothing listens on (was ephemeral a moment ago).
uint16_t free_port() {
  StoreServer s("127.0.0.1", 0, "t");
  return s.port();
}

}  // namespace

// ----------------------------------------------------------------------------

TEST_CASE("wrong token is refused with a clear CommError while a good client keeps working") {
  Fixture f;
  try {
    StoreClient bad("127.0.0.1", f.server.port(), token_generate(), 2s);
    FAIL("a wrong token must be refused");
  } catch (const CommError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("authentication") != std::string::npos);
    CHECK(msg.find("127.0.0.1:" + uint16_text(f.server.port())) != std::string::npos);
  }
  CHECK_THROWS_AS(StoreClient("127.0.0.1", f.server.port(), "", 2s), CommError);
  f.check_serving();
}

TEST_CASE("connection refused is reported as such, naming host:port") {
  const uint16_t port = free_port();
  try {
    StoreClient c("127.0.0.1", port, "t", 300ms);
    FAIL("nothing listens there");
  } catch (const CommError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("connection refused") != std::string::npos);
    CHECK(msg.find("127.0.0.1:" + uint16_text(port)) != std::string::npos);
    CHECK(msg.find("authentication") == std::string::npos);
  }
}

TEST_CASE("client connect retries until a late server appears") {
  const uint16_t port = free_port();
  const std::string token = token_generate();
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<StoreServer>("127.0.0.1", port, token);
  });
  StoreClient c("127.0.0.1", port, token, 10s);
  c.set("k", "v");
  CHECK(c.get("k", 1s) == "v");
  starter.join();
}

TEST_CASE("a first frame other than HELLO is refused and closed") {
  Fixture f;
  RawConn raw(f.server.port());
  REQUIRE(raw.send(proto::Writer().u8(uint8_t(proto::Op::PING)).finish()));
  CHECK(status_of(raw.read_frame()) == uint8_t(proto::Status::ERROR));
  CHECK(raw.closed_within(5s));
  f.check_serving();
}

TEST_CASE("malformed frames are refused and the connection closed") {
  Fixture f;
  const auto op = [](proto::Op o) { return static_cast<char>(o); };
  std::vector<std::pair<const char*, std::string>> cases = {
      {"unknown opcode", frame_of(std::string(1, char(99)))},
      {"opcode 0", frame_of(std::string(1, char(0)))},
      {"key length past the frame", frame_of(std::string(1, op(proto::Op::SET)) + std::string("\x00\x00\x10\x00k", 5))},
      {"value missing", frame_of(std::string(1, op(proto::Op::SET)) + std::string("\x00\x00\x00\x01k", 5))},
      {"GET without timeout", frame_of(std::string(1, op(proto::Op::GET)) + std::string("\x00\x00\x00\x01k", 5))},
      {"trailing bytes", frame_of(std::string(1, op(proto::Op::PING)) + "xx")},
      {"WAIT count past the frame", frame_of(std::string(1, op(proto::Op::WAIT)) + std::string("\x7f\xff\xff\xff", 4))},
      {"repeated HELLO",
       proto::Writer().u8(uint8_t(proto::Op::HELLO)).str(proto::nonce_generate()).u32(proto::kVersion).finish()},
      {"repeated AUTH", proto::Writer().u8(uint8_t(proto::Op::AUTH)).str(std::string(32, 'p')).finish()},
      {"empty payload", std::string(4, '\0')},  // sealed: only a tag
  };
  for (const auto& [name, bytes] : cases) {
    CAPTURE(name);
    RawConn raw(f.server.port());
    raw.hello(f.token);
    // Well-authenticated but malformed: the server must get as far as parsing them.
    REQUIRE(raw.send_frame(bytes));
    CHECK(status_of(raw.read_frame()) == uint8_t(proto::Status::ERROR));
    CHECK(raw.closed_within(5s));
  }
  f.check_serving();
  CHECK(f.good.check({"stable"}));
}

TEST_CASE("oversized length headers are refused before any allocation") {
  ServerLimits limits;
  limits.max_frame_bytes = 1 << 20;
  Fixture f(limits);
  {
    RawConn raw(f.server.port());
    raw.hello(f.token);
    REQUIRE(raw.send(std::string("\xff\xff\xff\xff", 4)));
    auto r = raw.read_frame();
    CHECK(status_of(r) == uint8_t(proto::Status::ERROR));
    CHECK(r->find("refused") != std::string::npos);
    CHECK(raw.closed_within(5s));
  }
  {
    // Before HELLO only a small frame is accepted.
    RawConn raw(f.server.port());
    REQUIRE(raw.send(std::string("\x00\x01\x00\x00", 4)));
    CHECK(status_of(raw.read_frame()) == uint8_t(proto::Status::ERROR));
    CHECK(raw.closed_within(5s));
  }
  // A client value past the limit fails that client with CommError, not the server.
  StoreClient c("127.0.0.1", f.server.port(), f.token, 5s);
  CHECK_THROWS_AS(c.set("huge", std::string((1 << 20) + 1, 'x')), CommError);
  f.check_serving();
}

TEST_CASE("garbage bytes and half-sent frames leave the server serving") {
  Fixture f;
  {
    RawConn raw(f.server.port());
    std::string junk;
    for (int i = 0; i < 64; ++i) junk.push_back(static_cast<char>((i * 73 + 11) & 0xff));
    REQUIRE(raw.send(junk));
    CHECK(raw.closed_within(5s));
  }
  {
    RawConn raw(f.server.port());
    raw.hello(f.token);
    const std::string full = proto::FrameAuth(std::string(32, 'k'), proto::Dir::CLIENT_TO_SERVER)
                                 .seal(proto::Writer().u8(uint8_t(proto::Op::SET)).str("half").str("value").finish());
    REQUIRE(raw.send(full.substr(0, full.size() / 2)));
    raw.close();
  }
  {
    RawConn raw(f.server.port());
    REQUIRE(raw.send(std::string("\x00\x00", 2)));  // half a length header
    raw.close();
  }
  CHECK(eventually([&] { return f.server.connection_count() == 1; }));
  f.check_serving();
  CHECK_FALSE(f.good.check({"half"}));
}

TEST_CASE("connections stalled mid-frame or silent before HELLO are closed at the deadline") {
  ServerLimits limits;
  limits.frame_timeout = 300ms;
  limits.hello_timeout = 300ms;
  Fixture f(limits);
  {
    RawConn silent(f.server.port());
    CHECK(silent.closed_within(5s));
  }
  {
    RawConn raw(f.server.port());
    raw.hello(f.token);
    const std::string full = proto::Writer().u8(uint8_t(proto::Op::SET)).str("stall").str("value").finish();
    REQUIRE(raw.send(full.substr(0, 7)));
    CHECK(raw.closed_within(5s));
  }
  {
    // An authenticated connection may idle between frames longer than the frame timeout.
    StoreClient idle("127.0.0.1", f.server.port(), f.token, 5s);
    std::this_thread::sleep_for(600ms);
    idle.ping();
  }
  f.check_serving();
}

TEST_CASE("the connection cap refuses extra connections with a clear error") {
  ServerLimits limits;
  limits.max_connections = 2;
  Fixture f(limits);  // the good client is connection 1
  {
    StoreClient second("127.0.0.1", f.server.port(), f.token, 5s);
    try {
      StoreClient third("127.0.0.1", f.server.port(), f.token, 2s);
      FAIL("the third connection must be refused");
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("too many connections") != std::string::npos);
    }
    second.ping();
  }
  // Closing `second` frees its slot: check_serving opens a fresh client.
  CHECK(eventually([&] { return f.server.connection_count() == 1; }));
  f.check_serving();
}

TEST_CASE("a blocked client that disconnects is cleaned up on the server") {
  Fixture f;
  {
    RawConn raw(f.server.port());
    raw.hello(f.token);
    REQUIRE(raw.send_frame(proto::Writer().u8(uint8_t(proto::Op::GET)).str("nobody").u64(60000).finish()));
    RawConn raw2(f.server.port());
    raw2.hello(f.token);
    REQUIRE(raw2.send_frame(
        proto::Writer().u8(uint8_t(proto::Op::WAIT)).u32(2).str("nobody").str("x").u64(60000).finish()));
    CHECK(eventually([&] { return f.server.waiter_count() == 2; }));
  }
  CHECK(eventually([&] { return f.server.waiter_count() == 0 && f.server.connection_count() == 1; }));
  f.good.set("nobody", "late");  // waking nobody must not touch freed waiters
  f.check_serving();
}

TEST_CASE("server stop while clients wait: every waiter gets CommError, no hang") {
  const std::string token = token_generate();
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, token);
  const uint16_t port = server->port();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      StoreClient c("127.0.0.1", port, token, 5s);
      try {
        if (i % 2) c.get("never", 60s);
        else c.wait({"never"}, 60s);
      } catch (const CommError& e) {
        if (std::string(e.what()).find("closed the connection") != std::string::npos) ++errors;
      }
    });
  REQUIRE(eventually([&] { return server->waiter_count() == 4; }));
  const auto t0 = Clock::now();
  server->stop();
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 4);
  CHECK(Clock::now() - t0 < 10s);
  server.reset();
}

TEST_CASE("an idle client notices a vanished server quickly and stays failed") {
  const std::string token = token_generate();
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, token);
  StoreClient c("127.0.0.1", server->port(), token, 5s);
  c.ping();
  server.reset();
  CHECK_THROWS_AS(c.ping(), CommError);
  try {
    c.set("k", "v");
    FAIL("a broken client must keep failing");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find("earlier failure") != std::string::npos);
  }
}

TEST_CASE("no log line contains the token") {
  const std::string token = token_generate();
  const std::string wrong = token_generate();
  char path[] = "/tmp/dtrain_rdzv_log_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const LogLevel old_level = log_level();
  log_set_level(LogLevel::DEBUG);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  {
    StoreServer server("127.0.0.1", 0, token);
    StoreClient good("127.0.0.1", server.port(), token, 5s);
    good.set("k", "v");
    try {
      StoreClient bad("127.0.0.1", server.port(), wrong, 2s);
    } catch (const CommError& e) {
      log_error("{}", e.what());  // what a caller would print
    }
    RawConn raw(server.port());
    raw.send(frame_of(std::string(1, char(99))));
    raw.closed_within(2s);
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  log_set_level(old_level);
  std::string logged;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) logged.append(buf, static_cast<size_t>(n));
  ::close(fd);
  ::unlink(path);
  CHECK(logged.find("wrong job token") != std::string::npos);  // the refusal was logged...
  CHECK(logged.find(token) == std::string::npos);              // ...without either token
  CHECK(logged.find(wrong) == std::string::npos);
}
