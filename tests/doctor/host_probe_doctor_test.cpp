// The doctor-backed elastic host probe on localhost with the real dtrain ($DTRAIN_BIN):
// it passes the launcher's own build and fails a dtrain whose build differs (the same
// binary with bytes appended), naming the build check, where the version probe passes it.
#include "core/version.h"
#include "doctor/host_probe_doctor.h"
#include "skip.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  std::string dir, bin, variant;
  launch::Job job;
  std::string build;  // the real dtrain's build id (this test program is not dtrain)
  bool usable = false;

  Fixture() {
    const char* b = std::getenv("DTRAIN_BIN");
    if (!b || ::access(b, X_OK) != 0) {
      ::dtrain::test::skip_test("skipped: $DTRAIN_BIN is not set (run through ctest)");
      return;
    }
    std::string t = (fs::temp_directory_path() / "dtrain-probe-doctor-XXXXXX").string();
    if (!::mkdtemp(t.data())) return;
    dir = t;
    bin = fs::canonical(b).string();
    // Another build: the same program with bytes appended (ELF ignores them), so its
    // --version is the same and only its content (its SHA-256 build id) differs.
    variant = dir + "/dtrain-variant";
    fs::copy_file(bin, variant);
    {
      std::ofstream f(variant, std::ios::binary | std::ios::app);
      f << "another build";
    }
    fs::permissions(variant, fs::perms::owner_all);
    launch::JobRequest req;
    req.output_dir = dir + "/run";
    req.require_training = false;
    req.sets = {"doctor.timeout=20", "elastic.probe_timeout=20"};
    job = launch::job_prepare(req);
    fs::create_directories(job.run_dir);
    build = file_sha256(bin);
    usable = build.size() == 64 && file_sha256(variant) != build;
  }
  ~Fixture() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

config::HostEntry localhost(int slots) {
  config::HostEntry h;
  h.host = "localhost";
  h.slots = slots;
  return h;
}

}  // namespace

TEST_CASE("doctor probe: the launcher's own dtrain build passes") {
  Fixture f;
  if (!f.usable) return;
  f.job.spec.dtrain_path = f.bin;
  auto probe = doctor::host_probe_doctor(f.job, launch::node_spawner_default(f.job.cfg), f.build);
  launch::ProbeResult r = probe->probe(localhost(1));
  INFO(r.why);
  CHECK(r.ok);
  CHECK(r.why.empty());
}

TEST_CASE("doctor probe: a dtrain of another build fails the build check where the version probe passes it") {
  Fixture f;
  if (!f.usable) return;
  f.job.spec.dtrain_path = f.variant;
  // The version probe compares `dtrain --version` with this program's version: the
  // variant prints the same.
  auto version_probe = launch::host_probe_version(f.job.cfg, f.variant, std::chrono::seconds(20));
  launch::ProbeResult v = version_probe->probe(localhost(1));
  INFO(v.why);
  CHECK(v.ok);

  auto probe = doctor::host_probe_doctor(f.job, launch::node_spawner_default(f.job.cfg), f.build);
  std::vector<config::HostEntry> hosts = {localhost(1), localhost(1)};
  auto res = launch::host_probe_all(*probe, hosts);  // two at once: probes run in parallel
  REQUIRE(res.size() == 2);
  for (const auto& r : res) {
    INFO(r.why);
    CHECK_FALSE(r.ok);
    CHECK(r.why.find("preflight build: ") != std::string::npos);
    CHECK(r.why.find(f.build.substr(0, 16)) != std::string::npos);
  }
}
