// events.jsonl through one typed record: `dtrain status` reads the run directories the
// launcher writes now (a failure's node null when no node is blamed, "interrupted": true)
// and those written before (node -1 for none, -2 for an interrupted launcher) alike.
#include "cli_harness.h"

#include <fstream>

using namespace dtrain::cli_test;

namespace {

void write_events(const std::string& dir, const std::vector<std::string>& lines) {
  std::ofstream f(dir + "/events.jsonl", std::ios::binary);
  for (const auto& l : lines) f << l << "\n";
}

}  // namespace

TEST_CASE("dtrain status: an interrupted run, in the old and the new record") {
  const std::string bin = dtrain_bin();
  REQUIRE(!bin.empty());
  const std::string start = R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":2})";
  const std::vector<std::string> records = {
      R"j({"time_ms":1700000001000,"event":"failure","round":0,"node":-2,"why":"interrupted by SIGINT (Ctrl-C)","exit_code":130})j",
      R"j({"time_ms":1700000001000,"event":"failure","round":0,"node":null,"interrupted":true,"why":"interrupted by SIGINT (Ctrl-C)","exit_code":130,"retry":false})j"};
  for (const std::string& rec : records) {
    CAPTURE(rec);
    TempDir d("typed_events");
    REQUIRE(!d.path().empty());
    write_events(d.path(), {start, rec});
    RunResult st = run({bin, "status", d.path()}, {}, 30s);
    INFO(st.out);
    CHECK(st.rc == 0);
    CHECK(contains(st.out, "state      interrupted"));
    CHECK(contains(st.out, "dtrain resume " + d.path()));
    CHECK_FALSE(contains(st.out, "node -2"));
  }
}

TEST_CASE("dtrain status: a failure with no node to blame, old -1 and new null; a node's failure names it") {
  const std::string bin = dtrain_bin();
  REQUIRE(!bin.empty());
  const std::string start = R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":2})";
  for (const std::string node : {"-1", "null"}) {
    CAPTURE(node);
    TempDir d("typed_events");
    write_events(d.path(),
                 {start, R"({"time_ms":1700000001000,"event":"failure","round":0,"node":)" + node +
                             R"j(,"why":"only 1 of the 2 host(s) can run a round","exit_code":4,"retry":false})j"});
    RunResult st = run({bin, "status", d.path()}, {}, 30s);
    INFO(st.out);
    CHECK(st.rc == 0);
    CHECK(contains(st.out, "state      failed"));
    CHECK(contains(st.out, "only 1 of the 2 host(s) can run a round"));
    CHECK_FALSE(contains(st.out, "node -1"));
    CHECK_FALSE(contains(st.out, "node null"));
  }
  TempDir d("typed_events");
  write_events(d.path(), {start, R"({"time_ms":1700000001000,"event":"failure","round":0,"node":1,"host":"n2",)"
                                 R"("why":"node 1 (n2): SSH connection lost","exit_code":4,"retry":false})"});
  RunResult st = run({bin, "status", d.path()}, {}, 30s);
  INFO(st.out);
  CHECK(contains(st.out, "state      failed"));
  CHECK(contains(st.out, "node 1: "));
}
