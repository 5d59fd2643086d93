// IPv6 literal recognition, host:port formatting and this host's name, shared by the hostfile, placement,
// rendezvous and SSH code.
#include "core/net_address.h"

#include <unistd.h>

#include <arpa/inet.h>

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

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace dtrain
