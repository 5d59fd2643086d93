// Internal: the rendezvous wire format shared by StoreServer and StoreClient (opcodes,
// reply statuses, big-endian frame encoding and a bounds-checked decoder). The format is
// documented for users in rendezvous/store.h; this header is not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::rendezvous::proto {

// 2: challenge-response authentication and MACed frames (rendezvous/auth.h).
constexpr uint32_t kVersion = 2;
// A connection that has not authenticated yet may only send small HELLO/AUTH frames, so
// an unauthenticated peer cannot make the server allocate large buffers.
constexpr uint32_t kMaxHelloFrame = 4096;
// Timeouts on the wire are capped so that deadline arithmetic cannot overflow.
constexpr uint64_t kMaxTimeoutMs = 7ull * 24 * 3600 * 1000;

enum class Op : uint8_t { HELLO = 1, SET = 2, GET = 3, ADD = 4, WAIT = 5, CHECK = 6, DELETE = 7, PING = 8, AUTH = 9 };
enum class Status : uint8_t { OK = 0, NOT_FOUND = 1, TIMEOUT = 2, ERROR = 3, AUTH_FAILED = 4 };

const char* op_name(Op op);

// ----------------------------------------------------------------------------
// Encoder: builds one whole frame (u32 length placeholder patched by finish()).

class Writer {
 public:
  Writer() { buf_.assign(4, '\0'); }
  Writer& u8(uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v);
  Writer& u64(uint64_t v);
  Writer& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Writer& str(std::string_view s);
  // Patches the length prefix and returns the frame.
  std::string finish();

 private:
  std::string buf_;
};

// ----------------------------------------------------------------------------
// Decoder over one frame payload. Failures are sticky: after a truncated or oversized
// field every getter returns zero/empty and ok() is false, so callers check once at the end.

class Reader {
 public:
  explicit Reader(std::string_view payload) : data_(payload) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string str();
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == data_.size(); }
  size_t remaining() const { return data_.size() - pos_; }
  void fail() { ok_ = false; }

 private:
  bool take(size_t n, const char** out);
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

uint32_t load_be32(const unsigned char* p);

}  // namespace dtrain::rendezvous::proto
