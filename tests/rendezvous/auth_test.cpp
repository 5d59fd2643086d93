// Store authentication: the challenge-response (right token, wrong token, a server that
// does not know the token), frames replayed, altered, duplicated or reflected through a
// TCP relay, and that the token never appears in the bytes a client sends.
#include "rendezvous/auth.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store.h"

#include "core/error.h"
#include "eventually.h"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

using namespace dtrain;
using namespace dtrain::rendezvous;
using dtrain::rendezvous::test::eventually;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

int listen_loopback(uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Splits whole frames (u32 length | body) off the front of buf.
std::vector<std::string> take_frames(std::string& buf) {
  std::vector<std::string> out;
  while (buf.size() >= 4) {
    const size_t len = proto::load_be32(reinterpret_cast<const unsigned char*>(buf.data()));
    if (buf.size() < 4 + len) break;
    out.push_back(buf.substr(0, 4 + len));
    buf.erase(0, 4 + len);
  }
  return out;
}

// A TCP relay between clients and the store, one connection at a time, frame by frame.
// Each frame passes through a hook (direction, index of the frame in its direction) that
// returns the bytes to forward instead; the client's bytes are recorded as sent.
class Relay {
 public:
  using Hook = std::function<std::string(proto::Dir, int, const std::string&)>;
  Relay(uint16_t server_port, Hook hook = {}) : server_port_(server_port), hook_(std::move(hook)) {
    listen_fd_ = listen_loopback(&port_);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  // Every byte clients sent so far, and the frames of the last connection.
  std::string client_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return client_bytes_;
  }
  std::vector<std::string> client_frames() {
    std::lock_guard<std::mutex> lock(mu_);
    return client_frames_;
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      int s = connect_loopback(server_port_);
      if (s >= 0) pump(c, s);
      ::close(c);
      if (s >= 0) ::close(s);
    }
  }
  void pump(int c, int s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      client_frames_.clear();
    }
    std::string from_client, from_server;
    int n_c2s = 0, n_s2c = 0;
    while (!stop_) {
      pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      char buf[65536];
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) return;  // either side closed: drop both
        const proto::Dir dir = i == 0 ? proto::Dir::CLIENT_TO_SERVER : proto::Dir::SERVER_TO_CLIENT;
        std::string& pending = i == 0 ? from_client : from_server;
        pending.append(buf, static_cast<size_t>(n));
        for (std::string& f : take_frames(pending)) {
          if (i == 0) {
            std::lock_guard<std::mutex> lock(mu_);
            client_bytes_ += f;
            client_frames_.push_back(f);
          }
          const int index = i == 0 ? n_c2s++ : n_s2c++;
          const std::string out = hook_ ? hook_(dir, index, f) : f;
          if (!send_all(i == 0 ? s : c, out)) return;
        }
      }
    }
  }

  uint16_t server_port_;
  Hook hook_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string client_bytes_;
  std::vector<std::string> client_frames_;
  std::thread thread_;
};

// True when the peer closes fd within timeout (reading away any bytes).
bool closed_within(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

struct Fixture {
  std::string token = token_generate();
  StoreServer server{"127.0.0.1", 0, token};
  StoreClient good{"127.0.0.1", server.port(), token, 5s};
  // The well-behaved client and a new one still work after whatever the test did.
  void check_serving() {
    good.set("serving", "yes");
    StoreClient fresh("127.0.0.1", server.port(), token, 5s);
    CHECK(fresh.get("serving", 1s) == "yes");
  }
};

std::string flip_last_byte(std::string frame) {
  frame.back() = static_cast<char>(frame.back() ^ 0x01);
  return frame;
}

}  // namespace

// ----------------------------------------------------------------------------

TEST_CASE("the right token authenticates, and both sides derive the same keys") {
  Fixture f;
  StoreClient c("127.0.0.1", f.server.port(), f.token, 5s);
  c.set("k", std::string("binary\0value", 12));
  CHECK(f.good.get("k", 1s) == std::string("binary\0value", 12));
  CHECK(c.add("n", 5) == 5);
  CHECK(c.wait({"k", "n"}, 1s));

  const std::string cn = proto::nonce_generate(), sn = proto::nonce_generate();
  CHECK(cn.size() == proto::kNonceBytes);
  CHECK(cn != sn);
  auto a = proto::handshake_keys(f.token, cn, sn);
  auto b = proto::handshake_keys(f.token, cn, sn);
  CHECK(proto::mac_equal(a.session_key, b.session_key));
  CHECK_FALSE(proto::mac_equal(a.client_proof, a.server_proof));  // one side's proof is not the other's
  CHECK_FALSE(proto::mac_equal(a.session_key, proto::handshake_keys(f.token, cn, proto::nonce_generate()).session_key));
  CHECK_FALSE(proto::mac_equal(a.client_proof, proto::handshake_keys(token_generate(), cn, sn).client_proof));
}

TEST_CASE("a wrong or empty token is refused; the server keeps serving") {
  Fixture f;
  for (const std::string& bad : {token_generate(), std::string()}) {
    try {
      StoreClient c("127.0.0.1", f.server.port(), bad, 2s);
      FAIL("a wrong token must be refused");
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("authentication") != std::string::npos);
    }
  }
  // A raw peer that skips AUTH and sends a request instead is refused too.
  int fd = connect_loopback(f.server.port());
  REQUIRE(fd >= 0);
  const std::string nonce = proto::nonce_generate();
  REQUIRE(send_all(fd, proto::Writer().u8(uint8_t(proto::Op::HELLO)).str(nonce).u32(proto::kVersion).finish()));
  REQUIRE(send_all(fd, proto::Writer().u8(uint8_t(proto::Op::SET)).str("stop").str("1").finish()));
  CHECK(closed_within(fd, 5s));
  ::close(fd);
  CHECK_FALSE(f.good.check({"stop"}));
  f.check_serving();
}

TEST_CASE("the client refuses a server that does not prove it knows the token") {
  // A fake store: answers HELLO and accepts any proof, but cannot compute its own.
  uint16_t port = 0;
  int lfd = listen_loopback(&port);
  std::thread fake([lfd] {
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return;
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    std::string buf;
    int replies = 0;
    const auto deadline = Clock::now() + 5s;
    while (replies < 2 && Clock::now() < deadline) {
      pollfd q{c, POLLIN, 0};
      if (::poll(&q, 1, 50) <= 0) continue;
      char tmp[4096];
      ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) break;
      buf.append(tmp, static_cast<size_t>(n));
      for (auto& frame : take_frames(buf)) {
        (void)frame;
        send_all(c, proto::Writer().u8(uint8_t(proto::Status::OK)).str(proto::nonce_generate()).finish());
        ++replies;
      }
    }
    closed_within(c, 2s);
    ::close(c);
  });
  try {
    StoreClient c("127.0.0.1", port, token_generate(), 3s);
    FAIL("a server without the token must be refused");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find("did not prove") != std::string::npos);
  }
  fake.join();
  ::close(lfd);
}

TEST_CASE("the token never appears in the bytes a client sends") {
  Fixture f;
  Relay relay(f.server.port());
  {
    StoreClient c("127.0.0.1", relay.port(), f.token, 5s);
    c.set("k", "v");
    CHECK(c.get("k", 1s) == "v");
    CHECK(c.add("n", 1) == 1);
    c.ping();
  }
  const std::string sent = relay.client_bytes();
  REQUIRE(sent.size() > 100);  // the handshake and four requests went through the relay
  CHECK(sent.find(f.token) == std::string::npos);
  CHECK(sent.find(f.token.substr(0, 16)) == std::string::npos);
  CHECK(sent.find(f.token.substr(48)) == std::string::npos);
}

TEST_CASE("captured frames replayed on a new connection are refused; other clients keep working") {
  Fixture f;
  Relay relay(f.server.port());
  {
    StoreClient victim("127.0.0.1", relay.port(), f.token, 5s);
    victim.set("key", "from-victim");
  }
  const auto frames = relay.client_frames();
  REQUIRE(frames.size() == 3);  // HELLO, AUTH, sealed SET
  f.good.set("key", "current");

  // The whole captured conversation, replayed: the server's fresh nonce makes the old
  // AUTH proof wrong.
  {
    int fd = connect_loopback(f.server.port());
    REQUIRE(fd >= 0);
    send_all(fd, frames[0] + frames[1] + frames[2]);
    CHECK(closed_within(fd, 5s));
    ::close(fd);
  }
  // The captured sealed SET, sent on a connection that authenticated properly: another
  // session key, so its tag does not match.
  {
    int fd = connect_loopback(f.server.port());
    REQUIRE(fd >= 0);
    const std::string cn = proto::nonce_generate();
    REQUIRE(send_all(fd, proto::Writer().u8(uint8_t(proto::Op::HELLO)).str(cn).u32(proto::kVersion).finish()));
    std::string buf;
    std::vector<std::string> got;
    auto read_one = [&]() -> std::string {
      const auto deadline = Clock::now() + 5s;
      while (Clock::now() < deadline) {
        auto fr = take_frames(buf);
        got.insert(got.end(), fr.begin(), fr.end());
        if (!got.empty()) {
          std::string first = got.front();
          got.erase(got.begin());
          return first.substr(4);
        }
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        char tmp[4096];
        ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) break;
        buf.append(tmp, static_cast<size_t>(n));
      }
      return {};
    };
    const std::string challenge = read_one();
    proto::Reader hello_rd(challenge);
    REQUIRE(hello_rd.u8() == uint8_t(proto::Status::OK));
    auto keys = proto::handshake_keys(f.token, cn, hello_rd.str());
    REQUIRE(send_all(fd, proto::Writer().u8(uint8_t(proto::Op::AUTH)).str(keys.client_proof).finish()));
    const std::string accepted = read_one();
    proto::Reader auth_rd(accepted);
    REQUIRE(auth_rd.u8() == uint8_t(proto::Status::OK));
    REQUIRE(send_all(fd, frames[2]));
    CHECK(closed_within(fd, 5s));
    ::close(fd);
  }
  CHECK(f.good.get("key", 1s) == "current");
  f.check_serving();
}

TEST_CASE("a frame altered, duplicated or answered out of turn closes only that connection") {
  Fixture f;
  SUBCASE("a flipped byte in a request") {
    Relay relay(f.server.port(), [](proto::Dir d, int i, const std::string& fr) {
      return d == proto::Dir::CLIENT_TO_SERVER && i == 2 ? flip_last_byte(fr) : fr;
    });
    StoreClient c("127.0.0.1", relay.port(), f.token, 5s);
    CHECK_THROWS_AS(c.set("altered", "x"), CommError);
    CHECK_FALSE(f.good.check({"altered"}));
  }
  SUBCASE("a flipped byte in the middle of a request's value") {
    Relay relay(f.server.port(), [](proto::Dir d, int i, const std::string& fr) {
      std::string out = fr;
      if (d == proto::Dir::CLIENT_TO_SERVER && i == 2) out[out.size() / 2] ^= 0x20;
      return out;
    });
    StoreClient c("127.0.0.1", relay.port(), f.token, 5s);
    CHECK_THROWS_AS(c.set("altered", std::string(64, 'a')), CommError);
    CHECK_FALSE(f.good.check({"altered"}));
  }
  SUBCASE("a request sent twice") {
    Relay relay(f.server.port(), [](proto::Dir d, int i, const std::string& fr) {
      return d == proto::Dir::CLIENT_TO_SERVER && i == 2 ? fr + fr : fr;
    });
    StoreClient c("127.0.0.1", relay.port(), f.token, 5s);
    CHECK(c.add("counter", 1) == 1);
    CHECK_THROWS_AS(c.ping(), CommError);  // the duplicate closed the connection
    CHECK(f.good.get("counter", 1s) == "1");
  }
  SUBCASE("a reply altered on its way back") {
    Relay relay(f.server.port(), [](proto::Dir d, int i, const std::string& fr) {
      return d == proto::Dir::SERVER_TO_CLIENT && i == 2 ? flip_last_byte(fr) : fr;
    });
    StoreClient c("127.0.0.1", relay.port(), f.token, 5s);
    try {
      c.ping();
      FAIL("an altered reply must be refused");
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("failed authentication") != std::string::npos);
    }
  }
  CHECK(eventually([&] { return f.server.connection_count() == 1; }));
  f.check_serving();
}

TEST_CASE("sealed frames: reflected, replayed, reordered or re-keyed frames do not open") {
  const std::string key = proto::handshake_keys("t", proto::nonce_generate(), proto::nonce_generate()).session_key;
  proto::FrameAuth client(key, proto::Dir::CLIENT_TO_SERVER), server(key, proto::Dir::SERVER_TO_CLIENT);
  auto body_of = [](const std::string& sealed, uint32_t* len) {
    *len = proto::load_be32(reinterpret_cast<const unsigned char*>(sealed.data()));
    return sealed.substr(4);
  };
  const std::string f0 = client.seal(proto::Writer().u8(uint8_t(proto::Op::PING)).finish());
  const std::string f1 = client.seal(proto::Writer().u8(uint8_t(proto::Op::SET)).str("k").str("v").finish());
  uint32_t len = 0;
  std::string b = body_of(f0, &len);
  CHECK_FALSE(client.open(len, b));  // reflected to its sender
  b = body_of(f1, &len);
  CHECK_FALSE(server.open(len, b));  // out of order: f1 before f0
  b = body_of(f0, &len);
  REQUIRE(server.open(len, b));
  CHECK(b == std::string(1, char(proto::Op::PING)));
  b = body_of(f0, &len);
  CHECK_FALSE(server.open(len, b));  // replayed
  b = body_of(f1, &len);
  CHECK(server.open(len, b));
  proto::FrameAuth other(proto::handshake_keys("t", proto::nonce_generate(), proto::nonce_generate()).session_key,
                         proto::Dir::SERVER_TO_CLIENT);
  b = body_of(f0, &len);
  CHECK_FALSE(other.open(len, b));  // another connection's key
}
