// doctor-node's side: argument round trip and refusals, nonce files, facts, and the
// whole protocol (facts, barrier on stdin EOF, clock, shared view) through a pipe.
#include "doctor/node_probe.h"

#include "core/error.h"
#include "core/version.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

using namespace dtrain::doctor;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "dtrain-doctor-XXXXXX").string();
    path = ::mkdtemp(t.data()) ? t : "";
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("argv round trip, with and without the network phase") {
  NodeProbeArgs a;
  a.node = 3;
  a.run_dir = "/runs/x y";
  a.session = "00ff";
  a.nonce = "abc";
  a.timeout = 12.5;
  NodeProbeArgs b = node_probe_parse(node_probe_argv(a));
  CHECK(b.node == 3);
  CHECK(b.run_dir == "/runs/x y");
  CHECK(b.timeout == 12.5);
  CHECK_FALSE(b.network);
  a.network = true;
  a.master_addr = "10.0.0.1";
  a.master_port = 4242;
  a.interface = "eth1";
  a.link_seconds = 0.25;
  b = node_probe_parse(node_probe_argv(a));
  CHECK(b.network);
  CHECK(b.master_port == 4242);
  CHECK(b.interface == "eth1");
  CHECK(b.link_seconds == 0.25);
}

TEST_CASE("bad arguments are usage errors naming the option") {
  auto bad = [](std::vector<std::string> argv, const std::string& part) {
    try {
      node_probe_parse(argv);
      FAIL("accepted");
    } catch (const dtrain::UsageError& e) {
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
    }
  };
  const std::vector<std::string> ok = {"--node", "0", "--run-dir", "/r", "--session", "ab", "--nonce", "n"};
  bad({"--node", "0", "--run-dir", "/r", "--session", "ab"}, "--nonce");
  bad({"--node", "x", "--run-dir", "/r", "--session", "ab", "--nonce", "n"}, "--node");
  bad({"--node", "0", "--run-dir", "rel", "--session", "ab", "--nonce", "n"}, "absolute");
  bad({"--node", "0", "--run-dir", "/r", "--session", "../x", "--nonce", "n"}, "hex");
  auto with = ok;
  with.insert(with.end(), {"--bogus", "1"});
  bad(with, "--bogus");
  with = ok;
  with.push_back("--network");
  bad(with, "--master-addr");
  with = ok;
  with.insert(with.end(), {"--node", "1"});
  bad(with, "twice");
  CHECK_NOTHROW(node_probe_parse(ok));
}

TEST_CASE("nonces: written atomically, read back by name; an unwritable directory is reported") {
  TempDir t;
  REQUIRE(!t.path.empty());
  const std::string run = t.path + "/run";
  CHECK(nonce_write(run, "ab12", "node0", "n0") == "");
  CHECK(nonce_write(run, "ab12", "launcher", "L") == "");
  auto seen = nonces_read(run, "ab12");
  CHECK(seen.size() == 2);
  CHECK(seen["node0"] == "n0");
  CHECK(seen["launcher"] == "L");
  CHECK(nonces_read(run, "ffff").empty());
  // A file where the directory should be.
  std::FILE* f = std::fopen((t.path + "/file").c_str(), "w");
  std::fclose(f);
  CHECK(nonce_write(t.path + "/file", "ab12", "node0", "x").find("cannot create") != std::string::npos);
}

TEST_CASE("facts: this build, CPUs, free space of the nearest existing parent") {
  TempDir t;
  NodeFacts f = node_facts_gather(t.path + "/not/yet", "ab", "node0", "n");
  CHECK(f.version == std::string(dtrain::version()));
  CHECK(f.build_id == dtrain::build_id());
  CHECK(f.build_id.size() == 64);
  CHECK(f.cpus >= 1);
  CHECK(f.free_bytes > 0);
  CHECK(f.write_error == "");
  NodeFacts g = facts_from_json(facts_to_json(f));
  CHECK(g.build_id == f.build_id);
  CHECK(g.free_bytes == f.free_bytes);
  CHECK(g.free_path == f.free_path);
}

TEST_CASE("protocol through a pipe: facts, then clock and shared view only after stdin EOF") {
  TempDir t;
  NodeProbeArgs a;
  a.node = 1;
  a.run_dir = t.path;
  a.session = "c0ffee";
  a.nonce = "secret1";
  a.timeout = 10;
  REQUIRE(nonce_write(t.path, a.session, "launcher", "L") == "");
  int in[2], out[2];
  REQUIRE(::pipe(in) == 0);
  REQUIRE(::pipe(out) == 0);
  std::FILE* w = ::fdopen(out[1], "w");
  int rc = -1;
  std::thread node([&] {
    rc = node_probe_main(a, in[0], w);
    std::fclose(w);
  });
  std::FILE* r = ::fdopen(out[0], "r");
  char line[4096];
  REQUIRE(std::fgets(line, sizeof line, r));
  auto facts = nlohmann::json::parse(line);
  CHECK(facts["type"] == "facts");
  CHECK(facts["build_id"] == dtrain::build_id());
  // The node waits for the barrier: its nonce is there, nothing more is printed yet.
  CHECK(nonces_read(t.path, a.session)["node1"] == "secret1");
  ::close(in[1]);  // the barrier
  REQUIRE(std::fgets(line, sizeof line, r));
  auto clock = nlohmann::json::parse(line);
  CHECK(clock["type"] == "clock");
  CHECK(std::llabs(clock["time_ns"].get<int64_t>() - wall_ns()) < int64_t{5'000'000'000});
  REQUIRE(std::fgets(line, sizeof line, r));
  auto shared = nlohmann::json::parse(line);
  CHECK(shared["type"] == "shared");
  CHECK(shared["seen"]["launcher"] == "L");
  CHECK(shared["seen"]["node1"] == "secret1");
  node.join();
  std::fclose(r);
  ::close(in[0]);
  CHECK(rc == 0);
}
