// Streaming token shard writer: the same bytes shard_write() gives for the same
// documents, without holding them. Integers little-endian (shard.cpp checks the host).
#include "data/shard_writer.h"

#include "core/check.h"
#include "data/shard.h"

#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

namespace dtrain::data {

namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

template <typename T>
void put_le(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& what) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    DT_ENFORCE(w > 0, IoError, "error writing shard '{}': {} (disk full?)", what,
               std::strerror(w < 0 ? errno : ENOSPC));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// The directory OUT is written in.
std::string out_dir(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// An unnamed temporary file in PATH's directory (the same file system as the shard, which
// may have more room than /tmp): nothing to clean up however the process ends.
int side_file(const std::string& path) {
  int fd = ::open(out_dir(path).c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string name = path + ".tmp.XXXXXX";  // no O_TMPFILE (NFS, Lustre): named for a moment
  fd = ::mkstemp(name.data());
  DT_ENFORCE(fd >= 0, IoError, "cannot create a temporary file beside shard '{}': {}", path, std::strerror(errno));
  ::unlink(name.c_str());
  return fd;
}

}  // namespace

void ShardWriter::Out::put(const void* p, size_t n, const std::string& what) {
  if (buf.size() + n > kBufferBytes) flush(what);
  if (n >= kBufferBytes) {
    write_all(fd, static_cast<const uint8_t*>(p), n, what);
    return;
  }
  const auto* b = static_cast<const uint8_t*>(p);
  buf.insert(buf.end(), b, b + n);
}

void ShardWriter::Out::flush(const std::string& what) {
  write_all(fd, buf.data(), buf.size(), what);
  buf.clear();
}

ShardWriter::ShardWriter(std::string path, int32_t vocab_size, int32_t eos_id, int32_t pad_id, bool has_mask,
                         bool pairwise)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), vocab_size_(vocab_size), eos_id_(eos_id), pad_id_(pad_id),
      has_mask_(has_mask), pairwise_(pairwise), width_(vocab_size <= 65536 ? 2 : 4) {
  DT_ENFORCE(vocab_size_ > 0, ConfigError, "shard '{}': vocab_size must be positive", path_);
  // An unnamed file in OUT's directory (O_TMPFILE), named OUT.tmp only when complete: a
  // prepare killed midway (Ctrl-C on a 10 GB input) then leaves no partial OUT.tmp, and the
  // kernel frees its blocks. File systems without O_TMPFILE (NFS, Lustre) get OUT.tmp at once.
  main_.fd = ::open(out_dir(path_).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  anonymous_ = main_.fd >= 0;
  if (!anonymous_) main_.fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  DT_ENFORCE(main_.fd >= 0, IoError, "cannot create shard '{}': {}", tmp_, std::strerror(errno));
  try {
    if (has_mask_) mask_.fd = side_file(path_);
    docs_.fd = side_file(path_);
    // The header's bytes are reserved now and written by finish() (pwrite at offset 0)
    // once the counts and checksums are known; a file never finished is never named.
    const std::array<uint8_t, SHARD_HEADER_BYTES> header_slot{};
    main_.put(header_slot.data(), header_slot.size(), tmp_);
  } catch (...) {
    close_all();
    std::error_code ignored;
    std::filesystem::remove(tmp_, ignored);
    throw;
  }
}

ShardWriter::~ShardWriter() {
  close_all();
  if (!done_) {
    std::error_code ignored;
    std::filesystem::remove(tmp_, ignored);
  }
}

void ShardWriter::close_all() {
  for (Out* o : {&main_, &mask_, &docs_}) {
    if (o->fd >= 0) ::close(o->fd);
    o->fd = -1;
  }
}

void ShardWriter::append(const int32_t* tokens, const uint8_t* mask, size_t n) {
  if (n == 0) return;
  DT_ENFORCE(has_mask_ == (mask != nullptr), InternalError, "all documents of one shard must have a mask, or none");
  DT_ENFORCE(!done_, InternalError, "shard '{}' is already finished", path_);
  scratch_.resize(n * width_);
  for (size_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    DT_ENFORCE(t >= 0 && t < vocab_size_, ConfigError, "shard '{}': token {} at position {} is outside [0, {})", path_,
               t, num_tokens_ + i, vocab_size_);
    if (width_ == 2) put_le<uint16_t>(scratch_.data() + 2 * i, static_cast<uint16_t>(t));
    else put_le<uint32_t>(scratch_.data() + 4 * i, static_cast<uint32_t>(t));
  }
  crc_ = static_cast<uint32_t>(crc32_z(crc_, scratch_.data(), scratch_.size()));
  main_.put(scratch_.data(), scratch_.size(), tmp_);
  if (has_mask_) {
    scratch_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      scratch_[i] = mask[i] ? 1 : 0;
      trained_ += scratch_[i];
    }
    mask_.put(scratch_.data(), n, tmp_);
  } else {
    trained_ += n;
  }
  uint8_t start[8];
  put_le<uint64_t>(start, num_tokens_);
  docs_.put(start, 8, tmp_);
  num_tokens_ += n;
  ++num_docs_;
}

void ShardWriter::finish() {
  DT_ENFORCE(!done_, InternalError, "shard '{}' is already finished", path_);
  DT_ENFORCE(!pairwise_ || num_docs_ % 2 == 0, InternalError,
             "pairwise shard '{}' has {} documents, not (chosen, rejected) pairs", path_, num_docs_);
  main_.flush(tmp_);
  // The mask, then the document offsets, copied after the tokens; the payload checksum
  // continues over them in file order.
  std::vector<uint8_t> block(kBufferBytes);
  for (Out* side : {&mask_, &docs_}) {
    if (side->fd < 0) continue;
    side->flush(tmp_);
    DT_ENFORCE(::lseek(side->fd, 0, SEEK_SET) == 0, IoError, "cannot rewind a temporary file of shard '{}': {}", tmp_,
               std::strerror(errno));
    for (;;) {
      const ssize_t r = ::read(side->fd, block.data(), block.size());
      if (r < 0 && errno == EINTR) continue;
      DT_ENFORCE(r >= 0, IoError, "cannot read back a temporary file of shard '{}': {}", tmp_, std::strerror(errno));
      if (r == 0) break;
      crc_ = static_cast<uint32_t>(crc32_z(crc_, block.data(), static_cast<size_t>(r)));
      write_all(main_.fd, block.data(), static_cast<size_t>(r), tmp_);
    }
  }
  std::array<uint8_t, SHARD_HEADER_BYTES> h{};
  std::memcpy(h.data(), SHARD_MAGIC, 8);
  put_le<uint32_t>(h.data() + 8, SHARD_VERSION);
  put_le<uint32_t>(h.data() + 12, width_);
  put_le<uint64_t>(h.data() + 16, num_tokens_);
  put_le<uint64_t>(h.data() + 24, num_docs_);
  put_le<uint32_t>(h.data() + 32, (has_mask_ ? SHARD_FLAG_MASK : 0u) | (pairwise_ ? SHARD_FLAG_PAIRWISE : 0u));
  put_le<int32_t>(h.data() + 36, vocab_size_);
  put_le<int32_t>(h.data() + 40, eos_id_);
  put_le<int32_t>(h.data() + 44, pad_id_);
  put_le<uint32_t>(h.data() + 48, crc_);
  put_le<uint32_t>(h.data() + 52, static_cast<uint32_t>(crc32_z(0, h.data(), 52)));
  DT_ENFORCE(::pwrite(main_.fd, h.data(), h.size(), 0) == static_cast<ssize_t>(h.size()), IoError,
             "error writing shard '{}' header: {} (disk full?)", tmp_, std::strerror(errno));
  if (anonymous_) {
    ::unlink(tmp_.c_str());  // a stale OUT.tmp, e.g. of a run on a file system without O_TMPFILE
    const std::string proc = "/proc/self/fd/" + std::to_string(main_.fd);
    const bool linked = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, tmp_.c_str(), AT_SYMLINK_FOLLOW) == 0 ||
                        ::linkat(main_.fd, "", AT_FDCWD, tmp_.c_str(), AT_EMPTY_PATH) == 0;
    DT_ENFORCE(linked, IoError, "cannot name the finished shard '{}': {}", tmp_, std::strerror(errno));
  }
  const int fd = main_.fd;
  main_.fd = -1;
  DT_ENFORCE(::close(fd) == 0, IoError, "error writing shard '{}': {} (disk full?)", tmp_, std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  DT_ENFORCE(!ec, IoError, "cannot rename '{}' to '{}': {}", tmp_, path_, ec.message());
  done_ = true;
  close_all();
}

}  // namespace dtrain::data
