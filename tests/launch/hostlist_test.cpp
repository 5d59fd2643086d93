// Slurm hostlist expansion: a table whose expected names were printed by Slurm 22.05's
// `scontrol show hostnames`, malformed lists, the suffix extension, compress round trips,
// and (where scontrol is installed) random expressions compared with scontrol live.
#include "launch/hostlist.h"

#include "core/error.h"
#include "skip.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

using dtrain::launch::hostlist_compress;
using dtrain::launch::hostlist_expand;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// Captured with: SLURM_CONF=<minimal conf> scontrol show hostnames "<expr>" (Slurm 22.05.8).
const std::pair<const char*, const char*> kScontrolTable[] = {
    {"node[01-03]", "node01 node02 node03"},
    {"rack[1-2]-node[01-02]", "rack1-node01 rack1-node02 rack2-node01 rack2-node02"},
    {"node[001-003,007]", "node001 node002 node003 node007"},
    {"n[8-11]", "n8 n9 n10 n11"},
    {"n[08-11]", "n08 n09 n10 n11"},
    {"n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10"},
    {"x,y", "x y"},
    {"n[1-2],m[3-4]", "n1 n2 m3 m4"},
    {"a b", "a b"},
    {"n[1,1]", "n1 n1"},
    {"n1[0-2]", "n10 n11 n12"},
    {"[1-2]", "1 2"},
    {"n[1-2],", "n1 n2"},
    {",n", "n"},
    {"n[01-2]", "n01 n02"},
    {"n[1-3,2]", "n1 n2 n3 n2"},
    {"n[009-011]", "n009 n010 n011"},
    {"n[1-2]-[3-4]", "n1-3 n1-4 n2-3 n2-4"},
    {"n,,m", "n m"},
    {"n[0-0]", "n0"},
    {"n[00-00]", "n00"},
    {"a[1-3]b[1-2]", "a1b1 a1b2 a2b1 a2b2 a3b1 a3b2"},
    {"a[1-2]b[3-4]c[5-6]", "a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 a1b4c6 a2b4c5 a2b4c6"},
    {"n[1-2][3-4]", "n13 n14 n23 n24"},
    {"n[1-2]-[3-4]-[5-6]", "n1-3-5 n1-3-6 n2-3-5 n2-3-6 n1-4-5 n1-4-6 n2-4-5 n2-4-6"},
    {"n[9-10]-[1-2]", "n9-1 n9-2 n10-1 n10-2"},
    {"n[1-2] m[3]", "n1 n2 m3"},
    {"n[007]", "n007"},
    {"node[1-2]a[1-2]", "node1a1 node1a2 node2a1 node2a2"},
    {"a[1-2]b[3-4]c[5-6]d[7-8]",
     "a1b3c5d7 a1b3c5d8 a2b3c5d7 a2b3c5d8 a1b4c5d7 a1b4c5d8 a2b4c5d7 a2b4c5d8 a1b3c6d7 a1b3c6d8 a2b3c6d7 "
     "a2b3c6d8 a1b4c6d7 a1b4c6d8 a2b4c6d7 a2b4c6d8"},
    {"n[1-2,5]-[3-4]", "n1-3 n1-4 n2-3 n2-4 n5-3 n5-4"},
    {"n[1-3]-[01-02,5]", "n1-01 n1-02 n1-5 n2-01 n2-02 n2-5 n3-01 n3-02 n3-5"},
    {"gpu-a100-[098-102],login.cluster",
     "gpu-a100-098 gpu-a100-099 gpu-a100-100 gpu-a100-101 gpu-a100-102 login.cluster"},
    {"n_1.x-y", "n_1.x-y"},
    {"n[00000000000000000001-2]", "n00000000000000000001 n00000000000000000002"},
    {"node[99-101]", "node99 node100 node101"},
};

std::string error_of(const std::string& expr) {
  try {
    auto v = hostlist_expand(expr);
    return "no error: " + join(v).substr(0, 200);
  } catch (const dtrain::ConfigError& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("hostlist: Slurm's own expansions") {
  for (const auto& [e, expected] : kScontrolTable) {
    std::string expr = e;
    CAPTURE(expr);
    CHECK(join(hostlist_expand(expr)) == expected);
  }
}

TEST_CASE("hostlist: empty input and separators") {
  CHECK(hostlist_expand("").empty());
  CHECK(hostlist_expand(" , ,\t\n").empty());
  CHECK(join(hostlist_expand("a\tb\nc")) == "a b c");
}

TEST_CASE("hostlist: suffix after brackets (extension)") {
  CHECK(join(hostlist_expand("node[1-2]-ib")) == "node1-ib node2-ib");
  CHECK(join(hostlist_expand("a[1-3]b")) == "a1b a2b a3b");
  CHECK(join(hostlist_expand("rack[1-2]-node[01-02].ib")) ==
        "rack1-node01.ib rack1-node02.ib rack2-node01.ib rack2-node02.ib");
  CHECK(join(hostlist_expand("n[1-2]x,m")) == "n1x n2x m");
}

TEST_CASE("hostlist: malformed lists are ConfigErrors naming the column") {
  struct Bad {
    const char* expr;
    const char* words;
  };
  const Bad bad[] = {
      {"n[1-2", "column 2: '[' is never closed"},
      {"n1-2]", "column 5: ']' without a matching '['"},
      {"n[1-2]],x", "']' without a matching '['"},
      {"n[[1-2]]", "cannot nest"},
      {"n[3-1]", "runs backwards; write it as 1-3"},
      {"n[010-1]", "runs backwards"},
      {"n[]", "empty brackets"},
      {"n[a-b]", "'a' in range 'a-b' is not a digit"},
      {"n[1--2]", "'-' in range '1--2' is not a digit"},
      {"n[-1]", "range '-1' has no first number"},
      {"n[1-]", "range '1-' has no last number"},
      {"n[1-2,]", "empty range"},
      {"n[,1]", "empty range"},
      {"x[ 1-2]", "whitespace inside brackets"},
      {"n[1-65537]", "more than the 65536 Slurm allows"},
      {"n[1-99999999999999999999]", "too large"},
      {"user@host", "'@' cannot be part of a host name"},
      {"n[0-1023][0-1023][0-1]", "expands to more than 1048576 names"},
  };
  for (const auto& b : bad) {
    std::string msg = error_of(b.expr);
    CAPTURE(msg);
    CHECK(msg.find(b.words) != std::string::npos);
    CHECK(msg.find(std::string("hostlist '") + b.expr + "'") != std::string::npos);
  }
  CHECK(hostlist_expand("n[0-65535]").size() == 65536);
}

TEST_CASE("hostlist: compress is the inverse of expand") {
  CHECK(hostlist_compress({"n01", "n02", "n03", "x"}) == "n[01-03],x");
  CHECK(hostlist_compress({"n1", "n2", "n5", "n6", "n9"}) == "n[1-2,5-6,9]");
  CHECK(hostlist_compress({"n9", "n10"}) == "n9,n10");
  CHECK(hostlist_compress({"a"}) == "a");
  CHECK(hostlist_compress({}) == "");
  CHECK(hostlist_compress({"rack1-node01", "rack1-node02", "rack2-node01"}) == "rack1-node[01-02],rack2-node01");
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<std::string> hosts;
    int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const char* pfx[] = {"n", "gpu-", "r1n", "login"};
      std::string h = pfx[rng() % 4];
      if (rng() % 5) h += std::string(rng() % 3, '0') + std::to_string(rng() % 12);
      hosts.push_back(h);
    }
    CAPTURE(join(hosts));
    CHECK(hostlist_expand(hostlist_compress(hosts)) == hosts);
  }
}

// Random valid expressions against the real scontrol, when the machine has one.
TEST_CASE("hostlist: random expressions agree with scontrol") {
  if (std::system("command -v scontrol >/dev/null 2>&1") != 0) {
    ::dtrain::test::skip_test("scontrol not installed (apt-get install slurm-client): live comparison skipped");
    return;
  }
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("dtrain-hostlist-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream conf(dir / "slurm.conf");
    conf << "ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
            "PartitionName=p Nodes=localhost Default=YES\n";
  }
  std::mt19937 rng(11);
  auto num = [&](int width) {
    std::string s = std::to_string(rng() % 30);
    while (static_cast<int>(s.size()) < width) s = "0" + s;
    return s;
  };
  // Several expressions per scontrol call: one line of output each, separated by a marker.
  std::vector<std::string> exprs;
  for (int i = 0; i < 60; ++i) {
    std::string e;
    int items = 1 + static_cast<int>(rng() % 3);
    for (int it = 0; it < items; ++it) {
      if (it) e += rng() % 2 ? "," : " ";
      e += std::string(1, static_cast<char>('a' + rng() % 3));
      int groups = static_cast<int>(rng() % 4);
      for (int g = 0; g < groups; ++g) {
        if (g && rng() % 2) e += "-";
        e += "[";
        int ranges = 1 + static_cast<int>(rng() % 3);
        for (int r = 0; r < ranges; ++r) {
          if (r) e += ",";
          int w = static_cast<int>(rng() % 3);
          std::string lo = num(w);
          e += lo;
          if (rng() % 2) e += "-" + std::to_string(std::stoi(lo) + static_cast<int>(rng() % 4));
        }
        e += "]";
      }
    }
    exprs.push_back(e);
  }
  std::string script = "export SLURM_CONF='" + (dir / "slurm.conf").string() + "'\n";
  for (const auto& e : exprs) script += "scontrol show hostnames '" + e + "' | tr '\\n' ' '; echo\n";
  { std::ofstream(dir / "run.sh") << script; }
  std::string cmd = "sh '" + (dir / "run.sh").string() + "' > '" + (dir / "out.txt").string() + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(dir / "out.txt");
  std::string line;
  for (const auto& e : exprs) {
    REQUIRE(std::getline(in, line));
    while (!line.empty() && line.back() == ' ') line.pop_back();
    CAPTURE(e);
    CHECK(join(hostlist_expand(e)) == line);
  }
  fs::remove_all(dir);
}
