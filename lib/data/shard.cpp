// Token shard writer and mmap reader. Integers are stored little-endian, which is the
// byte order of every platform dtrain builds on (checked at compile time).
#include "data/shard.h"

#include "core/check.h"
#include "core/input_file.h"

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <fstream>

#include <fcntl.h>
#include <zlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dtrain::data {

static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

// ---------------------------------------------------------------------------
// CRC-32

namespace {

// zlib's CRC-32 (IEEE 802.3); crc32_z takes a size_t length (payloads may pass 4 GiB).
uint32_t crc32_of(const void* data, size_t size) {
  return static_cast<uint32_t>(crc32_z(0, static_cast<const Bytef*>(data), size));
}

template <typename T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// TokenData / writer

void TokenData::append(const std::vector<int32_t>& doc, const std::vector<uint8_t>& doc_mask) {
  if (doc.empty()) return;
  bool masked = !mask.empty() || (!doc_mask.empty() && tokens.empty());
  DT_ENFORCE(doc_mask.empty() || doc_mask.size() == doc.size(), InternalError,
             "document mask has {} entries for {} tokens", doc_mask.size(), doc.size());
  DT_ENFORCE(masked == !doc_mask.empty(), InternalError, "all documents of one TokenData must have a mask, or none");
  doc_starts.push_back(tokens.size());
  tokens.insert(tokens.end(), doc.begin(), doc.end());
  mask.insert(mask.end(), doc_mask.begin(), doc_mask.end());
}

void shard_write(const std::string& path, const TokenData& data) {
  const size_t n = data.tokens.size();
  DT_ENFORCE(data.vocab_size > 0, ConfigError, "shard '{}': vocab_size must be positive", path);
  DT_ENFORCE(data.mask.empty() || data.mask.size() == n, ConfigError, "shard '{}': mask has {} entries for {} tokens",
             path, data.mask.size(), n);
  for (size_t d = 0; d < data.doc_starts.size(); ++d) {
    DT_ENFORCE(
        data.doc_starts[d] < n && (d == 0 ? data.doc_starts[d] == 0 : data.doc_starts[d] > data.doc_starts[d - 1]),
        ConfigError, "shard '{}': document start {} (= {}) is out of order or past the tokens", path, d,
        data.doc_starts[d]);
  }
  DT_ENFORCE(n == 0 || !data.doc_starts.empty(), ConfigError, "shard '{}': tokens without document starts", path);
  DT_ENFORCE(!data.pairwise || data.doc_starts.size() % 2 == 0, ConfigError,
             "shard '{}': pairwise data has {} documents, not (chosen, rejected) pairs", path, data.doc_starts.size());
  const uint32_t width = data.vocab_size <= 65536 ? 2 : 4;

  std::vector<uint8_t> payload(n * width + data.mask.size() + data.doc_starts.size() * 8);
  uint8_t* p = payload.data();
  for (size_t i = 0; i < n; ++i) {
    int32_t t = data.tokens[i];
    DT_ENFORCE(t >= 0 && t < data.vocab_size, ConfigError, "shard '{}': token {} at position {} is outside [0, {})",
               path, t, i, data.vocab_size);
    if (width == 2) put<uint16_t>(p + 2 * i, static_cast<uint16_t>(t));
    else put<uint32_t>(p + 4 * i, static_cast<uint32_t>(t));
  }
  p += n * width;
  for (size_t i = 0; i < data.mask.size(); ++i) p[i] = data.mask[i] ? 1 : 0;
  p += data.mask.size();
  for (size_t d = 0; d < data.doc_starts.size(); ++d) put<uint64_t>(p + 8 * d, data.doc_starts[d]);

  std::array<uint8_t, SHARD_HEADER_BYTES> h{};
  std::memcpy(h.data(), SHARD_MAGIC, 8);
  put<uint32_t>(h.data() + 8, SHARD_VERSION);
  put<uint32_t>(h.data() + 12, width);
  put<uint64_t>(h.data() + 16, n);
  put<uint64_t>(h.data() + 24, data.doc_starts.size());
  put<uint32_t>(h.data() + 32, (data.mask.empty() ? 0u : SHARD_FLAG_MASK) | (data.pairwise ? SHARD_FLAG_PAIRWISE : 0u));
  put<int32_t>(h.data() + 36, data.vocab_size);
  put<int32_t>(h.data() + 40, data.eos_id);
  put<int32_t>(h.data() + 44, data.pad_id);
  put<uint32_t>(h.data() + 48, crc32_of(payload.data(), payload.size()));
  put<uint32_t>(h.data() + 52, crc32_of(h.data(), 52));

  const std::string tmp = path + ".tmp";
  // Whatever fails after the tmp file exists removes it: no stray .tmp beside the output.
  auto drop_tmp = [&] {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DT_ENFORCE(out.good(), IoError, "cannot create shard '{}': {}", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(h.data()), h.size());
    out.write(reinterpret_cast<const char*>(payload.data()), static_cast<std::streamsize>(payload.size()));
    out.flush();
    if (!out.good()) {
      out.close();
      drop_tmp();
      DT_THROW(IoError, "error writing shard '{}' (disk full?)", tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    drop_tmp();
    DT_THROW(IoError, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
}

// ---------------------------------------------------------------------------
// Reader

ShardReader::ShardReader(const std::string& path, bool verify) : path_(path) {
  InputFile f = input_file_open(path, "token shard");
  bytes_ = static_cast<size_t>(f.size());
  if (bytes_ < SHARD_HEADER_BYTES)
    DT_THROW(IoError, "token shard '{}' is truncated: {} bytes, smaller than the {}-byte header", path, bytes_,
             SHARD_HEADER_BYTES);
  void* m = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, f.fd(), 0);
  int e = errno;
  DT_ENFORCE(m != MAP_FAILED, IoError, "cannot mmap token shard '{}': {}", path, std::strerror(e));
  base_ = static_cast<const uint8_t*>(m);

  try {
    const uint8_t* h = base_;
    DT_ENFORCE(std::memcmp(h, SHARD_MAGIC, 8) == 0, IoError,
               "'{}' is not a dtrain token shard (bad magic); create it with `dtrain data prepare`", path);
    DT_ENFORCE(get<uint32_t>(h + 52) == crc32_of(h, 52), IoError,
               "token shard '{}' has a corrupt header (checksum mismatch)", path);
    uint32_t version = get<uint32_t>(h + 8);
    DT_ENFORCE(version == SHARD_VERSION, IoError, "token shard '{}' has version {}, this dtrain reads {}", path,
               version, SHARD_VERSION);
    width_ = get<uint32_t>(h + 12);
    DT_ENFORCE(width_ == 2 || width_ == 4, IoError, "token shard '{}': token width {} is not 2 or 4", path, width_);
    num_tokens_ = get<uint64_t>(h + 16);
    num_docs_ = get<uint64_t>(h + 24);
    const uint32_t flags = get<uint32_t>(h + 32);
    DT_ENFORCE((flags & ~(SHARD_FLAG_MASK | SHARD_FLAG_PAIRWISE)) == 0, IoError,
               "token shard '{}' has header flags {:#x} this dtrain does not know (a newer dtrain wrote it?)", path,
               flags);
    has_mask_ = (flags & SHARD_FLAG_MASK) != 0;
    pairwise_ = (flags & SHARD_FLAG_PAIRWISE) != 0;
    vocab_size_ = get<int32_t>(h + 36);
    eos_id_ = get<int32_t>(h + 40);
    pad_id_ = get<int32_t>(h + 44);
    // Sizes from the header bound everything that follows; reject impossible ones
    // before multiplying so a corrupt count cannot overflow.
    const size_t room = bytes_ - SHARD_HEADER_BYTES;
    DT_ENFORCE(num_tokens_ <= room && num_docs_ <= room / 8, IoError,
               "token shard '{}' is truncated: header says {} tokens and {} documents, the file has {} bytes", path,
               num_tokens_, num_docs_, bytes_);
    const size_t expect = num_tokens_ * width_ + (has_mask_ ? num_tokens_ : 0) + num_docs_ * 8;
    DT_ENFORCE(expect == room, IoError,
               "token shard '{}' is truncated or has trailing bytes: expected {} payload bytes, found {}", path, expect,
               room);
    tokens_ = base_ + SHARD_HEADER_BYTES;
    mask_ = has_mask_ ? tokens_ + num_tokens_ * width_ : nullptr;
    docs_ = tokens_ + num_tokens_ * width_ + (has_mask_ ? num_tokens_ : 0);
    if (verify)
      DT_ENFORCE(get<uint32_t>(h + 48) == crc32_of(tokens_, room), IoError,
                 "token shard '{}' is corrupt (payload checksum mismatch); regenerate it", path);
    DT_ENFORCE(num_tokens_ == 0 || (num_docs_ > 0 && doc_start(0) == 0), IoError,
               "token shard '{}' has no valid document index", path);
    for (size_t d = 1; d < num_docs_; ++d)
      DT_ENFORCE(doc_start(d) > doc_start(d - 1) && doc_start(d) < num_tokens_, IoError,
                 "token shard '{}': document {} starts at {}, out of order", path, d, doc_start(d));
    DT_ENFORCE(!pairwise_ || num_docs_ % 2 == 0, IoError,
               "token shard '{}' is pairwise but holds {} documents, not (chosen, rejected) pairs", path, num_docs_);
  } catch (...) {
    release();
    throw;
  }
}

ShardReader::~ShardReader() { release(); }

ShardReader::ShardReader(ShardReader&& o) noexcept { *this = std::move(o); }

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    num_tokens_ = o.num_tokens_;
    num_docs_ = o.num_docs_;
    width_ = o.width_;
    has_mask_ = o.has_mask_;
    pairwise_ = o.pairwise_;
    vocab_size_ = o.vocab_size_;
    eos_id_ = o.eos_id_;
    pad_id_ = o.pad_id_;
    tokens_ = o.tokens_;
    mask_ = o.mask_;
    docs_ = o.docs_;
  }
  return *this;
}

void ShardReader::release() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), bytes_);
  base_ = nullptr;
}

int32_t ShardReader::token(size_t i) const {
  return width_ == 2 ? static_cast<int32_t>(get<uint16_t>(tokens_ + 2 * i))
                     : static_cast<int32_t>(get<uint32_t>(tokens_ + 4 * i));
}

bool ShardReader::mask(size_t i) const { return !has_mask_ || mask_[i] != 0; }

uint64_t ShardReader::doc_start(size_t d) const { return get<uint64_t>(docs_ + 8 * d); }

uint64_t ShardReader::doc_end(size_t d) const { return d + 1 < num_docs_ ? doc_start(d + 1) : num_tokens_; }

void ShardReader::read_tokens(size_t begin, size_t n, int32_t* out) const {
  DT_CHECK(begin <= num_tokens_ && n <= num_tokens_ - begin);
  for (size_t i = 0; i < n; ++i) out[i] = token(begin + i);
}

TokenData ShardReader::to_data() const {
  TokenData d;
  d.tokens.resize(num_tokens_);
  read_tokens(0, num_tokens_, d.tokens.data());
  if (has_mask_) d.mask.assign(mask_, mask_ + num_tokens_);
  d.doc_starts.resize(num_docs_);
  for (size_t i = 0; i < num_docs_; ++i) d.doc_starts[i] = doc_start(i);
  d.vocab_size = vocab_size_;
  d.eos_id = eos_id_;
  d.pad_id = pad_id_;
  d.pairwise = pairwise_;
  return d;
}

}  // namespace dtrain::data
