// Small secret-like files (a rendezvous token, an SSH private key): their type and size are
// checked on the open descriptor before a byte is read, so a directory, /dev/zero, a FIFO
// or a huge file ends in a clear error at once instead of a hang or exhausted memory.
#pragma once

#include <cstddef>
#include <string>

namespace dtrain {

/// "" when path is a readable regular file of at most max_bytes; otherwise what is wrong
/// ("is a directory", "is not a regular file (a FIFO)", "is 5000 bytes, more than the
/// 4096 allowed", "cannot be opened: ..."). Never blocks: a FIFO is opened non-blocking.
std::string small_file_problem(const std::string& path, size_t max_bytes);

/// The contents of a regular file of at most max_bytes; ConfigError "<what> <path> <problem>"
/// otherwise.
std::string small_file_read(const std::string& path, size_t max_bytes, const std::string& what);

}  // namespace dtrain
