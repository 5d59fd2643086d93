// Hostfile parsing: DeepSpeed's "host slots=N" lines plus dtrain's optional port=P.
// Strict on purpose: every line is either a host, blank or a comment, and each error
// names path:line and shows the offending line (control bytes escaped).
#include "config/hostfile.h"

#include "core/c_escape.h"
#include "core/check.h"
#include "core/input_file.h"
#include "core/net_address.h"

#include <arpa/inet.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

namespace dtrain::config {

namespace {

constexpr std::string_view GRAMMAR = "expected \"host slots=N\" (also \"user@host slots=N port=P\")";
constexpr size_t MAX_SHOWN = 160;             // longest line quoted back in an error
constexpr size_t MAX_FILE_BYTES = 16u << 20;  // a hostfile is never megabytes
// The longest a pipe given as the hostfile may stay silent (a generator that is slower
// than this is not writing a hostfile).
constexpr int HOSTFILE_PIPE_IDLE_MS = 30000;

// ----------------------------------------------------------------------------
// Small text helpers

std::string shown_path(const std::string& path) { return path.empty() ? "<hostfile>" : path; }

// The line as it can be printed on one terminal line: control and non-ASCII bytes
// escaped, long lines cut.
std::string line_shown(std::string_view line) {
  std::string out;
  for (size_t i = 0; i < line.size(); ++i) {
    if (out.size() >= MAX_SHOWN) {
      out += "...";
      break;
    }
    out += c_escape(line.substr(i, 1), {.quotes = true, .non_ascii = true});
  }
  return out;
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::vector<std::string_view> split_words(std::string_view s) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_blank(s[i])) ++i;
    size_t start = i;
    while (i < s.size() && !is_blank(s[i])) ++i;
    if (i > start) words.push_back(s.substr(start, i - start));
  }
  return words;
}

// Host and user names go into ssh argv and shell lines: keep them to a safe alphabet.
bool is_name(std::string_view s) {
  if (s.empty() || s.front() == '-' || s.size() > 253) return false;
  for (char c : s) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// Decimal digits only (no sign, no spaces), value in [lo, hi]; false otherwise.
bool parse_bounded(std::string_view s, long lo, long hi, int* out) {
  if (s.empty() || s.size() > 18) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

// ----------------------------------------------------------------------------
// One line

struct LineParser {
  const std::string& path;
  int line_no;
  std::string_view raw;

  [[noreturn]] void fail(const std::string& why) const {
    DT_THROW(ConfigError, "{}:{}: {} in line \"{}\"; {}", shown_path(path), line_no, why, line_shown(raw), GRAMMAR);
  }

  // Parses one non-blank, comment-stripped line into `entry`.
  HostEntry parse(std::string_view body) const {
    std::vector<std::string_view> words = split_words(body);
    DT_CHECK(!words.empty());
    HostEntry e;
    e.line = line_no;

    std::string_view dest = words[0];
    if (dest.find('=') != std::string_view::npos) fail("the line must start with the host name");
    size_t at = dest.find('@');
    if (at != std::string_view::npos) {
      e.user = std::string(dest.substr(0, at));
      dest = dest.substr(at + 1);
      if (!is_name(e.user))
        fail(fmt::format("bad user name \"{}\" (letters, digits, '.', '-', '_')", line_shown(e.user)));
    }
    if (!dest.empty() && dest.front() == '[') {
      // "[::1]": an IPv6 literal in brackets, as in ssh's and URLs' host:port forms.
      if (dest.size() < 3 || dest.back() != ']' || !ipv6_literal(dest.substr(1, dest.size() - 2)))
        fail(
            fmt::format("bad host name \"{}\" (brackets hold an IPv6 address, like [fe80::1%eth0]; give the ssh "
                        "port as port=P)",
                        line_shown(dest)));
      dest = dest.substr(1, dest.size() - 2);
    } else if (dest.find(':') != std::string_view::npos) {
      if (!ipv6_literal(dest))
        fail(
            fmt::format("bad host name \"{}\" (a ':' belongs only in an IPv6 address like ::1 or fe80::1%eth0; "
                        "give the ssh port as port=P, not host:port)",
                        line_shown(dest)));
    } else if (!is_name(dest)) {
      fail(
          fmt::format("bad host name \"{}\" (letters, digits, '.', '-', '_'; not starting with '-'; or an IP "
                      "address)",
                      line_shown(dest)));
    }
    e.host = std::string(dest);

    bool have_slots = false, have_port = false;
    for (size_t i = 1; i < words.size(); ++i) {
      std::string_view w = words[i];
      size_t eq = w.find('=');
      if (eq == std::string_view::npos)
        fail(fmt::format("unexpected word \"{}\" (only key=value pairs may follow the host)", line_shown(w)));
      std::string_view key = w.substr(0, eq), value = w.substr(eq + 1);
      if (key == "slots") {
        if (have_slots) fail("slots= given twice");
        if (!parse_bounded(value, 1, HOSTFILE_MAX_SLOTS, &e.slots))
          fail(fmt::format("slots must be an integer in 1..{}, got \"{}\"", HOSTFILE_MAX_SLOTS, line_shown(value)));
        have_slots = true;
      } else if (key == "port") {
        if (have_port) fail("port= given twice");
        if (!parse_bounded(value, 1, 65535, &e.port))
          fail(fmt::format("port must be an integer in 1..65535, got \"{}\"", line_shown(value)));
        have_port = true;
      } else {
        fail(fmt::format("unknown key \"{}\" (known: slots, port)", line_shown(key)));
      }
    }
    if (!have_slots) fail("missing slots=N");
    e.slot_ids.resize(static_cast<size_t>(e.slots));
    for (int s = 0; s < e.slots; ++s) e.slot_ids[static_cast<size_t>(s)] = s;
    return e;
  }
};

}  // namespace

std::string host_key(const std::string& host) {
  if (!ipv6_literal(host)) return lower(host);
  const size_t pct = host.find('%');
  in6_addr a{};
  char text[INET6_ADDRSTRLEN];
  if (::inet_pton(AF_INET6, host.substr(0, pct).c_str(), &a) != 1 || !::inet_ntop(AF_INET6, &a, text, sizeof text))
    return lower(host);
  return pct == std::string::npos ? std::string(text) : std::string(text) + lower(host.substr(pct));
}

// ----------------------------------------------------------------------------
// Public API

std::string HostEntry::destination() const { return user.empty() ? host : user + "@" + host; }

int Hostfile::total_slots() const {
  int n = 0;
  for (const HostEntry& h : hosts) n += static_cast<int>(h.slot_ids.size());
  return n;
}

Hostfile hostfile_parse(std::string_view text, const std::string& path) {
  Hostfile hf;
  hf.path = path;
  std::map<std::string, int> seen;  // lowercased host -> line
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;

    std::string_view body = raw.substr(0, std::min(raw.size(), raw.find('#')));
    if (split_words(body).empty()) continue;  // blank or comment
    LineParser lp{path, line_no, raw};
    HostEntry e = lp.parse(body);
    auto [it, inserted] = seen.emplace(host_key(e.host), line_no);
    if (!inserted)
      DT_THROW(ConfigError,
               "{}:{}: duplicate host \"{}\" in line \"{}\" (first given at {}:{}); list each "
               "host once with all its slots",
               shown_path(path), line_no, e.host, line_shown(raw), shown_path(path), it->second);
    if (hf.hosts.size() >= static_cast<size_t>(HOSTFILE_MAX_HOSTS))
      DT_THROW(ConfigError,
               "{}:{}: more than {} hosts; dtrain plans at most {} hosts per job (split the file, or "
               "select hosts with --include / --num-nodes from a shorter one)",
               shown_path(path), line_no, HOSTFILE_MAX_HOSTS, HOSTFILE_MAX_HOSTS);
    hf.hosts.push_back(std::move(e));
  }
  if (hf.hosts.empty())
    DT_THROW(ConfigError, "{}: the hostfile lists no hosts; {}, one host per line", shown_path(path), GRAMMAR);
  return hf;
}

Hostfile hostfile_load(const std::string& path) {
  // Non-blocking: a FIFO nothing writes to reads as end of file at once instead of
  // blocking the open (and the read) forever; a pipe that is written (bash's
  // --hostfile <(...)) is read as it arrives, each wait bounded by HOSTFILE_PIPE_IDLE_MS.
  // The input rule, with pipes let through: a directory, a device, a socket or a symbolic
  // link loop is refused before a byte is read.
  std::string problem;
  const InputFile file = input_file_try_open(path, MAX_FILE_BYTES, &problem, InputAccept::REGULAR_OR_FIFO);
  if (!problem.empty())
    DT_THROW(ConfigError, "hostfile {} {}: pass the hostfile's path (a regular file, or a pipe) to --hostfile",
             shown_path(path), problem);
  const int fd = file.fd();

  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, HOSTFILE_PIPE_IDLE_MS);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0)
        DT_THROW(ConfigError,
                 "hostfile {}: nothing arrived on this pipe for {} s (is anything writing to it?); "
                 "pass a regular file to --hostfile",
                 shown_path(path), HOSTFILE_PIPE_IDLE_MS / 1000);
      continue;
    }
    if (n < 0) DT_THROW(ConfigError, "cannot read hostfile {}: {}", shown_path(path), std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > MAX_FILE_BYTES)
      DT_THROW(ConfigError, "hostfile {} is larger than {} bytes; is it the right file?", shown_path(path),
               MAX_FILE_BYTES);
  }
  if (text.empty() && file.is_fifo())
    DT_THROW(ConfigError,
             "hostfile {} is a FIFO or pipe that gave no data (nothing was writing to it); pass a "
             "regular file to --hostfile",
             shown_path(path));
  return hostfile_parse(text, path);
}

Hostfile hostfile_localhost(int slots) {
  DT_ENFORCE(slots >= 1 && slots <= HOSTFILE_MAX_SLOTS, ConfigError, "localhost slot count must be in 1..{}, got {}",
             HOSTFILE_MAX_SLOTS, slots);
  HostEntry e;
  e.host = "localhost";
  e.slots = slots;
  for (int s = 0; s < slots; ++s) e.slot_ids.push_back(s);
  Hostfile hf;
  hf.hosts.push_back(std::move(e));
  return hf;
}

}  // namespace dtrain::config
