// IPv6 literal recognition, host:port formatting and this host's name, shared by the hostfile, placement,
// rendezvous and SSH code.
#include "core/net_address.h"

#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>

#include <fmt/format.h>

namespace dtrain {

bool ipv6_literal(std::string_view s) {
  const size_t pct = s.find('%');
  const std::string_view addr = s.substr(0, pct);
  if (addr.empty() || addr.size() >= INET6_ADDRSTRLEN || addr.find(':') == std::string_view::npos) return false;
  if (pct != std::string_view::npos) {
    const std::string_view zone = s.substr(pct + 1);
    if (zone.empty() || zone.size() > 64) return false;
    for (char c : zone) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '-' || c == '_';
      if (!ok) return false;
    }
  }
  unsigned char buf[16];
  return ::inet_pton(AF_INET6, std::string(addr).c_str(), buf) == 1;
}

std::string address_unbracket(std::string_view s) {
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']' && ipv6_literal(s.substr(1, s.size() - 2)))
    return std::string(s.substr(1, s.size() - 2));
  return std::string(s);
}

std::string host_port_text(std::string_view host, int port) {
  return ipv6_literal(host) ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

bool address_is_loopback(std::string_view s) {
  const std::string a = address_unbracket(s);
  if (a == "localhost" || a == "localhost.localdomain" || a == "ip6-localhost" || a == "ip6-loopback") return true;
  unsigned char v4[4], v6[16];
  if (::inet_pton(AF_INET, a.c_str(), v4) == 1) return v4[0] == 127;
  if (::inet_pton(AF_INET6, a.c_str(), v6) != 1) return false;
  static const unsigned char loop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::equal(v6, v6 + 16, loop6) || (std::equal(v6, v6 + 12, mapped) && v6[12] == 127);
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace dtrain
