// CRC-32C (Castagnoli), the one copy: checkpoint shards (train/checkpoint) and TFRecord
// framing (tensorboard/record) both checksum with it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain {

/// CRC-32C (polynomial 0x1EDC6F41, reflected, init and final xor 0xffffffff) of n bytes,
/// continuing from crc (0 to start): crc32c("123456789") = 0xe3069283, and
/// crc32c(b, nb, crc32c(a, na)) is the CRC of a followed by b.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace dtrain
