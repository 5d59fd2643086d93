// One machine named twice in a hostfile: local aliases, names sharing an address and
// port, and what is allowed (different ports on one address, unresolvable names).
#include "launch/same_machine.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <map>

using namespace dtrain;
using namespace dtrain::launch;
using dtrain::config::hostfile_parse;

namespace {

std::string distinct_error(const config::Hostfile& hf,
                           const std::function<HostIdentity(const std::string&)>& identify = host_identity) {
  try {
    hosts_check_distinct(hf, identify);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("same machine: this machine under two names, through the real resolver") {
  for (const char* alias : {"127.0.0.1", "::1", "127.0.1.1"}) {
    CAPTURE(alias);
    auto hf = hostfile_parse(std::string("# box\nlocalhost slots=2\n") + alias + " slots=1 port=2222\n", "hf");
    std::string m = distinct_error(hf);
    CHECK(contains(m, "hf:2 (\"localhost\") and hf:3 (\""));
    CHECK(contains(m, "both are this machine"));
    CHECK(contains(m, "\"localhost slots=3\""));
  }
  // Names that do not resolve (.invalid) never match each other.
  CHECK(distinct_error(hostfile_parse("node1.invalid slots=1\nnode2.invalid slots=1\n", "hf")).empty());
  CHECK(distinct_error(hostfile_parse("localhost slots=1\n", "hf")).empty());
}

TEST_CASE("same machine: names resolving to one address and one port; another port is allowed") {
  const std::map<std::string, HostIdentity> dns = {
      {"gpu-a", {false, {"10.0.0.5"}}},
      {"gpu-a.lab", {false, {"fe80::5", "10.0.0.5"}}},
      {"10.0.0.5", {false, {"10.0.0.5"}}},
      {"gpu-b", {false, {"10.0.0.6"}}},
  };
  auto fake = [&](const std::string& h) { return dns.at(h); };
  std::string m = distinct_error(hostfile_parse("gpu-a slots=4\ngpu-b slots=4\nroot@gpu-a.lab slots=4\n", "hf"), fake);
  CHECK(contains(m, "hf:1 (\"gpu-a\") and hf:3 (\"gpu-a.lab\")"));
  CHECK(contains(m, "both resolve to 10.0.0.5"));
  CHECK(contains(m, "\"gpu-a slots=8\""));
  CHECK(contains(distinct_error(hostfile_parse("gpu-b slots=1\n10.0.0.5 slots=1\ngpu-a slots=1\n", "hf"), fake),
                 "hf:2 (\"10.0.0.5\") and hf:3 (\"gpu-a\")"));
  // One address, two ssh ports: two machines behind one NAT address.
  CHECK(distinct_error(hostfile_parse("gpu-a slots=1 port=2201\n10.0.0.5 slots=1 port=2202\n", "hf"), fake).empty());
  CHECK(distinct_error(hostfile_parse("gpu-a slots=1\ngpu-b slots=1\n", "hf"), fake).empty());
  // Without a file (a synthesized host list) the hosts are named alone.
  auto synth = hostfile_parse("gpu-a slots=1\n10.0.0.5 slots=1\n", "");
  synth.path.clear();
  CHECK(contains(distinct_error(synth, fake), "host \"gpu-a\" and host \"10.0.0.5\""));
}
