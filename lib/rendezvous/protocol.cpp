// Frame encoding and bounds-checked decoding for the rendezvous wire protocol.
#include "rendezvous/protocol.h"

#include <cstring>

namespace dtrain::rendezvous::proto {

const char* op_name(Op op) {
  switch (op) {
    case Op::HELLO: return "HELLO";
    case Op::SET: return "SET";
    case Op::GET: return "GET";
    case Op::ADD: return "ADD";
    case Op::WAIT: return "WAIT";
    case Op::CHECK: return "CHECK";
    case Op::DELETE: return "DELETE";
    case Op::PING: return "PING";
    case Op::AUTH: return "AUTH";
  }
  return "UNKNOWN";
}

uint32_t load_be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// ----------------------------------------------------------------------------

Writer& Writer::u32(uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) buf_.push_back(static_cast<char>((v >> s) & 0xff));
  return *this;
}

Writer& Writer::u64(uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) buf_.push_back(static_cast<char>((v >> s) & 0xff));
  return *this;
}

Writer& Writer::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  buf_.append(s.data(), s.size());
  return *this;
}

std::string Writer::finish() {
  const uint64_t n = buf_.size() - 4;
  for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
  return std::move(buf_);
}

// ----------------------------------------------------------------------------

bool Reader::take(size_t n, const char** out) {
  if (!ok_ || n > data_.size() - pos_) {
    ok_ = false;
    return false;
  }
  *out = data_.data() + pos_;
  pos_ += n;
  return true;
}

uint8_t Reader::u8() {
  const char* p;
  return take(1, &p) ? static_cast<uint8_t>(*p) : 0;
}

uint32_t Reader::u32() {
  const char* p;
  return take(4, &p) ? load_be32(reinterpret_cast<const unsigned char*>(p)) : 0;
}

uint64_t Reader::u64() {
  const char* p;
  if (!take(8, &p)) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string Reader::str() {
  const uint32_t n = u32();
  const char* p;
  if (!take(n, &p)) return {};
  return std::string(p, n);
}

}  // namespace dtrain::rendezvous::proto
