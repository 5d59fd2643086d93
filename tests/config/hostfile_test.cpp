// Hostfile grammar: accepted forms, every error message (path:line and the line shown),
// the shipped hostfiles/, and a seeded mutation test that only ConfigError ever escapes.
#include "config/hostfile.h"

#include "core/error.h"
#include "core/net_address.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>

using namespace dtrain;
using namespace dtrain::config;

namespace {

// The ConfigError message for parsing `text`, or "" (and a test failure) when it parses.
std::string parse_error(std::string_view text, const std::string& path = "hosts.txt") {
  try {
    hostfile_parse(text, path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL_CHECK("expected a ConfigError for: " << std::string(text));
  return "";
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

}  // namespace

// ----------------------------------------------------------------------------
// Accepted forms

TEST_CASE("hostfile: DeepSpeed lines, comments, blanks, tabs, user@host, port") {
  const char* text =
      "# cluster A\n"
      "\n"
      "worker-0 slots=8\n"
      "   \t\n"
      "ubuntu@worker-1\t\tslots=4   # trailing comment\n"
      "  worker-2   slots=2 port=2222\n"
      "w3 port=23 slots=1#no space before comment\n"
      "   # indented comment\n";
  Hostfile hf = hostfile_parse(text, "h");
  REQUIRE(hf.hosts.size() == 4);
  CHECK(hf.path == "h");
  CHECK(hf.total_slots() == 15);

  CHECK(hf.hosts[0].host == "worker-0");
  CHECK(hf.hosts[0].user.empty());
  CHECK(hf.hosts[0].slots == 8);
  CHECK(hf.hosts[0].port == 0);
  CHECK(hf.hosts[0].line == 3);
  CHECK(hf.hosts[0].slot_ids == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(hf.hosts[0].destination() == "worker-0");

  CHECK(hf.hosts[1].user == "ubuntu");
  CHECK(hf.hosts[1].host == "worker-1");
  CHECK(hf.hosts[1].slots == 4);
  CHECK(hf.hosts[1].line == 5);
  CHECK(hf.hosts[1].destination() == "ubuntu@worker-1");

  CHECK(hf.hosts[2].port == 2222);
  CHECK(hf.hosts[2].slots == 2);
  CHECK(hf.hosts[3].port == 23);
  CHECK(hf.hosts[3].slots == 1);
  CHECK(hf.hosts[3].line == 7);
}

TEST_CASE("hostfile: CRLF line endings, no final newline, IP addresses") {
  Hostfile hf = hostfile_parse("10.0.0.1 slots=2\r\n10.0.0.2 slots=3", "h");
  REQUIRE(hf.hosts.size() == 2);
  CHECK(hf.hosts[0].host == "10.0.0.1");
  CHECK(hf.hosts[1].slots == 3);
  CHECK(hf.total_slots() == 5);
}

TEST_CASE("hostfile: IPv6 literals, bare or in brackets, with a zone, under a user") {
  Hostfile hf = hostfile_parse(
      "::1 slots=2\n[fe80::1%eth0] slots=1 port=2222\nroot@2001:db8::7 slots=4\nu@[2001:db8::8] slots=1\n"
      "fe80::2%lo slots=1 # link-local\n",
      "h");
  REQUIRE(hf.hosts.size() == 5);
  CHECK(hf.hosts[0].host == "::1");
  CHECK(hf.hosts[0].destination() == "::1");
  CHECK(hf.hosts[1].host == "fe80::1%eth0");
  CHECK(hf.hosts[1].port == 2222);
  CHECK(hf.hosts[2].user == "root");
  CHECK(hf.hosts[2].host == "2001:db8::7");
  CHECK(hf.hosts[2].destination() == "root@2001:db8::7");
  CHECK(hf.hosts[3].host == "2001:db8::8");
  CHECK(hf.hosts[4].host == "fe80::2%lo");
  // What the run directory's hostfile holds (destination slots=N) parses back the same.
  std::string again;
  for (const HostEntry& h : hf.hosts) again += h.destination() + " slots=" + std::to_string(h.slots) + "\n";
  Hostfile hf2 = hostfile_parse(again, "h2");
  REQUIRE(hf2.hosts.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(hf2.hosts[i].host == hf.hosts[i].host);
}

TEST_CASE("hostfile error: IPv6 spellings of one address are one host; malformed IPv6 names the line") {
  std::string m = parse_error("::1 slots=1\n0:0:0::1 slots=1\n");
  CHECK(contains(m, "hosts.txt:2:"));
  CHECK(contains(m, "duplicate host"));
  CHECK(contains(m, "hosts.txt:1"));
  for (const char* line : {"[::1 slots=1", "[node1] slots=1", "[] slots=1", "1:2:3 slots=1", "::1:: slots=1",
                           "fe80::1% slots=1", "fe80::1%e/th slots=1", "[::1]:22 slots=1", "::1 :22 slots=1"}) {
    CAPTURE(line);
    std::string e = parse_error(std::string("a slots=1\n") + line + "\n");
    CHECK(contains(e, "hosts.txt:2:"));
  }
}

TEST_CASE("hostfile: slots bounds and leading zeros") {
  CHECK(hostfile_parse("a slots=1", "h").hosts[0].slots == 1);
  CHECK(hostfile_parse("a slots=1024", "h").hosts[0].slots == HOSTFILE_MAX_SLOTS);
  CHECK(hostfile_parse("a slots=08", "h").hosts[0].slots == 8);
}

TEST_CASE("hostfile_localhost") {
  Hostfile hf = hostfile_localhost(2);
  REQUIRE(hf.hosts.size() == 1);
  CHECK(hf.hosts[0].host == "localhost");
  CHECK(hf.hosts[0].slot_ids == std::vector<int>{0, 1});
  CHECK(hf.total_slots() == 2);
  CHECK_THROWS_AS(hostfile_localhost(0), ConfigError);
  CHECK_THROWS_AS(hostfile_localhost(-3), ConfigError);
}

// ----------------------------------------------------------------------------
// Errors: each names path:line, shows the line and the grammar

TEST_CASE("hostfile error: duplicate host names both lines") {
  std::string m = parse_error("# c\nnode1 slots=8\nnode2 slots=8\nNODE1 slots=4\n");
  CHECK(contains(m, "hosts.txt:4:"));
  CHECK(contains(m, "duplicate host"));
  CHECK(contains(m, "NODE1 slots=4"));
  CHECK(contains(m, "hosts.txt:2"));
  // Same name under another user or port is still the same machine.
  CHECK(contains(parse_error("a slots=1\nroot@a slots=1 port=2\n"), "hosts.txt:2:"));
}

TEST_CASE("hostfile error: bad lines show path:line, the line and the grammar") {
  struct Case {
    const char* text;
    const char* shown;  // what the message must quote
    const char* why;
  };
  const Case cases[] = {
      {"node1\n", "node1", "missing slots=N"},
      {"node1 8\n", "node1 8", "unexpected word"},
      {"node1 slots 8\n", "node1 slots 8", "unexpected word"},
      {"node1 gpus=8\n", "node1 gpus=8", "unknown key"},
      {"slots=8\n", "slots=8", "must start with the host"},
      {"node1 slots=2 slots=2\n", "node1 slots=2 slots=2", "given twice"},
      {"node1 slots=2 port=1 port=2\n", "port=1 port=2", "given twice"},
      {"no$de slots=2\n", "no$de slots=2", "bad host name"},
      {"-oProxyCommand=x slots=2\n", "-oProxyCommand=x slots=2", "must start with the host"},
      {"-badhost slots=2\n", "-badhost slots=2", "bad host name"},
      {"@node1 slots=2\n", "@node1 slots=2", "bad user name"},
      {"us er@node1 slots=2\n", "us er@node1 slots=2", "unexpected word"},
      {"a@b@c slots=2\n", "a@b@c slots=2", "bad host name"},
      {"node1:22 slots=2\n", "node1:22 slots=2", "bad host name"},
      {"node1 slots=2 port=0\n", "port=0", "port must be an integer in 1..65535"},
      {"node1 slots=2 port=70000\n", "port=70000", "port must be"},
      {"node1 slots=2 port=\n", "port=", "port must be"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    std::string m = parse_error(std::string("# header\n") + c.text, "cluster/hosts");
    CHECK(contains(m, "cluster/hosts:2:"));
    CHECK(contains(m, c.shown));
    CHECK(contains(m, c.why));
    CHECK(contains(m, "expected \"host slots=N\""));
  }
}

TEST_CASE("hostfile error: slots not a positive integer") {
  const char* bad[] = {"0",          "-1", "-8", "+8", "", "eight", "8.0", "0x10", "1025", "99999999999999999999999999",
                       "2147483648", "8a", " "};
  for (const char* v : bad) {
    CAPTURE(v);
    std::string line = std::string("gpu-node slots=") + v;
    std::string m = parse_error("gpu-node0 slots=8\n" + line + "\n");
    CHECK(contains(m, "hosts.txt:2:"));
    CHECK(contains(m, "slots must be an integer in 1..1024"));
    CHECK(contains(m, line));
  }
}

TEST_CASE("hostfile error: control bytes in a line are escaped in the message") {
  std::string text("node\x01 slots=2\n", 14);
  std::string m = parse_error(text);
  CHECK(contains(m, "node\\x01 slots=2"));
  CHECK(m.find('\x01') == std::string::npos);
  std::string nul("a\0b slots=1", 11);
  CHECK(contains(parse_error(nul), "a\\x00b slots=1"));
}

TEST_CASE("hostfile error: empty file, only comments") {
  for (const char* text : {"", "\n\n", "# only a comment\n   # another\n\t\n"}) {
    CAPTURE(text);
    std::string m = parse_error(text, "empty-hosts");
    CHECK(contains(m, "empty-hosts"));
    CHECK(contains(m, "no hosts"));
  }
}

TEST_CASE("hostfile_load: files, missing files, directories") {
  char tmpl[] = "/tmp/dtrain_hostfile_XXXXXX";
  int fd = mkstemp(tmpl);
  REQUIRE(fd >= 0);
  close(fd);
  {
    std::ofstream f(tmpl);
    f << "alpha slots=2\nbeta slots=3\n";
  }
  Hostfile hf = hostfile_load(tmpl);
  CHECK(hf.path == tmpl);
  CHECK(hf.total_slots() == 5);
  {
    std::ofstream f(tmpl, std::ios::trunc);
    f << "alpha slots=2\nalpha slots=3\n";
  }
  try {
    hostfile_load(tmpl);
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(contains(e.what(), std::string(tmpl) + ":2:"));
  }
  std::remove(tmpl);

  try {
    hostfile_load("/nonexistent/dir/hostfile");
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(contains(e.what(), "/nonexistent/dir/hostfile"));
    CHECK(contains(e.what(), "does not exist"));  // the input rule's words
  }
  try {
    hostfile_load("/tmp");
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(contains(e.what(), "/tmp"));
    CHECK(contains(e.what(), "directory"));
  }
}

TEST_CASE("hostfiles/ examples parse") {
  Hostfile local = hostfile_load("hostfiles/localhost");
  CHECK(local.hosts.size() == 1);
  CHECK(local.hosts[0].host == "localhost");

  Hostfile two = hostfile_load("hostfiles/two-nodes-8");
  CHECK(two.hosts.size() == 2);
  CHECK(two.total_slots() == 16);

  Hostfile hetero = hostfile_load("hostfiles/hetero");
  REQUIRE(hetero.hosts.size() == 3);
  CHECK(hetero.hosts[0].slots == 8);
  CHECK(hetero.hosts[1].slots == 4);
  CHECK(hetero.hosts[2].slots == 2);
  bool any_user = false;
  for (const HostEntry& h : hetero.hosts) any_user |= !h.user.empty();
  CHECK(any_user);

  Hostfile four = hostfile_load("hostfiles/four-nodes-8");
  CHECK(four.hosts.size() == 4);
  CHECK(four.total_slots() == 32);
}

// ----------------------------------------------------------------------------
// Mutation test: arbitrary damage is either accepted (and then well-formed) or a
// ConfigError; nothing else escapes and nothing hangs.

TEST_CASE("hostfile: seeded mutations raise only ConfigError") {
  const std::vector<std::string> base = {
      "# cluster",        "node1 slots=8", "ubuntu@node2 slots=4 # gpu box", "", "node3\tslots=2 port=2222",
      "10.1.2.3 slots=1",
  };
  const std::vector<std::string> junk = {
      "slots=", "slots=-1", "slots=0", "slots=99999999999999999999", "port=99999", "@",
      "#",      "=",        "\t",      std::string("\0", 1),         "\xff\xfe",   "\r",
      "node1",  "slots=3",  "x@y",     "slots=2147483647",           "port=-1",    "\n",
  };
  std::mt19937 rng(20240601u);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<std::string> lines = base;
    int edits = 1 + static_cast<int>(pick(4));
    for (int k = 0; k < edits; ++k) {
      std::string& l = lines[pick(lines.size())];
      switch (pick(8)) {
        case 0: l = l.substr(0, pick(l.size() + 1)); break;                        // truncate
        case 1: std::swap(l, lines[pick(lines.size())]); break;                    // swap lines
        case 2: lines.push_back(lines[pick(lines.size())]); break;                 // duplicate
        case 3: l.insert(pick(l.size() + 1), 1, static_cast<char>(rng())); break;  // garbage
        case 4: l.insert(pick(l.size() + 1), junk[pick(junk.size())]); break;
        case 5: l = "n" + std::to_string(rng()) + " slots=" + junk[pick(junk.size())]; break;
        case 6: l = "h" + std::to_string(iter) + " slots=-" + std::to_string(rng()); break;
        case 7: lines.erase(lines.begin() + static_cast<long>(pick(lines.size()))); break;
      }
      if (lines.empty()) lines.push_back("");
    }
    std::string text;
    for (const std::string& l : lines) text += l + "\n";
    try {
      Hostfile hf = hostfile_parse(text, "fuzz");
      ++accepted;
      REQUIRE(!hf.hosts.empty());
      std::set<std::string> names;
      for (const HostEntry& h : hf.hosts) {
        CHECK(h.slots >= 1);
        CHECK(h.slots <= HOSTFILE_MAX_SLOTS);
        CHECK(h.slot_ids.size() == static_cast<size_t>(h.slots));
        CHECK(names.insert(h.host).second);
        CHECK(h.host.find_first_of("@# \t\n$'\"") == std::string::npos);
        if (h.host.find(':') != std::string::npos) CHECK(dtrain::ipv6_literal(h.host));
      }
    } catch (const ConfigError& e) {
      ++rejected;
      CHECK(contains(e.what(), "fuzz"));
    }
  }
  // The mutations must exercise both outcomes or the test proves nothing.
  CHECK(accepted > 100);
  CHECK(rejected > 100);
}
