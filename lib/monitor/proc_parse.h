// Parsers of the /proc files the resource monitor reads (/proc/stat, /proc/self/stat,
// /proc/self/status, /proc/meminfo, /proc/net/dev): pure functions over the text, so
// they are tested against captured files; plus the bounded reader of such a file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::monitor {

/// The node's CPU time in clock ticks from /proc/stat's aggregate "cpu" line: busy =
/// everything but idle and iowait (guest time is already inside user/nice).
struct CpuTimes {
  uint64_t busy = 0, total = 0;
};
std::optional<CpuTimes> parse_proc_stat(std::string_view text);

/// utime + stime (clock ticks) of /proc/<pid>/stat; the command name in parentheses may
/// hold spaces and ')' so fields are counted from the last ')'.
std::optional<uint64_t> parse_pid_stat_cpu(std::string_view text);

/// VmRSS of /proc/<pid>/status, in bytes.
std::optional<int64_t> parse_status_rss(std::string_view text);

/// MemTotal and MemAvailable of /proc/meminfo, in bytes (-1 = not in the file: kernels
/// before 3.14 have no MemAvailable).
struct MemInfo {
  int64_t total = -1, available = -1;
};
MemInfo parse_meminfo(std::string_view text);

/// Cumulative bytes per interface of /proc/net/dev (its two header lines skipped).
struct NetCounters {
  std::string iface;
  uint64_t rx_bytes = 0, tx_bytes = 0;
};
std::vector<NetCounters> parse_net_dev(std::string_view text);

/// The whole of a /proc file (they report size 0, so read until EOF), at most 1 MiB;
/// nullopt when it cannot be opened or read.
std::optional<std::string> proc_read(const std::string& path);

}  // namespace dtrain::monitor
