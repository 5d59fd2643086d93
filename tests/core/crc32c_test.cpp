// crc32c: the published check values (RFC 3720 appendix B.4) and that a CRC continued
// from an earlier one equals the CRC of the whole, as checkpoint shards compute it.
#include "core/crc32c.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using dtrain::crc32c;

TEST_CASE("crc32c: the published check values") {
  CHECK(crc32c("123456789", 9) == 0xe3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
    down[static_cast<size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8a9136aau);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62a8ab43u);
  CHECK(crc32c(up.data(), up.size()) == 0x46dd794eu);
  CHECK(crc32c(down.data(), down.size()) == 0x113fdb5cu);
}

TEST_CASE("crc32c: continued from an earlier CRC equals one pass, at every split") {
  std::string s;
  for (int i = 0; i < 300; ++i) s.push_back(static_cast<char>((i * 37 + 11) & 0xff));
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{5}, size_t{150}, size_t{299}, size_t{300}})
    CHECK(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)) == whole);
  CHECK(crc32c("6789", 4, crc32c("12345", 5)) == 0xe3069283u);
}
