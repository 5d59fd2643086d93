// Token shards: one binary file of token ids (+ optional loss-mask bytes + document
// start offsets) with a checksummed header; the in-memory TokenData, a writer and an
// mmap-backed reader that validates the file before use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

// ---------------------------------------------------------------------------
// File layout (little-endian), version 1:
//   header, 64 bytes:
//     0  char[8]  "DTRAINTK"
//     8  u32      version (1)
//    12  u32      token width in bytes: 2 (uint16, vocab_size <= 65536) or 4 (uint32)
//    16  u64      number of tokens N
//    24  u64      number of documents D
//    32  u32      flags: bit 0 = a mask array is present; bit 1 = pairwise (preference
//                 data): documents come in pairs, 2k the chosen and 2k+1 the rejected
//                 sequence of pair k (D is even); other bits must be 0
//    36  i32      vocab_size
//    40  i32      eos id (-1 none)
//    44  i32      pad id (-1 none)
//    48  u32      CRC-32 (IEEE) of everything after the header
//    52  u32      CRC-32 of header bytes 0..51
//    56  u8[8]    zero
//   tokens: N * width bytes
//   mask:   N bytes (0/1), only when flag bit 0 is set
//   docs:   D * u64, the token offset where each document (text paragraph or SFT
//           record) starts; strictly increasing, first is 0.
constexpr char SHARD_MAGIC[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'T', 'K'};
constexpr uint32_t SHARD_VERSION = 1;
constexpr size_t SHARD_HEADER_BYTES = 64;
constexpr uint32_t SHARD_FLAG_MASK = 1u;
constexpr uint32_t SHARD_FLAG_PAIRWISE = 2u;

// Tokens of many documents laid end to end.
struct TokenData {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;         // empty (all tokens trained on) or tokens.size()
  std::vector<uint64_t> doc_starts;  // see the file layout
  int32_t vocab_size = 0;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  bool pairwise = false;  // documents are (chosen, rejected) pairs, as flag bit 1
  std::string name;       // where it came from (the tokenized file), for messages; not stored in shards

  // Appends one document; mask may be empty only while this data has no mask.
  void append(const std::vector<int32_t>& doc, const std::vector<uint8_t>& doc_mask = {});
};

// Writes atomically (temp file + rename). IoError on failure; ConfigError when a
// token is outside [0, vocab_size) or the mask/doc arrays are inconsistent.
void shard_write(const std::string& path, const TokenData& data);

// ---------------------------------------------------------------------------
// ShardReader: maps a shard read-only. The constructor checks magic, version, sizes
// against the file length and (verify) the payload checksum; any mismatch is an
// IoError naming the file and what is wrong.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path, bool verify = true);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;

  const std::string& path() const { return path_; }
  size_t size() const { return num_tokens_; }
  size_t num_docs() const { return num_docs_; }
  bool has_mask() const { return has_mask_; }
  bool pairwise() const { return pairwise_; }
  int32_t vocab_size() const { return vocab_size_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }

  int32_t token(size_t i) const;
  bool mask(size_t i) const;  // true when the shard has no mask
  uint64_t doc_start(size_t d) const;
  uint64_t doc_end(size_t d) const;  // doc_start(d + 1) or size()
  // Copies tokens [begin, begin + n) (n <= size() - begin).
  void read_tokens(size_t begin, size_t n, int32_t* out) const;

  TokenData to_data() const;

 private:
  void release();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  size_t num_tokens_ = 0, num_docs_ = 0;
  uint32_t width_ = 4;
  bool has_mask_ = false;
  bool pairwise_ = false;
  int32_t vocab_size_ = 0, eos_id_ = -1, pad_id_ = -1;
  const uint8_t* tokens_ = nullptr;
  const uint8_t* mask_ = nullptr;
  const uint8_t* docs_ = nullptr;
};

}  // namespace dtrain::data
