// crc32c through Boost.CRC (header-only, already a dependency for Asio).
#include "core/crc32c.h"

#include <boost/crc.hpp>

namespace dtrain {

namespace {

uint32_t reflect32(uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  // To continue from a finished CRC, the register starts at its value before the final
  // xor (~crc). Boost takes the initial remainder unreflected and this CRC is reflected,
  // so that register value goes in bit-reversed (0 to start gives the usual 0xffffffff).
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> c(reflect32(~crc));
  c.process_bytes(data, n);
  return c.checksum();
}

}  // namespace dtrain
