// Same-machine detection over the selected hosts: local aliases and shared addresses.
#include "launch/same_machine.h"

#include "core/check.h"
#include "launch/local_spawner.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>

namespace dtrain::launch {

namespace {

std::string where(const config::Hostfile& hf, const config::HostEntry& h) {
  if (hf.path.empty() || h.line <= 0) return fmt::format("host \"{}\"", h.host);
  return fmt::format("{}:{} (\"{}\")", hf.path, h.line, h.host);
}

}  // namespace

HostIdentity host_identity(const std::string& host) {
  HostIdentity id;
  id.local = host_is_local(host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return id;
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  for (addrinfo* a = res; a; a = a->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof ss));
    socklen_t len = a->ai_addrlen;
    // ::ffff:10.0.0.1 and 10.0.0.1 are one address.
    if (a->ai_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
        sockaddr_in v4{};
        v4.sin_family = AF_INET;
        std::memcpy(&v4.sin_addr, &v6->sin6_addr.s6_addr[12], 4);
        std::memcpy(&ss, &v4, sizeof v4);
        len = sizeof v4;
      }
    }
    char text[NI_MAXHOST];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0 &&
        std::find(id.addresses.begin(), id.addresses.end(), text) == id.addresses.end())
      id.addresses.emplace_back(text);
  }
  return id;
}

void hosts_check_distinct(const config::Hostfile& hf, const std::function<HostIdentity(const std::string&)>& identify) {
  // One pass with the first entry seen per key (this machine; address and port): a
  // pairwise comparison took minutes on a 200,000-line hostfile. The pair reported is the
  // one the pairwise order found first: the earliest later entry, with its earliest match.
  std::optional<size_t> first_local;
  std::unordered_map<std::string, size_t> first_at;     // "port address" -> entry index
  std::unordered_map<std::string, HostIdentity> known;  // a name repeated is resolved once
  for (size_t j = 0; j < hf.hosts.size(); ++j) {
    const config::HostEntry& b = hf.hosts[j];
    auto it = known.find(b.host);
    if (it == known.end()) it = known.emplace(b.host, identify(b.host)).first;
    const HostIdentity& id = it->second;
    std::optional<size_t> match;
    std::string why;
    if (id.local && first_local) {
      match = *first_local;
      why = "both are this machine, where the launcher runs";
    }
    for (const auto& addr : id.addresses) {
      auto hit = first_at.find(fmt::format("{} {}", b.port, addr));
      if (hit != first_at.end() && (!match || hit->second < *match)) {
        match = hit->second;
        why = fmt::format("both resolve to {}", addr);
      }
    }
    if (match) {
      const config::HostEntry& a = hf.hosts[*match];
      DT_THROW(ConfigError,
               "{} and {} are the same machine ({}): each line would get its own agent numbering the devices from "
               "0, so ranks would share devices. List the machine once with all its slots, e.g. \"{} slots={}\"",
               where(hf, a), where(hf, b), why, a.destination(), a.slots + b.slots);
    }
    if (id.local && !first_local) first_local = j;
    for (const auto& addr : id.addresses) first_at.emplace(fmt::format("{} {}", b.port, addr), j);
  }
}

}  // namespace dtrain::launch
