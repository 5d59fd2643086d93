// Host names and IP literals as the launcher writes and reads them: IPv6 literals bare
// ("::1", "fe80::1%eth0") where a host stands alone, in brackets ("[::1]:29500") where a
// port follows, so logs, tables and endpoints stay unambiguous.
#pragma once

#include <string>
#include <string_view>

namespace dtrain {

/// True for an IPv6 address literal without brackets, optionally with a zone
/// ("fe80::1%eth0", "fe80::1%2"; the zone is letters, digits, '.', '-', '_').
bool ipv6_literal(std::string_view s);

/// "[::1]" -> "::1" (an IPv6 literal in brackets loses them); anything else unchanged.
std::string address_unbracket(std::string_view s);

/// "host:port", or "[v6]:port" when host is an IPv6 literal.
std::string host_port_text(std::string_view host, int port);

/// True for an address that means "this machine" wherever it is dialled: a loopback IP
/// literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z; brackets allowed) or a localhost name.
/// A host name that merely resolves to loopback here is not one (other nodes may resolve
/// it to this host's network address).
bool address_is_loopback(std::string_view s);

/// This machine's host name (gethostname), "unknown-host" when it cannot be read.
std::string host_name();

}  // namespace dtrain
