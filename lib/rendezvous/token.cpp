// Per-job token generation (kernel randomness) and constant-time comparison, plus the
// job/round key scoping helpers.
#include "rendezvous/store.h"

#include "core/check.h"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

namespace dtrain::rendezvous {

namespace {

void random_fill(unsigned char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(buf + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == ENOSYS) break;  // very old kernel: fall back to the device
    DT_SYS_CHECK(r);
  }
  if (got == n) return;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  DT_SYS_CHECK(fd);
  while (got < n) {
    ssize_t r = ::read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      DT_THROW(IoError, "cannot read /dev/urandom for the job token");
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
}

}  // namespace

std::string token_generate() {
  unsigned char bytes[32];
  random_fill(bytes, sizeof(bytes));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

bool token_equal(std::string_view a, std::string_view b) {
  // Always walk the longer length so the time does not depend on where they differ.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// ----------------------------------------------------------------------------

std::string store_prefix(const std::string& job_id, int round) {
  DT_ENFORCE(!job_id.empty() && job_id.find('/') == std::string::npos, UsageError,
             "job id '{}' must be non-empty and contain no '/'", job_id);
  DT_ENFORCE_GE(round, 0, UsageError, "rendezvous round for job '{}'", job_id);
  return fmt::format("job/{}/r{}/", job_id, round);
}

std::string store_key(const std::string& job_id, int round, const std::string& key) {
  return store_prefix(job_id, round) + key;
}

std::vector<std::string> PrefixStore::scoped(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

}  // namespace dtrain::rendezvous
