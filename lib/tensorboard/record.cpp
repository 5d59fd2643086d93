// TFRecord framing. CRC-32C through Boost.CRC (header-only, libboost-dev, already a
// dtrain dependency): Debian 12 ships no libcrc32c, and records are a few hundred bytes
// once per logged step, so a table-driven CRC is plenty.
#include "tensorboard/record.h"

#include <boost/crc.hpp>

namespace dtrain::tensorboard {

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  // Castagnoli polynomial 0x1EDC6F41, reflected in and out, init and final xor all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string record_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, crc32c_mask(crc32c(out.data(), 8)), 4);
  out.append(data);
  put_le(out, crc32c_mask(crc32c(data.data(), data.size())), 4);
  return out;
}

}  // namespace dtrain::tensorboard
