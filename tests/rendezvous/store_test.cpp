// Store server + client behaviour: every operation, binary values, blocking get, atomic
// add under contention, wait timeouts, many concurrent clients, key scoping and tokens.
#include "rendezvous/store.h"

#include "core/error.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <set>
#include <thread>

using namespace dtrain;
using namespace dtrain::rendezvous;
using namespace std::chrono_literals;

namespace {

struct Fixture {
  std::string token = token_generate();
  StoreServer server{"127.0.0.1", 0, token};
  StoreClient client() { return StoreClient("127.0.0.1", server.port(), token, 5s); }
};

}  // namespace

TEST_CASE("set, get, check, delete, ping") {
  Fixture f;
  auto c = f.client();
  c.ping();
  c.set("a", "1");
  CHECK(c.get("a", 1s) == "1");
  c.set("a", "two");  // overwrite
  CHECK(c.get("a", 1s) == "two");
  c.set("empty", "");
  CHECK(c.get("empty", 1s).empty());
  CHECK(c.check({"a", "empty"}));
  CHECK_FALSE(c.check({"a", "missing"}));
  CHECK(c.check({}));
  CHECK(c.del("a"));
  CHECK_FALSE(c.del("a"));
  CHECK_FALSE(c.check({"a"}));
}

TEST_CASE("values are binary safe") {
  Fixture f;
  auto c = f.client();
  std::string v;
  for (int i = 0; i < 256; ++i) v.push_back(static_cast<char>(i));
  v += std::string("\0\0\0mid\0", 7);
  c.set(std::string("k\0ey", 4), v);
  CHECK(c.get(std::string("k\0ey", 4), 1s) == v);
  CHECK_FALSE(c.check({"k"}));
  const std::string big(3 << 20, '\0');
  c.set("big", big);
  CHECK(c.get("big", 1s) == big);
}

TEST_CASE("add is a counter starting at 0, readable with get") {
  Fixture f;
  auto c = f.client();
  CHECK(c.add("n", 5) == 5);
  CHECK(c.add("n", -7) == -2);
  CHECK(c.add("n", 0) == -2);
  CHECK(c.get("n", 1s) == "-2");
  c.set("text", "abc");
  CHECK_THROWS_AS(c.add("text", 1), CommError);
  c.ping();  // an op error leaves the connection usable
  c.set("max", std::to_string(INT64_MAX));
  CHECK_THROWS_AS(c.add("max", 1), CommError);
  CHECK(c.add("max", -1) == INT64_MAX - 1);
}

TEST_CASE("add is atomic under 8 threads x 200 increments") {
  Fixture f;
  std::vector<std::thread> threads;
  std::vector<std::set<int64_t>> seen(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      auto c = f.client();
      for (int i = 0; i < 200; ++i) seen[t].insert(c.add("counter", 1));
    });
  for (auto& t : threads) t.join();
  auto c = f.client();
  CHECK(c.get("counter", 1s) == "1600");
  // Every returned value is distinct: no two increments observed the same state.
  std::set<int64_t> all;
  for (auto& s : seen) all.insert(s.begin(), s.end());
  CHECK(all.size() == 1600);
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == 1600);
}

TEST_CASE("get blocks until another client sets the key") {
  Fixture f;
  auto getter = f.client();
  std::atomic<bool> set_done{false};
  std::thread setter([&] {
    auto c = f.client();
    std::this_thread::sleep_for(200ms);
    set_done = true;
    c.set("late", "value");
  });
  const std::string v = getter.get("late", 10s);
  CHECK(set_done.load());
  CHECK(v == "value");
  setter.join();
  CHECK(f.server.waiter_count() == 0);
}

TEST_CASE("get times out with CommError naming the key, connection stays usable") {
  Fixture f;
  auto c = f.client();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.get("never/set", 300ms);
    FAIL("get should have timed out");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find("never/set") != std::string::npos);
    CHECK(std::string(e.what()).find("timed out") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  c.set("x", "y");
  CHECK(c.get("x", 0ms) == "y");
  CHECK(f.server.waiter_count() == 0);
}

TEST_CASE("extreme timeouts are clamped, never overflow") {
  Fixture f;
  auto c = f.client();
  c.set("k", "v");
  CHECK(c.get("k", std::chrono::milliseconds::max()) == "v");
  CHECK(c.wait({"k"}, std::chrono::milliseconds::max()));
  CHECK_THROWS_AS(c.get("missing", -5s), CommError);
  CHECK_FALSE(c.wait({"missing"}, std::chrono::milliseconds::min()));
  c.set_request_timeout(std::chrono::milliseconds::max());
  c.ping();
}

TEST_CASE("wait returns true once all keys exist, false on timeout") {
  Fixture f;
  auto c = f.client();
  CHECK_FALSE(c.wait({"w1"}, 200ms));
  c.set("w1", "");
  CHECK(c.wait({"w1"}, 0ms));
  std::thread setter([&] {
    auto c2 = f.client();
    std::this_thread::sleep_for(100ms);
    c2.set("w2", "");
    std::this_thread::sleep_for(100ms);
    c2.add("w3", 1);
  });
  CHECK(c.wait({"w1", "w2", "w3"}, 10s));
  setter.join();
  CHECK_FALSE(c.wait({"w1", "w4"}, 100ms));
  CHECK(c.wait({}, 0ms));
}

TEST_CASE("many concurrent clients each see their own and each other's keys") {
  Fixture f;
  constexpr int kClients = 32;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = f.client();
      c.set("peer/" + std::to_string(i), std::string(100 + i, char('a' + i % 26)));
      // Everyone blocks on the next peer's key: needs all clients served concurrently.
      const int j = (i + 1) % kClients;
      const std::string next = c.get("peer/" + std::to_string(j), 10s);
      if (next == std::string(100 + j, char('a' + j % 26))) ++ok;
    });
  for (auto& t : threads) t.join();
  CHECK(ok.load() == kClients);
}

TEST_CASE("one client shared by threads serializes requests safely") {
  Fixture f;
  auto c = f.client();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const std::string k = fmt::format("t{}/{}", t, i);
        c.set(k, k);
        if (c.get(k, 1s) != k) FAIL_CHECK("wrong value for " << k);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(c.check({"t0/99", "t3/99"}));
}

TEST_CASE("key scoping: store_key and PrefixStore") {
  CHECK(store_key("abc", 2, "rank/0") == "job/abc/r2/rank/0");
  CHECK(store_prefix("abc", 0) == "job/abc/r0/");
  CHECK_THROWS_AS(store_key("", 0, "k"), UsageError);
  CHECK_THROWS_AS(store_key("a/b", 0, "k"), UsageError);
  CHECK_THROWS_AS(store_key("a", -1, "k"), UsageError);

  Fixture f;
  auto c = f.client();
  PrefixStore r0(c, "job1", 0);
  PrefixStore r1(c, "job1", 1);
  r0.set("addr", "zero");
  r1.set("addr", "one");
  CHECK(r0.get("addr", 1s) == "zero");
  CHECK(r1.get("addr", 1s) == "one");
  CHECK(c.get("job/job1/r0/addr", 1s) == "zero");
  CHECK(r0.add("count", 2) == 2);
  CHECK_FALSE(r1.check({"count"}));
  CHECK(r0.wait({"addr", "count"}, 1s));
  CHECK_FALSE(r1.wait({"count"}, 50ms));
  CHECK(r1.del("addr"));
  CHECK(r0.check({"addr"}));
}

TEST_CASE("token_generate gives 64 distinct hex chars; token_equal") {
  const std::string a = token_generate(), b = token_generate();
  CHECK(a.size() == 64);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != b);
  CHECK(token_equal(a, a));
  CHECK_FALSE(token_equal(a, b));
  CHECK_FALSE(token_equal(a, a.substr(0, 63)));
  CHECK_FALSE(token_equal("", "x"));
  CHECK(token_equal("", ""));
}

TEST_CASE("server binds the requested address and reports bad ones") {
  const std::string token = token_generate();
  StoreServer any("0.0.0.0", 0, token);
  CHECK(any.port() != 0);
  StoreClient c("127.0.0.1", any.port(), token, 2s);
  c.ping();
  CHECK_THROWS_AS(StoreServer("not-an-ip", 0, token), CommError);
  // The port is taken (by `any`).
  CHECK_THROWS_AS(StoreServer("127.0.0.1", any.port(), token), CommError);
  CHECK_THROWS_AS(StoreServer("127.0.0.1", 0, ""), UsageError);
}

TEST_CASE("store_listen_address: the advertised address, or every interface when a name is loopback only here") {
  CHECK(store_listen_address("127.0.0.1") == "127.0.0.1");
  CHECK(store_listen_address("127.0.0.1", true) == "127.0.0.1");  // a literal is taken as given
  CHECK(store_listen_address("[::1]") == "::1");
  const std::string local = store_listen_address("localhost");
  CHECK((local == "127.0.0.1" || local == "::1"));
  // Remote nodes resolve the name themselves (an /etc/hosts alias of the host name is
  // loopback only here): listening on loopback would shut them out.
  const std::string wide = store_listen_address("localhost", true);
  CHECK((wide == "0.0.0.0" || wide == "::"));
  const std::string token = token_generate();
  StoreServer server(wide, 0, token);
  StoreClient client("localhost", server.port(), token, 5s);
  client.set("k", "v");
  CHECK(client.get("k", 2s) == "v");
  CHECK_THROWS_AS(store_listen_address("no-such-host.invalid"), CommError);
}
