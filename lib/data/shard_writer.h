// ShardWriter: writes a token shard (data/shard.h's layout) document by document, in
// bounded memory, to an unnamed file (or PATH.tmp) named PATH on finish(). The mask and document
// offsets, which the layout puts after all tokens, wait in unlinked temporary files
// beside PATH until finish() appends them; the header's counts and checksums are
// written last, at offset 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

class ShardWriter {
 public:
  // Creates the file (unnamed where the file system allows O_TMPFILE, else PATH.tmp;
  // IoError when it cannot); has_mask: every document comes with a
  // mask (SFT), or none does (plain text); pairwise: the documents are (chosen, rejected)
  // pairs (data/shard.h's flag bit 1), so finish() refuses an odd count.
  ShardWriter(std::string path, int32_t vocab_size, int32_t eos_id, int32_t pad_id, bool has_mask,
              bool pairwise = false);
  // Removes PATH.tmp unless finish() succeeded: a failed or abandoned write leaves nothing.
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document (an empty one is skipped, as TokenData::append does). mask has
  // n entries when the shard has a mask, else is null. ConfigError when a token is
  // outside [0, vocab_size).
  void append(const int32_t* tokens, const uint8_t* mask, size_t n);

  // Completes the file and renames it to PATH. IoError on a failed write or rename.
  void finish();

  size_t tokens() const { return num_tokens_; }
  size_t documents() const { return num_docs_; }
  size_t trained_tokens() const { return trained_; }

 private:
  // A buffered append-only file descriptor.
  struct Out {
    int fd = -1;
    std::vector<uint8_t> buf;
    void put(const void* p, size_t n, const std::string& what);
    void flush(const std::string& what);
  };
  void close_all();

  std::string path_, tmp_;
  int32_t vocab_size_, eos_id_, pad_id_;
  bool has_mask_, pairwise_;
  uint32_t width_;
  Out main_, mask_, docs_;
  uint32_t crc_ = 0;  // CRC-32 of the tokens written so far, then of the whole payload
  size_t num_tokens_ = 0, num_docs_ = 0, trained_ = 0;
  bool done_ = false;
  bool anonymous_ = false;  // main_ is an O_TMPFILE file, named tmp_ by finish()
  std::vector<uint8_t> scratch_;
};

}  // namespace dtrain::data
