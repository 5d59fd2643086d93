// Build id: the SHA-256 of the running executable (OpenSSL EVP), read once per process.
#include "core/version.h"

#include "core/log.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace dtrain {

std::string file_sha256(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (error) *error = std::string("cannot open ") + path + ": " + std::strerror(errno);
    return "";
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    if (error) *error = "OpenSSL cannot start a SHA-256 digest";
    return "";
  }
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
  }
  if (in.bad()) {
    if (error) *error = std::string("read error in ") + path;
    return "";
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

const std::string& build_id() {
  static const std::string id = [] {
    std::string error;
    std::string h = file_sha256("/proc/self/exe", &error);
    if (h.empty()) {
      log_warn("build id unknown: {}", error);
      return std::string("unknown");
    }
    return h;
  }();
  return id;
}

}  // namespace dtrain
