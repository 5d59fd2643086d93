// WarnLimiter: a burst per kind per interval in full, the rest counted into one summary
// line per interval; nothing counted is dropped from the summary.
#include "rendezvous/warn_limit.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain::rendezvous;
using namespace std::chrono_literals;

TEST_CASE("WarnLimiter: the first lines of each kind, then one summary per interval with the counts") {
  std::vector<std::string> lines;
  WarnLimiter w(3, 10s, [&](const std::string& l) { lines.push_back(l); });
  const auto t0 = WarnLimiter::Clock::now();
  for (int i = 0; i < 100; ++i) w.warn("idle", "idle " + std::to_string(i), t0 + std::chrono::milliseconds(i));
  for (int i = 0; i < 4; ++i) w.warn("wrong token", "token " + std::to_string(i), t0 + 1s);
  REQUIRE(lines.size() == 6);
  CHECK(lines[0] == "idle 0");
  CHECK(lines[2] == "idle 2");
  CHECK(lines[3] == "token 0");
  w.flush(t0 + 5s);  // the interval has not run out: nothing yet
  CHECK(lines.size() == 6);
  w.flush(t0 + 10s);
  REQUIRE(lines.size() == 7);
  CHECK(lines[6].find("98 more such connection warning(s) in the last 10 s not shown") != std::string::npos);
  CHECK(lines[6].find("97 idle, 1 wrong token") != std::string::npos);
  CHECK(w.suppressed_total() == 98);
  // A new interval writes its burst again; a quiet interval writes no summary.
  w.warn("idle", "idle again", t0 + 11s);
  CHECK(lines.back() == "idle again");
  w.flush(t0 + 30s);
  CHECK(lines.size() == 8);
  // force: the store's stop writes what the last interval counted.
  for (int i = 0; i < 5; ++i) w.warn("idle", "x", t0 + 31s);
  w.flush(t0 + 32s, true);
  CHECK(lines.back().find("2 more such connection warning(s)") != std::string::npos);
}
