// Heartbeats: stamps appear under the right key, server-side ages advance while beating
// and grow after the beater stops, missed beats are detected, and a beater survives
// a server restart by reconnecting.
#include "rendezvous/heartbeat.h"

#include "core/error.h"

#include "eventually.h"

#include <doctest/doctest.h>

#include <thread>

using namespace dtrain;
using namespace dtrain::rendezvous;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {
// Heartbeat ages settle over seconds: a longer bound than the shared default.
template <typename Pred>
bool eventually(Pred pred) {
  return dtrain::rendezvous::test::eventually(pred, 10s);
}
}  // namespace

TEST_CASE("heartbeat keys, values and server-side times") {
  CHECK(heartbeat_key("node1") == "hb/node1");
  CHECK(heartbeat_key("node1", "job/j/") == "job/j/hb/node1");

  const std::string token = token_generate();
  StoreServer server("127.0.0.1", 0, token);
  Clock::time_point first;
  {
    Heartbeat hb("127.0.0.1", server.port(), token, "node0", 20ms, "job/j/");
    CHECK(hb.key() == "job/j/hb/node0");
    CHECK(hb.beats() >= 1);
    auto beats = server.heartbeats("job/j/hb/");
    REQUIRE(beats.count("node0") == 1);
    CHECK(beats.size() == 1);
    first = beats["node0"];

    // The value is the beater's unix time in ms.
    StoreClient c("127.0.0.1", server.port(), token, 5s);
    const long long stamped = std::stoll(c.get("job/j/hb/node0", 1s));
    const long long now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    CHECK(stamped <= now_ms);
    CHECK(stamped > now_ms - 60'000);

    // Beats keep refreshing the server's timestamp.
    CHECK(eventually([&] { return hb.beats() >= 4 && server.heartbeats("job/j/hb/")["node0"] > first; }));
    CHECK(hb.last_error().empty());
  }
  // Stopped: the timestamp no longer moves, so its age grows.
  const auto last = server.heartbeats("job/j/hb/")["node0"];
  std::this_thread::sleep_for(100ms);
  CHECK(server.heartbeats("job/j/hb/")["node0"] == last);
  CHECK(Clock::now() - last >= 100ms);
  CHECK(server.heartbeats("other/").empty());
}

TEST_CASE("heartbeat_missed reports stopped and absent peers only") {
  const std::string token = token_generate();
  StoreServer server("127.0.0.1", 0, token);
  Heartbeat alive("127.0.0.1", server.port(), token, "alive", 20ms);
  auto dead = std::make_unique<Heartbeat>("127.0.0.1", server.port(), token, "dead", 20ms);
  dead.reset();
  const std::vector<std::string> expected = {"alive", "dead", "never"};
  CHECK(eventually([&] {
    return heartbeat_missed(server, "", expected, 500ms) == std::vector<std::string>{"dead", "never"};
  }));
}

TEST_CASE("heartbeat constructor fails clearly without a server; beater survives a restart") {
  const std::string token = token_generate();
  uint16_t port;
  {
    StoreServer probe("127.0.0.1", 0, token);
    port = probe.port();
  }
  CHECK_THROWS_AS(Heartbeat("127.0.0.1", port, token, "n", 20ms), CommError);

  auto server = std::make_unique<StoreServer>("127.0.0.1", port, token);
  Heartbeat hb("127.0.0.1", port, token, "n", 20ms);
  server.reset();
  CHECK(eventually([&] { return !hb.last_error().empty(); }));
  CHECK(hb.last_error().find(token) == std::string::npos);
  server = std::make_unique<StoreServer>("127.0.0.1", port, token);
  CHECK(eventually([&] { return server->heartbeats("hb/").count("n") == 1; }));
  CHECK(eventually([&] { return hb.last_error().empty(); }));
}

TEST_CASE("progress is published once per change, with the server's time of the change; entries() has the values") {
  CHECK(heartbeat_progress_key("rank3", "job/j/r0/") == "job/j/r0/progress/rank3");
  const std::string token = token_generate();
  StoreServer server("127.0.0.1", 0, token);
  // A long interval, so the repeated value below spans several beats only slowly.
  Heartbeat hb("127.0.0.1", server.port(), token, "rank0", 400ms, "p/");
  CHECK(hb.progress_key() == "p/progress/rank0");
  CHECK(server.entries("p/progress/").empty());  // nothing reported yet

  hb.progress("0");
  REQUIRE(eventually([&] { return server.entries("p/progress/").count("rank0") == 1; }));
  auto e = server.entries("p/progress/");
  CHECK(e["rank0"].value == "0");
  const auto first = e["rank0"].set_at;

  // The same value again is not a change: several beats later the server's time is unchanged.
  hb.progress("0");
  const uint64_t beats = hb.beats();
  REQUIRE(eventually([&] { return hb.beats() >= beats + 3; }));
  CHECK(server.entries("p/progress/")["rank0"].set_at == first);

  // Fast changes ride on the beats: the last one is what the server ends up with.
  for (int step = 1; step <= 50; ++step) hb.progress(std::to_string(step));
  CHECK(eventually([&] { return server.entries("p/progress/")["rank0"].value == "50"; }));
  CHECK(server.entries("p/progress/")["rank0"].set_at > first);

  // entries() and heartbeats() see the same keys; values are the stamps.
  auto beat_entries = server.entries("p/hb/");
  REQUIRE(beat_entries.count("rank0") == 1);
  CHECK(std::stoll(beat_entries["rank0"].value) > 0);
  CHECK(server.heartbeats("p/hb/").count("rank0") == 1);
}

TEST_CASE("finish stops the beats and leaves its value as the last stamp") {
  const std::string token = token_generate();
  StoreServer server("127.0.0.1", 0, token);
  Heartbeat hb("127.0.0.1", server.port(), token, "rank1", 20ms, "p/");
  REQUIRE(eventually([&] { return hb.beats() >= 3; }));
  hb.finish("exited");
  auto e = server.entries("p/hb/");
  REQUIRE(e.count("rank1") == 1);
  CHECK(e["rank1"].value == "exited");
  const auto at = e["rank1"].set_at;
  const uint64_t beats = hb.beats();
  std::this_thread::sleep_for(100ms);  // five intervals: a live thread would have beaten
  CHECK(hb.beats() == beats);
  CHECK(server.entries("p/hb/")["rank1"].set_at == at);
  CHECK(server.entries("p/hb/")["rank1"].value == "exited");
}
