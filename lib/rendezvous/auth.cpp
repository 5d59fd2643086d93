// Rendezvous authentication primitives over OpenSSL: HMAC-SHA256 through EVP_MAC,
// HKDF-style key derivation from the job token and both nonces, RAND_bytes nonces,
// CRYPTO_memcmp comparisons, and the per-frame MAC with direction and sequence number.
#include "rendezvous/auth.h"

#include "core/check.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <initializer_list>
#include <memory>

namespace dtrain::rendezvous::proto {

namespace {

EVP_MAC* hmac_algorithm() {
  // Fetched once: the provider lookup is the expensive part of a MAC.
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  DT_ENFORCE(mac != nullptr, InternalError, "OpenSSL has no HMAC implementation");
  return mac;
}

// HMAC-SHA256(key, concatenation of parts), without copying the parts together.
std::string hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(hmac_algorithm()), EVP_MAC_CTX_free);
  DT_ENFORCE(ctx != nullptr, InternalError, "EVP_MAC_CTX_new failed");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  // A zero-length key is legal HMAC; OpenSSL wants a non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const auto* k = key.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(key.data());
  DT_ENFORCE(EVP_MAC_init(ctx.get(), k, key.size(), params) == 1, InternalError, "HMAC-SHA256 init failed");
  for (std::string_view p : parts)
    if (!p.empty())
      DT_ENFORCE(EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1,
                 InternalError, "HMAC-SHA256 update failed");
  std::string out(kMacBytes, '\0');
  size_t n = 0;
  DT_ENFORCE(
      EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n, out.size()) == 1 && n == kMacBytes,
      InternalError, "HMAC-SHA256 final failed");
  return out;
}

// HKDF-Expand with a single output block: T(1) = HMAC(prk, info | 0x01).
std::string expand(const std::string& prk, std::string_view label) {
  return hmac_sha256(prk, {label, std::string_view("\x01", 1)});
}

void put_be(std::string& out, uint64_t v, int bytes) {
  for (int s = 8 * (bytes - 1); s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
}

}  // namespace

// ----------------------------------------------------------------------------

std::string nonce_generate() {
  std::string n(kNonceBytes, '\0');
  DT_ENFORCE(RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) == 1, IoError,
             "OpenSSL RAND_bytes could not produce a rendezvous nonce");
  return n;
}

HandshakeKeys handshake_keys(std::string_view token, std::string_view client_nonce, std::string_view server_nonce) {
  std::string salt;
  salt.reserve(client_nonce.size() + server_nonce.size());
  salt.append(client_nonce).append(server_nonce);
  // Extract: both nonces are the salt, so every connection gets unrelated keys even
  // when one side reuses its nonce.
  const std::string prk = hmac_sha256(salt, {token});
  return {expand(prk, "dtrain rendezvous v2 client proof"), expand(prk, "dtrain rendezvous v2 server proof"),
          expand(prk, "dtrain rendezvous v2 session key")};
}

bool mac_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// ----------------------------------------------------------------------------

FrameAuth::FrameAuth(std::string session_key, Dir send_dir) : key_(std::move(session_key)), send_dir_(send_dir) {}

std::string FrameAuth::tag(Dir dir, uint64_t seq, uint32_t length, std::string_view payload) const {
  std::string header;
  put_be(header, static_cast<uint8_t>(dir), 1);
  put_be(header, seq, 8);
  put_be(header, length, 4);
  return hmac_sha256(key_, {header, payload});
}

std::string FrameAuth::seal(std::string frame) {
  DT_ENFORCE(active() && frame.size() >= 4, InternalError, "sealing a frame without a session");
  const uint64_t length = frame.size() - 4 + kMacBytes;
  DT_ENFORCE(length <= UINT32_MAX, UsageError, "rendezvous frame of {} bytes is too large", length);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (24 - 8 * i)) & 0xff);
  const std::string t = tag(send_dir_, send_seq_++, static_cast<uint32_t>(length), std::string_view(frame).substr(4));
  frame += t;
  return frame;
}

bool FrameAuth::open(uint32_t length, std::string& body) {
  if (!active() || body.size() != length || length < kMacBytes) return false;
  const Dir recv_dir = send_dir_ == Dir::CLIENT_TO_SERVER ? Dir::SERVER_TO_CLIENT : Dir::CLIENT_TO_SERVER;
  const std::string_view payload = std::string_view(body).substr(0, length - kMacBytes);
  const std::string_view got = std::string_view(body).substr(length - kMacBytes);
  if (!mac_equal(tag(recv_dir, recv_seq_, length, payload), got)) return false;
  ++recv_seq_;
  body.resize(length - kMacBytes);
  return true;
}

}  // namespace dtrain::rendezvous::proto
