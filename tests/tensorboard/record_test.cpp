// TFRecord framing: CRC-32C against published test vectors (RFC 3720 B.4 and the
// "123456789" check value), the checksum mask, and the exact bytes of framed records.
#include "tensorboard/record.h"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace dtrain::tensorboard;
using dtrain::crc32c;

namespace {

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

// Little-endian unsigned integer of `bytes` bytes at s[at].
uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s.at(at + static_cast<size_t>(i)));
  return v;
}
uint64_t le64(const std::string& s, size_t at) { return le(s, at, 8); }
uint32_t le32(const std::string& s, size_t at) { return static_cast<uint32_t>(le(s, at, 4)); }

}  // namespace

TEST_CASE("crc32c_mask: rotate right by 15, add 0xa282ead8") {
  CHECK(crc32c_mask(0) == 0xa282ead8u);
  // 0xe3069283: >> 15 = 0x0001c60d, << 17 = 0x25060000, | = 0x2507c60d, + 0xa282ead8.
  CHECK(crc32c_mask(0xe3069283u) == 0xc78ab0e5u);
  CHECK(crc32c_mask(0xffffffffu) == 0xa282ead7u);  // all ones rotate to all ones; the sum wraps
}

TEST_CASE("record_frame: length, its masked crc, data, the data's masked crc") {
  SUBCASE("empty data") {
    const std::string r = record_frame("");
    REQUIRE(r.size() == 16);
    CHECK(le64(r, 0) == 0);
    CHECK(le32(r, 8) == 0x07980329u);   // masked crc32c of 8 zero bytes (0x8c28b28a)
    CHECK(le32(r, 12) == 0xa282ead8u);  // masked crc32c of nothing
  }
  SUBCASE("a few bytes") {
    const std::string data = "123456789";
    const std::string r = record_frame(data);
    REQUIRE(r.size() == 8 + 4 + 9 + 4);
    CHECK(le64(r, 0) == 9);
    CHECK(le32(r, 8) == crc32c_mask(crc32c(r.data(), 8)));
    CHECK(r.substr(12, 9) == data);
    CHECK(le32(r, 21) == 0xc78ab0e5u);
  }
  SUBCASE("binary data with zero bytes and a length above 255") {
    std::string data(300, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
    const std::string r = record_frame(data);
    REQUIRE(r.size() == 316);
    CHECK(static_cast<unsigned char>(r[0]) == 0x2c);  // 300 = 0x012c, little-endian
    CHECK(static_cast<unsigned char>(r[1]) == 0x01);
    CHECK(le64(r, 0) == 300);
    CHECK(r.substr(12, 300) == data);
    CHECK(le32(r, 312) == crc32c_mask(crc_of(data)));
  }
}
