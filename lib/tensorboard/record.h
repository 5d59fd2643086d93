// TFRecord framing, the container of TensorFlow event files: each record is its length
// (uint64 little-endian), the masked CRC32C of those 8 bytes, the data, and the masked
// CRC32C of the data (both checksums uint32 little-endian).
#pragma once

#include "core/crc32c.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::tensorboard {

/// TFRecord's checksum mask, ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32): a CRC
/// of data that holds CRCs is then not itself a CRC of that data.
uint32_t crc32c_mask(uint32_t crc);

/// One complete record around data: 8 + 4 + data.size() + 4 bytes.
std::string record_frame(std::string_view data);

}  // namespace dtrain::tensorboard
