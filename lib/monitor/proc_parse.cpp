// /proc parsers for the resource monitor. Every parser tolerates a field it does not
// know and returns nothing (not a wrong number) for a line it cannot read.
#include "monitor/proc_parse.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

namespace dtrain::monitor {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Splits on runs of blanks.
std::vector<std::string_view> fields(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::optional<uint64_t> to_u64(std::string_view s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Calls fn(line) for each line until it returns false.
template <class Fn>
void each_line(std::string_view text, Fn fn) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    if (!fn(line)) return;
    if (nl == std::string_view::npos) return;
    text.remove_prefix(nl + 1);
  }
}

// "MemAvailable:   123 kB" -> bytes.
std::optional<int64_t> kb_value(std::string_view rest) {
  const auto f = fields(trim(rest));
  if (f.empty()) return std::nullopt;
  const auto v = to_u64(f[0]);
  if (!v) return std::nullopt;
  const uint64_t scale = f.size() >= 2 && (f[1] == "kB" || f[1] == "KB") ? 1024 : 1;
  return static_cast<int64_t>(*v * scale);
}

}  // namespace

std::optional<CpuTimes> parse_proc_stat(std::string_view text) {
  std::optional<CpuTimes> out;
  each_line(text, [&](std::string_view line) {
    const auto f = fields(line);
    if (f.empty() || f[0] != "cpu") return true;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    if (f.size() < 5) return false;
    CpuTimes t;
    for (size_t i = 1; i < f.size() && i <= 8; ++i) {
      const auto v = to_u64(f[i]);
      if (!v) return false;
      t.total += *v;
      if (i != 4 && i != 5) t.busy += *v;  // idle, iowait
    }
    out = t;
    return false;
  });
  return out;
}

std::optional<uint64_t> parse_pid_stat_cpu(std::string_view text) {
  const size_t close = text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  // After "pid (comm)": state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
  // cmajflt utime(14) stime(15): the 12th and 13th fields after the ')'.
  const auto f = fields(text.substr(close + 1));
  if (f.size() < 13) return std::nullopt;
  const auto ut = to_u64(f[11]), st = to_u64(f[12]);
  if (!ut || !st) return std::nullopt;
  return *ut + *st;
}

std::optional<int64_t> parse_status_rss(std::string_view text) {
  std::optional<int64_t> out;
  each_line(text, [&](std::string_view line) {
    if (line.substr(0, 6) != "VmRSS:") return true;
    out = kb_value(line.substr(6));
    return false;
  });
  return out;
}

MemInfo parse_meminfo(std::string_view text) {
  MemInfo m;
  each_line(text, [&](std::string_view line) {
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return true;
    const std::string_view key = line.substr(0, colon);
    if (key == "MemTotal") m.total = kb_value(line.substr(colon + 1)).value_or(-1);
    else if (key == "MemAvailable") m.available = kb_value(line.substr(colon + 1)).value_or(-1);
    return m.total < 0 || m.available < 0;
  });
  return m;
}

std::vector<NetCounters> parse_net_dev(std::string_view text) {
  std::vector<NetCounters> out;
  each_line(text, [&](std::string_view line) {
    // "  eth0: rx_bytes rx_packets errs drop fifo frame compressed multicast tx_bytes ...";
    // the header lines have '|' and no ':'. A long name may touch the colon ("eth0:123").
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || line.find('|') != std::string_view::npos) return true;
    const std::string_view name = trim(line.substr(0, colon));
    const auto f = fields(line.substr(colon + 1));
    if (name.empty() || f.size() < 9) return true;
    const auto rx = to_u64(f[0]), tx = to_u64(f[8]);
    if (rx && tx) out.push_back({std::string(name), *rx, *tx});
    return true;
  });
  return out;
}

std::optional<std::string> proc_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[8192];
  constexpr size_t kMax = 1 << 20;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0 || out.size() >= kMax) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace dtrain::monitor
