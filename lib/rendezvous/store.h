// The rendezvous key-value store: a TCP server run by the launcher (Boost.Asio, one io
// thread), a blocking thread-safe client used by node agents and ranks, per-job/round key
// scoping, and the per-job token that authenticates every connection.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::rendezvous {

namespace proto {
class FrameAuth;
}

// ----------------------------------------------------------------------------
// Wire protocol (version 2). All integers are big-endian.
//
//   frame    := u32 length | payload            (length = payload bytes, 1..max_frame_bytes)
//   sealed   := u32 length | payload | tag      (length counts the 32-byte tag too)
//   request  := u8 opcode  | fields
//   reply    := u8 status  | fields
//   str      := u32 n | n bytes                  (binary safe)
//
//   opcode  request fields                         OK reply fields
//   1 HELLO  str client_nonce, u32 version         str server_nonce
//   9 AUTH   str client_proof                      str server_proof
//   2 SET    str key, str value                    -
//   3 GET    str key, u64 timeout_ms               str value     (NOT_FOUND on timeout)
//   4 ADD    str key, i64 delta                    i64 new value (key starts at 0)
//   5 WAIT   u32 n, n x str key, u64 timeout_ms    -             (TIMEOUT on timeout)
//   6 CHECK  u32 n, n x str key                    u8 all present
//   7 DELETE str key                               u8 existed
//   8 PING   -                                     -
//
//   status: 0 OK, 1 NOT_FOUND, 2 TIMEOUT, 3 ERROR (str message), 4 AUTH_FAILED (str message)
//
// Authentication (the token never crosses the network): the client sends HELLO with 32
// fresh random bytes, the server answers with its own 32; both derive, HKDF-SHA256 with
// the token as key material and both nonces as salt, a client proof, a server proof and
// a session key. The client sends AUTH with its proof; the server checks it (CRYPTO_memcmp)
// and answers with its proof, which the client checks before any request, so each side
// knows the other holds the token. These four frames are plain; every later frame in
// either direction is sealed: tag = HMAC-SHA256(session key, u8 direction (1 client to
// server, 2 server to client) | u64 sequence number of the frame in its direction from 0 |
// u32 length | payload). A frame whose tag does not match (altered, replayed from any
// connection, reordered, reflected) closes that connection without a reply. Anything else
// first, or a wrong proof, gets an ERROR/AUTH_FAILED reply and the connection is closed.
// Until authenticated a frame may be at most 4 KiB. A malformed frame
// (unknown opcode, a string running past the frame, trailing bytes), an oversized length,
// or a frame that stalls mid-way past ServerLimits::frame_timeout gets an ERROR reply where
// possible and the connection is closed. ERROR for a well-formed request (ADD on a
// non-integer value) leaves the connection open. GET and WAIT block on the server: the
// client sends nothing else until the reply arrives (bytes or EOF meanwhile close the
// connection). ADD stores its counter as a decimal string, so GET returns e.g. "42".

// Server-side limits; every field is in force for every connection.
struct ServerLimits {
  uint32_t max_frame_bytes = 64u << 20;            // per frame, after HELLO
  size_t max_connections = 4096;                   // further connections are refused
  std::chrono::milliseconds frame_timeout{10000};  // a started frame must complete within
  std::chrono::milliseconds hello_timeout{10000};  // a new connection must authenticate within
};

// The key-value server. Runs its own io thread; the destructor stops and joins it.
class StoreServer {
 public:
  // bind_address: an IP literal ("127.0.0.1", "::1", a node-facing address; see
  // store_listen_address); port 0 picks an ephemeral port. Throws CommError when the
  // address is invalid or cannot be bound, and UsageError for an empty token or zero limits.
  StoreServer(const std::string& bind_address, uint16_t port, std::string token, ServerLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The bound port (the ephemeral one when constructed with 0).
  uint16_t port() const;
  // Closes the listener and every connection (blocked clients get CommError) and joins
  // the io thread. Idempotent.
  void stop();

  // For every key that starts with `prefix`: the server's steady-clock time of its last
  // SET/ADD, keyed by the rest of the key. heartbeats("hb/") -> {"node3": t, ...}.
  // Measured on the server's clock, so clock skew between nodes does not matter.
  std::map<std::string, std::chrono::steady_clock::time_point> heartbeats(const std::string& prefix) const;

  // The same keys with their values: what a supervisor needs when the value says more
  // than "alive" (a rank's training step, its pid).
  struct Stamped {
    std::string value;
    std::chrono::steady_clock::time_point set_at;
  };
  std::map<std::string, Stamped> entries(const std::string& prefix) const;

  // Live connections and blocked GET/WAIT requests (for supervision and tests).
  size_t connection_count() const;
  size_t waiter_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The IP literal to listen on for the address the nodes are told to dial: the address
// itself, or the first address a host name resolves to. Listening there rather than on
// every interface keeps the store off networks the job does not use. A name that resolves
// to loopback here while remote_nodes join (an /etc/hosts alias of the host name) gives the
// wildcard address instead, with a warning. CommError naming the address and the
// resolver's reason when it does not resolve.
std::string store_listen_address(const std::string& advertised, bool remote_nodes = false);

// ----------------------------------------------------------------------------
// Blocking client. Thread-safe: one mutex serializes requests on the one connection, so a
// thread blocked in get()/wait() delays other threads on the same client; give each
// thread that blocks its own client. Every call is bounded in time and throws CommError
// (naming host:port) on timeout, lost connection or a server error; after a lost
// connection every later call throws too.
class StoreClient {
 public:
  // Retries connecting until connect_timeout (the server may start a moment later), then
  // authenticates. CommError says "cannot resolve host" (at once when the name does not
  // exist), "connection refused", "timed out" or "authentication" (wrong token on either
  // side), naming host:port.
  StoreClient(const std::string& host, uint16_t port, const std::string& token,
              std::chrono::milliseconds connect_timeout = std::chrono::seconds(10));
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, std::string_view value);
  // Blocks until the key exists; CommError naming the key when timeout passes first.
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // Atomic counter: the key starts at 0; returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // True when all keys exist before timeout, false on timeout.
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool check(const std::vector<std::string>& keys);
  // True when the key existed.
  bool del(const std::string& key);
  void ping();

  // Bound for a reply to set/add/check/del/ping, and the grace beyond get/wait's own
  // timeout (default 15 s): how long a silently dead server can hold a caller.
  void set_request_timeout(std::chrono::milliseconds timeout);
  // "host:port" as given to the constructor.
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string request(const std::string& frame, const char* op, const std::string& key, std::chrono::milliseconds extra,
                      uint8_t* status);
  [[noreturn]] void fail(const std::string& what);
  void send_all(const std::string& data, std::chrono::steady_clock::time_point deadline, const char* op);
  void recv_all(char* buf, size_t n, std::chrono::steady_clock::time_point deadline, const char* op);
  void connect_until(std::chrono::steady_clock::time_point deadline, const std::string& host, uint16_t port);
  void hello(const std::string& token);

  std::mutex mu_;
  int fd_ = -1;
  std::string endpoint_;
  std::string broken_;                      // why the connection was lost; empty while healthy
  std::unique_ptr<proto::FrameAuth> auth_;  // seals and opens frames once hello() succeeded
  std::chrono::milliseconds request_timeout_{15000};
};

// ----------------------------------------------------------------------------
// Key scoping: every key of a job's round lives under "job/<id>/r<round>/".

// "job/<job_id>/r<round>/<key>". job_id must be non-empty without '/'; round >= 0.
std::string store_key(const std::string& job_id, int round, const std::string& key);
// "job/<job_id>/r<round>/": the prefix for a PrefixStore.
std::string store_prefix(const std::string& job_id, int round);

// A view of a client that prepends a prefix to every key, so the ranks of a round only
// see their round's keys. Holds a reference: the client must outlive the view.
class PrefixStore {
 public:
  PrefixStore(StoreClient& client, std::string prefix) : client_(client), prefix_(std::move(prefix)) {}
  PrefixStore(StoreClient& client, const std::string& job_id, int round)
      : PrefixStore(client, store_prefix(job_id, round)) {}

  void set(const std::string& key, std::string_view value) { client_.set(prefix_ + key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) {
    return client_.get(prefix_ + key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) { return client_.add(prefix_ + key, delta); }
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    return client_.wait(scoped(keys), timeout);
  }
  bool check(const std::vector<std::string>& keys) { return client_.check(scoped(keys)); }
  bool del(const std::string& key) { return client_.del(prefix_ + key); }

  const std::string& prefix() const { return prefix_; }
  StoreClient& client() { return client_; }

 private:
  std::vector<std::string> scoped(const std::vector<std::string>& keys) const;
  StoreClient& client_;
  std::string prefix_;
};

// ----------------------------------------------------------------------------
// Per-job token.

// 32 random bytes from getrandom() (or /dev/urandom) as 64 lowercase hex characters.
// Never log it.
std::string token_generate();
// Constant-time comparison (time depends only on the lengths).
bool token_equal(std::string_view a, std::string_view b);

}  // namespace dtrain::rendezvous
