// The network probe with 3 ranks as threads over a loopback store: the allreduce check
// passes and every link is measured in both directions, merged into one row per link.
#include "doctor/net_probe.h"

#include "rendezvous/store.h"

#include <doctest/doctest.h>

#include <thread>

using namespace dtrain::doctor;
using namespace std::chrono_literals;

TEST_CASE("link_merge joins the two ends of each link") {
  // 2 -> 1 at 3 (reported by 2 with itself as a), 1 -> 2 at 4.
  auto m = link_merge({{0, 1, 5, 0}, {0, 1, 0, 7}, {2, 1, 3, 0}, {1, 2, 4, 0}});
  REQUIRE(m.size() == 2);
  CHECK(m[0].a == 0);
  CHECK(m[0].ab == 5);
  CHECK(m[0].ba == 7);
  CHECK(m[1].a == 1);
  CHECK(m[1].b == 2);
  CHECK(m[1].ab == 4);
  CHECK(m[1].ba == 3);
}

TEST_CASE("3 ranks over loopback: allreduce correct, 3 links measured both ways") {
  const std::string token = dtrain::rendezvous::token_generate();
  dtrain::rendezvous::StoreServer server("127.0.0.1", 0, token);
  constexpr int n = 3;
  std::vector<NetProbeResult> results(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        dtrain::rendezvous::StoreClient client("127.0.0.1", server.port(), token);
        NetProbeOptions o;
        o.address = "127.0.0.1";
        o.link_seconds = 0.05;
        o.timeout = 20000ms;
        o.message_bytes = 64 * 1024;
        results[static_cast<size_t>(r)] = net_probe_run(client, "t/", r, n, o);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  std::vector<LinkSample> parts;
  for (int r = 0; r < n; ++r) {
    CHECK_MESSAGE(errors[static_cast<size_t>(r)].empty(), errors[static_cast<size_t>(r)]);
    CHECK(results[static_cast<size_t>(r)].allreduce_ok);
    parts.insert(parts.end(), results[static_cast<size_t>(r)].links.begin(),
                 results[static_cast<size_t>(r)].links.end());
  }
  auto links = link_merge(parts);
  REQUIRE(links.size() == 3);
  for (const LinkSample& l : links) {
    CHECK(l.a < l.b);
    CHECK(l.ab > 0);
    CHECK(l.ba > 0);
  }
}
