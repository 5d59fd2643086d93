// Round counting from events.jsonl sequences: restarts, rounds that could not start,
// resizes and resumes, as the supervisor writes them; status and plot count the same.
#include "report/round_history.h"

#include "report/status.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace dtrain::report;
using nlohmann::json;

namespace {

std::vector<json> parse(const std::vector<std::string>& lines) {
  std::vector<json> out;
  for (const auto& l : lines) out.push_back(json::parse(l));
  return out;
}

}  // namespace

TEST_CASE("round history: a round that could not start is a round, and the round after it a restart") {
  // Round 0 runs and fails; round 1 finds too few hosts (no node runs, it uses a retry);
  // round 2 runs and fails; round 3 runs and finishes: 3 restarts, 1 of them not started.
  const auto h = round_history(parse({
      R"({"time_ms":10,"event":"membership","round":0,"hosts":["a","b"],"world_size":2,"changes":[]})",
      R"({"time_ms":11,"event":"round_start","round":0,"world_size":2})",
      R"({"time_ms":20,"event":"failure","round":0,"node":1,"why":"x","exit_code":4,"retry":true})",
      R"({"time_ms":30,"event":"membership","round":1,"hosts":[],"changes":[],"problem":"only 1 of 2"})",
      R"({"time_ms":31,"event":"round_not_started","round":1,"why":"only 1 of 2"})",
      R"({"time_ms":32,"event":"failure","round":1,"node":-1,"why":"only 1 of 2","exit_code":4,"retry":true})",
      R"({"time_ms":40,"event":"round_start","round":2,"world_size":2})",
      R"({"time_ms":50,"event":"failure","round":2,"node":0,"why":"y","exit_code":137,"retry":true})",
      R"({"time_ms":60,"event":"round_start","round":3,"world_size":2})",
      R"({"time_ms":70,"event":"finished","round":3})",
  }));
  REQUIRE(h.rounds.size() == 4);
  CHECK(h.restarts == 3);
  CHECK(h.not_started == 1);
  CHECK(h.resizes == 0);
  CHECK(h.resumes == 0);
  CHECK(h.rounds[0].cause == RoundCause::FIRST);
  CHECK(h.rounds[0].number == 0);
  CHECK(h.rounds[1].cause == RoundCause::RESTART);
  CHECK_FALSE(h.rounds[1].started);
  CHECK(h.rounds[1].why == "only 1 of 2");
  CHECK(h.rounds[1].number == 1);
  CHECK(h.rounds[2].number == 2);
  CHECK(h.rounds[2].started);
  CHECK(h.rounds[3].number == 3);
  CHECK(h.rounds[3].time_ms == 60);
}

TEST_CASE("round history: a resize is not a restart; a second launcher's round 0 is a resume") {
  const auto h = round_history(parse({
      R"({"time_ms":1,"event":"round_start","round":0})",
      R"({"time_ms":2,"event":"failure","round":0,"node":2,"why":"lost","retry":true})",
      R"({"time_ms":3,"event":"round_start","round":1})",
      R"({"time_ms":4,"event":"resize","round":1,"step":10,"why":"n3 passed the probe again"})",
      R"({"time_ms":5,"event":"round_start","round":2})",
      R"({"time_ms":6,"event":"failure","round":2,"node":0,"why":"z","retry":false})",
      R"({"time_ms":7,"event":"round_start","round":0})",
      R"({"time_ms":8,"event":"resize","round":0,"step":20})",
      R"({"time_ms":9,"event":"round_not_started","round":1,"why":"preflight: disk"})",
      R"({"time_ms":10,"event":"failure","round":1,"retry":true})",
      R"({"time_ms":11,"event":"round_start","round":2})",
      R"({"no_event":true})",
  }));
  REQUIRE(h.rounds.size() == 6);
  CHECK(h.restarts == 2);
  CHECK(h.resizes == 2);
  CHECK(h.resumes == 1);
  CHECK(h.not_started == 1);
  CHECK(h.rounds[2].cause == RoundCause::RESIZE);
  CHECK(h.rounds[3].cause == RoundCause::RESUME);
  // A resize that ended a round the next round could not start in is still a resize.
  CHECK(h.rounds[4].cause == RoundCause::RESIZE);
  CHECK_FALSE(h.rounds[4].started);
  CHECK(h.rounds[5].cause == RoundCause::RESTART);
  CHECK(h.rounds[5].number == 2);
  CHECK(std::string(round_cause_name(h.rounds[5].cause)) == "restart");
  CHECK(round_history({}).rounds.empty());
}

TEST_CASE("status: restarts counted from the rounds, a round that could not start shown as such") {
  const fs::path dir = fs::temp_directory_path() / ("dtrain-round-history-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream e(dir / "events.jsonl");
    e << R"({"time_ms":1700000000000,"event":"round_start","round":0,"world_size":2})"
      << "\n"
      << R"({"time_ms":1700000010000,"event":"failure","round":0,"node":1,"why":"node 1 (b): SSH connection lost","exit_code":4,"retry":true})"
      << "\n"
      << R"({"time_ms":1700000012000,"event":"membership","round":1,"hosts":[],"changes":[],"problem":"only 1 of the 2 host(s) can run a round"})"
      << "\n"
      << R"({"time_ms":1700000012000,"event":"round_not_started","round":1,"why":"only 1 of the 2 host(s) can run a round"})"
      << "\n"
      << R"({"time_ms":1700000012000,"event":"failure","round":1,"node":-1,"why":"only 1 of the 2 host(s) can run a round","exit_code":4,"retry":true})"
      << "\n"
      << R"({"time_ms":1700000020000,"event":"round_start","round":2,"world_size":2})"
      << "\n"
      << R"({"time_ms":1700000030000,"event":"finished","round":2})"
      << "\n";
  }
  RunStatus st = status_read(dir.string());
  CHECK(st.state == RunState::FINISHED);
  CHECK(st.rounds == 3);
  CHECK(st.rounds_not_started == 1);
  CHECK(st.restarts == 2);  // as many as the supervisor's retries: rounds 1 and 2
  REQUIRE(st.failures.size() == 2);
  CHECK(st.failures[0].started);
  CHECK_FALSE(st.failures[1].started);
  CHECK(st.failures[1].retry);
  const std::string text = status_format(st, 1700000060000);
  CAPTURE(text);
  CHECK(text.find("restarts   2 (1 round(s) could not start: no node ran)") != std::string::npos);
  CHECK(text.find("round 1 could not start 48.0 s ago: only 1 of the 2 host(s)") != std::string::npos);
  CHECK(text.find("round 0 failed 50.0 s ago: node 1: node 1 (b): SSH connection lost") != std::string::npos);

  // The live launcher between a round that could not start and its retry: restarting.
  {
    std::ofstream e(dir / "events.jsonl");
    e << R"({"time_ms":1700000000000,"event":"round_not_started","round":0,"why":"preflight: disk"})"
      << "\n"
      << R"({"time_ms":1700000000000,"event":"failure","round":0,"node":0,"why":"preflight: disk","exit_code":4,"retry":true})"
      << "\n";
  }
  status_write_launcher(dir.string(), "job-1");
  st = status_read(dir.string());
  CHECK(st.state == RunState::RUNNING);
  CHECK(st.restarts == 0);
  CHECK(st.rounds_not_started == 1);
  CHECK(status_format(st, 1700000060000).find("; restarting after a failure") != std::string::npos);
  fs::remove_all(dir);
}
