// The version probe on this machine (local hosts are probed without SSH): a dtrain that
// prints this build's version passes; another version, a failing or missing program and
// one that does not answer within the timeout fail with a message naming what and why.
#include "launch/host_probe.h"

#include "core/version.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace dtrain::launch;

namespace {

struct Scripts {
  fs::path dir = fs::temp_directory_path() / ("dtrain-probe-" + std::to_string(::getpid()));
  Scripts() { fs::create_directories(dir); }
  ~Scripts() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string write(const std::string& name, const std::string& body) {
    const fs::path p = dir / name;
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    ::chmod(p.c_str(), 0755);
    return p.string();
  }
};

dtrain::config::HostEntry localhost() {
  dtrain::config::HostEntry h;
  h.host = "localhost";
  h.slots = 1;
  h.slot_ids = {0};
  return h;
}

ProbeResult probe_with(const std::string& path, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  dtrain::config::TrainConfig cfg;
  return host_probe_version(cfg, path, timeout)->probe(localhost());
}

}  // namespace

TEST_CASE("host probe: the same version passes, anything else fails naming it") {
  Scripts s;
  const std::string same =
      s.write("same", fmt::format("[ \"$1\" = --version ] && echo 'dtrain {}'", dtrain::version()));
  CHECK(probe_with(same).ok);

  const ProbeResult other = probe_with(s.write("other", "echo 'dtrain 0.0.1-elsewhere'"));
  CHECK_FALSE(other.ok);
  CHECK(other.why.find("printed 'dtrain 0.0.1-elsewhere'") != std::string::npos);
  CHECK(other.why.find(fmt::format("this launcher is 'dtrain {}'", dtrain::version())) != std::string::npos);

  const ProbeResult failing = probe_with(s.write("failing", "exit 3"));
  CHECK_FALSE(failing.ok);
  CHECK(failing.why.find("exited with code 3") != std::string::npos);

  const ProbeResult missing = probe_with((s.dir / "no-such-dtrain").string());
  CHECK_FALSE(missing.ok);
  CHECK(missing.why.find("no-such-dtrain") != std::string::npos);

  const ProbeResult silent = probe_with(s.write("silent", "sleep 30"), std::chrono::milliseconds(300));
  CHECK_FALSE(silent.ok);
  CHECK(silent.why.find("no answer within") != std::string::npos);
}

TEST_CASE("host probe: host_probe_all keeps the hosts' order") {
  Scripts s;
  struct Fake : HostProbe {
    ProbeResult probe(const dtrain::config::HostEntry& h) override { return {h.host == "b", h.host}; }
  } fake;
  std::vector<dtrain::config::HostEntry> hosts(3);
  hosts[0].host = "a";
  hosts[1].host = "b";
  hosts[2].host = "c";
  auto r = host_probe_all(fake, hosts);
  REQUIRE(r.size() == 3);
  CHECK_FALSE(r[0].ok);
  CHECK(r[1].ok);
  CHECK(r[2].why == "c");
}
