// report::Event: the one typed events.jsonl record (a failure's node null when none is
// blamed, "interrupted" only when set), and the readers that also take the -1 / -2 of
// run directories written before it.
#include "report/event.h"

#include <doctest/doctest.h>

using namespace dtrain::report;

TEST_CASE("event_json: a failure without a node writes null; an interrupted one says so") {
  nlohmann::json j = event_json({.kind = EventKind::FAILURE,
                                 .round = 2,
                                 .time_ms = 1700000000000,
                                 .why = "interrupted by SIGTERM",
                                 .exit_code = 130,
                                 .retry = false,
                                 .interrupted = true});
  CHECK(j.at("event") == "failure");
  CHECK(j.at("round") == 2);
  CHECK(j.at("time_ms") == 1700000000000);
  REQUIRE(j.contains("node"));
  CHECK(j.at("node").is_null());
  CHECK(j.at("interrupted") == true);
  CHECK(j.at("exit_code") == 130);
  CHECK(j.at("retry") == false);
  CHECK_FALSE(j.contains("host"));
  CHECK_FALSE(event_node(j).has_value());
  CHECK(event_interrupted(j));
}

TEST_CASE("event_json: a node's failure with its host and a hung rank's detail; other kinds carry no node") {
  nlohmann::json j = event_json({.kind = EventKind::FAILURE,
                                 .round = 0,
                                 .node = 1,
                                 .host = "n2",
                                 .why = "rank 3 made no step",
                                 .exit_code = 9,
                                 .retry = true,
                                 .detail = {{"hang", "no_step"}, {"rank", 3}}});
  CHECK(j.at("node") == 1);
  CHECK(j.at("host") == "n2");
  CHECK(j.at("hang") == "no_step");
  CHECK(j.at("rank") == 3);
  CHECK_FALSE(j.contains("interrupted"));
  CHECK(event_node(j) == 1);
  CHECK_FALSE(event_interrupted(j));
  // Stamped when written when no time is given.
  nlohmann::json s = event_json({.kind = EventKind::ROUND_START, .round = 4, .world_size = 8});
  CHECK(s.at("event") == "round_start");
  CHECK(s.at("world_size") == 8);
  CHECK(s.at("time_ms").get<int64_t>() > 1700000000000);
  CHECK_FALSE(s.contains("node"));
  CHECK(event_kind_name(EventKind::STRAGGLER_RECOVERED) == std::string("straggler_recovered"));
}

TEST_CASE("event_node / event_interrupted: records written before the typed event") {
  const auto old_interrupted = nlohmann::json::parse(R"({"event":"failure","round":0,"node":-2,"exit_code":130})");
  CHECK_FALSE(event_node(old_interrupted).has_value());
  CHECK(event_interrupted(old_interrupted));
  const auto old_none = nlohmann::json::parse(R"({"event":"failure","round":0,"node":-1,"exit_code":4})");
  CHECK_FALSE(event_node(old_none).has_value());
  CHECK_FALSE(event_interrupted(old_none));
  const auto no_field = nlohmann::json::parse(R"({"event":"failure","round":0})");
  CHECK_FALSE(event_node(no_field).has_value());
  CHECK_FALSE(event_interrupted(no_field));
  CHECK(event_node(nlohmann::json::parse(R"({"event":"failure","node":0})")) == 0);
}
