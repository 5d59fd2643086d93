// The preflight library API as the supervisor and elastic membership call it, over the
// real spawner and the dtrain binary ($DTRAIN_BIN) on localhost: the job's own nodes, a
// node outside the plan (findings carry its node index), a host the spawner cannot reach.
#include "core/version.h"
#include "doctor/doctor.h"
#include "skip.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  std::string dir;
  launch::Job job;
  launch::NodeSpawner spawner;
  std::string build;  // the dtrain binary's build id: this test program is not dtrain
  bool usable = false;

  Fixture() {
    const char* bin = std::getenv("DTRAIN_BIN");
    if (!bin || ::access(bin, X_OK) != 0) {
      ::dtrain::test::skip_test("skipped: $DTRAIN_BIN is not set (run through ctest)");
      return;
    }
    std::string t = (fs::temp_directory_path() / "dtrain-preflight-XXXXXX").string();
    if (!::mkdtemp(t.data())) return;
    dir = t;
    launch::JobRequest req;
    req.output_dir = dir + "/run";
    req.require_training = false;
    req.sets = {"doctor.timeout=20"};
    job = launch::job_prepare(req);
    job.spec.dtrain_path = fs::canonical(bin).string();
    spawner = launch::node_spawner_default(job.cfg);
    build = file_sha256(job.spec.dtrain_path);
    usable = build.size() == 64;
  }
  ~Fixture() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

launch::NodePlan node(int index, const std::string& host, int slots) {
  launch::NodePlan p;
  p.node_rank = index;
  p.host.host = host;
  p.host.slots = slots;
  for (int i = 0; i < slots; ++i) p.ranks.push_back({i, i, slots, index, i});
  return p;
}

}  // namespace

TEST_CASE("preflight of the job's localhost node: fit, every quick check ran, no network part") {
  Fixture f;
  if (!f.usable) return;
  doctor::Report r = doctor::preflight(f.job, f.spawner, {}, f.build);
  INFO(doctor::report_table(r));
  CHECK(r.ok());
  CHECK(r.failed_nodes().empty());
  CHECK(doctor::preflight_message(r).empty());
  CHECK(doctor::preflight_verdict(r).why.empty());
  CHECK_FALSE(r.network);
  for (const char* check : {"ssh", "build", "slots", "disk", "shared_dir", "clock"}) {
    bool found = false;
    for (const auto& fi : r.findings) found = found || (fi.node == 0 && fi.check == check);
    CHECK_MESSAGE(found, check);
  }
}

TEST_CASE("preflight_nodes: a node outside the plan keeps its index; an unreachable host is unfit, named") {
  Fixture f;
  if (!f.usable) return;
  // A host whose SSH connection is refused, as the SSH spawner reports it (no traffic
  // leaves this machine; the real thing is in multinode_test.cpp).
  launch::NodeSpawner spawner = [&f](const launch::NodePlan& n, const launch::NodeCommand& cmd, const std::string& in,
                                     launch::LineCallback cb) -> std::unique_ptr<launch::Process> {
    if (n.host.host == "unreachable.test")
      throw LaunchError("SSH to unreachable.test: cannot connect; unreachable.test port 22: connection refused");
    return f.spawner(n, cmd, in, std::move(cb));
  };
  doctor::Report r =
      doctor::preflight_nodes(f.job, spawner, {node(5, "localhost", 1), node(6, "unreachable.test", 2)}, f.build);
  INFO(doctor::report_table(r));
  REQUIRE(r.nodes.size() == 2);
  CHECK(r.nodes[0].node == 5);
  CHECK(r.nodes[0].facts.has_value());
  CHECK(r.failed_nodes() == std::vector<int>{6});
  auto v = doctor::preflight_verdict(r);
  CHECK(v.node == 6);
  CHECK(v.why.find("node 6 (unreachable.test): ssh: SSH to unreachable.test: cannot connect") != std::string::npos);
  // Judged against this test program's own build (not dtrain), the node's build differs.
  doctor::Report other = doctor::preflight_nodes(f.job, f.spawner, {node(5, "localhost", 1)});
  CHECK(other.failed_nodes() == std::vector<int>{5});
  CHECK(doctor::preflight_message(other).find("node 5 (localhost): build: ") != std::string::npos);
}
