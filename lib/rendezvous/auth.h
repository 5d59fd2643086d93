// Internal: the rendezvous store's authentication (OpenSSL HMAC-SHA256): nonces, the
// keys and proofs of the challenge-response keyed by the job token, and the per-frame MAC
// that binds every later frame to its connection, direction and position. Not public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::rendezvous::proto {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;  // HMAC-SHA256

// The two directions of a connection; part of every frame MAC so that a frame cannot be
// reflected back to its sender.
enum class Dir : uint8_t { CLIENT_TO_SERVER = 1, SERVER_TO_CLIENT = 2 };

// kNonceBytes fresh random bytes (OpenSSL RAND_bytes). Throws IoError when the generator fails.
std::string nonce_generate();

// What both sides derive from the token and the two nonces (HKDF-SHA256, RFC 5869:
// extract with the nonces as salt, one expand block per label). Proofs differ per side,
// so one side's proof is never valid as the other's.
struct HandshakeKeys {
  std::string client_proof;
  std::string server_proof;
  std::string session_key;
};
HandshakeKeys handshake_keys(std::string_view token, std::string_view client_nonce, std::string_view server_nonce);

// Constant-time equality (CRYPTO_memcmp); false when the lengths differ.
bool mac_equal(std::string_view a, std::string_view b);

// Authenticated framing of one connection after the handshake. A sealed frame is
//   u32 length | payload | tag,  tag = HMAC(session_key, u8 dir | u64 seq | u32 length | payload)
// with length counting payload and tag, and seq counting the frames sent in that
// direction from 0. A replayed, reordered, reflected or altered frame fails open().
class FrameAuth {
 public:
  FrameAuth() = default;
  FrameAuth(std::string session_key, Dir send_dir);

  bool active() const { return !key_.empty(); }
  // frame: a whole unsealed frame (proto::Writer::finish()). Returns it sealed.
  std::string seal(std::string frame);
  // body: the `length` bytes that followed a sealed frame's length header. On success
  // strips the tag and returns true; false when the tag does not match (or is missing).
  bool open(uint32_t length, std::string& body);

 private:
  std::string tag(Dir dir, uint64_t seq, uint32_t length, std::string_view payload) const;
  std::string key_;
  Dir send_dir_ = Dir::CLIENT_TO_SERVER;
  uint64_t send_seq_ = 0;
  uint64_t recv_seq_ = 0;
};

}  // namespace dtrain::rendezvous::proto
