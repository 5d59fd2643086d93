// Hostfile entries that name one machine twice ("localhost" and "127.0.0.1", a name and
// its address): each would get its own agent numbering the devices from 0, so two ranks
// would share a GPU. Found when the job is planned and refused with both lines named.
#pragma once

#include "config/hostfile.h"

#include <functional>
#include <string>
#include <vector>

namespace dtrain::launch {

/// What tells machines apart: whether a host is this machine, and the numeric
/// addresses its name resolves to (empty when it does not resolve: never a match).
struct HostIdentity {
  bool local = false;
  std::vector<std::string> addresses;
};

/// host_is_local(host) and its getaddrinfo addresses (IPv4-mapped IPv6 as IPv4).
HostIdentity host_identity(const std::string& host);

/// ConfigError naming both entries (path:line when from a file) when two hosts of `hf`
/// are one machine: both this machine (the launcher's), or both reached on one address
/// and one ssh port (a different port= on one address may be another machine behind
/// NAT, so it is allowed). `identify` is host_identity unless a test replaces it.
void hosts_check_distinct(const config::Hostfile& hf,
                          const std::function<HostIdentity(const std::string&)>& identify = host_identity);

}  // namespace dtrain::launch
