// Hostfile: DeepSpeed's "host slots=N" grammar, parsed into an ordered list of hosts.
// Every malformed input raises dtrain::ConfigError naming path:line and the line.
// Filters (--include/--exclude/--num-nodes/--num-gpus) live in config/host_filter.h.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain::config {

/// Most slots one host may declare; a larger value is a typo, not a machine.
inline constexpr int HOSTFILE_MAX_SLOTS = 1024;
/// Most hosts one hostfile may list: above the largest clusters; a longer file is a
/// generated mistake, refused at once instead of planned (and printed) host by host.
inline constexpr int HOSTFILE_MAX_HOSTS = 65536;

/// The name two host entries are compared by: case-folded, IPv6 literals in their one
/// canonical text (so ::1 and 0:0::1 are one host, and so are node1 and NODE1, and
/// fe80::1%eth0 and fe80::1%ETH0).
std::string host_key(const std::string& host);

/// One host line. `host` never contains '@', and ':' only as an IPv6 literal (kept
/// without brackets: "::1", "fe80::1%eth0"); `user` is empty unless the line was
/// `user@host`. slot_ids are the device ids the job may use on this host, ascending:
/// 0..slots-1 as parsed, a subset after hostfile_select().
struct HostEntry {
  std::string user;
  std::string host;
  int port = 0;  // 0 = the cluster default (ssh port 22 unless configured)
  int slots = 0;
  std::vector<int> slot_ids;
  int line = 0;  // 1-based line in the hostfile; 0 when not from a file

  /// "user@host" or "host" (no port, IPv6 literals bare): what ssh and the tables show.
  std::string destination() const;
};

struct Hostfile {
  std::string path;  // "" when synthesized (hostfile_localhost)
  std::vector<HostEntry> hosts;

  /// Sum of the selected slots (slot_ids) over all hosts: the world size.
  int total_slots() const;
};

/// Parses hostfile text. The grammar, one host per line:
///
///     [user@]host slots=N [port=P]   [# comment]
///
/// - `host`: letters, digits, '.', '-', '_' (not starting with '-'), or an IPv6 literal,
///   bare (::1, fe80::1%eth0) or in brackets ([::1]); names are unique (compared
///   case-insensitively, IPv6 literals by address) whatever the user or port.
/// - `user`: letters, digits, '.', '-', '_' (not starting with '-').
/// - `slots=N`: required, 1 <= N <= HOSTFILE_MAX_SLOTS.
/// - `port=P` (dtrain extension, not in DeepSpeed): the node's ssh port, 1..65535, so
///   hosts behind non-22 ports need no ssh_config. Keys may come in any order, once each.
/// - Blank lines, whole-line `#` comments and trailing `# comments` are ignored; tokens
///   may be separated by any spaces/tabs; a trailing '\r' (CRLF files) is ignored.
/// `path` is used only in error messages and stored in the result.
Hostfile hostfile_parse(std::string_view text, const std::string& path);

/// Reads and parses a hostfile (any readable file, including pipes like <(...)).
/// ConfigError naming the path when it cannot be read or holds no host.
Hostfile hostfile_load(const std::string& path);

/// The hostfile used when none is given: "localhost slots=N".
Hostfile hostfile_localhost(int slots);

}  // namespace dtrain::config
