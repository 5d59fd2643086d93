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
    const long long now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch()).count();
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
