// Placement: contiguous global ranks per node in hostfile order, local ranks indexing
// CUDA_VISIBLE_DEVICES on heterogeneous and slot-filtered nodes, 4x8 = 32 ranks, table.
#include "launch/placement.h"

#include "config/host_filter.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>

using namespace dtrain;
using namespace dtrain::config;
using namespace dtrain::launch;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("placement: heterogeneous nodes 8 + 4 + 2") {
  Hostfile hf = hostfile_parse("a slots=8\nb slots=4\nroot@c slots=2 port=2222\n", "h");
  Plan p = plan_placement(hf, "a", 29500);
  CHECK(p.world_size == 14);
  CHECK(p.master_addr == "a");
  CHECK(p.master_port == 29500);
  REQUIRE(p.nodes.size() == 3);

  const int first[] = {0, 8, 12};
  const int local[] = {8, 4, 2};
  const char* cvd[] = {"0,1,2,3,4,5,6,7", "0,1,2,3", "0,1"};
  int expect_rank = 0;
  for (int n = 0; n < 3; ++n) {
    const NodePlan& node = p.nodes[static_cast<size_t>(n)];
    CAPTURE(n);
    CHECK(node.node_rank == n);
    CHECK(node.first_rank == first[n]);
    CHECK(node.cuda_visible_devices == cvd[n]);
    REQUIRE(node.ranks.size() == static_cast<size_t>(local[n]));
    for (int l = 0; l < local[n]; ++l) {
      const RankInfo& r = node.ranks[static_cast<size_t>(l)];
      CHECK(r.rank == expect_rank++);
      CHECK(r.local_rank == l);
      CHECK(r.local_world_size == local[n]);
      CHECK(r.node_rank == n);
      CHECK(r.device == l);
    }
  }
  CHECK(p.nodes[2].host.user == "root");
  CHECK(p.nodes[2].host.port == 2222);
}

TEST_CASE("placement: slot filter host:1,3 gives CUDA_VISIBLE_DEVICES=1,3") {
  Hostfile hf = hostfile_parse("a slots=4\nb slots=4\n", "h");
  Plan p = plan_placement(hostfile_select(hf, {.include = "a:1,3@b"}), "a", 29500);
  CHECK(p.world_size == 6);
  REQUIRE(p.nodes.size() == 2);
  CHECK(p.nodes[0].cuda_visible_devices == "1,3");
  REQUIRE(p.nodes[0].ranks.size() == 2);
  // local rank 1 opens CUDA device 1 inside CUDA_VISIBLE_DEVICES=1,3: physical device 3.
  CHECK(p.nodes[0].ranks[1].local_rank == 1);
  CHECK(p.nodes[0].ranks[1].device == 3);
  CHECK(p.nodes[0].ranks[1].local_world_size == 2);
  CHECK(p.nodes[1].first_rank == 2);
  CHECK(p.nodes[1].ranks[0].rank == 2);
  CHECK(p.nodes[1].ranks[0].local_rank == 0);
  CHECK(p.nodes[1].ranks[3].rank == 5);
  CHECK(p.nodes[1].cuda_visible_devices == "0,1,2,3");

  Plan q = plan_placement(hostfile_select(hf, {.exclude = "b:0,2"}), "a", 29500);
  CHECK(q.nodes[1].cuda_visible_devices == "1,3");
  CHECK(q.nodes[1].ranks[0].device == 1);
  CHECK(q.nodes[1].ranks[0].rank == 4);
}

TEST_CASE("placement: four nodes x 8 = 32 ranks (hostfiles/four-nodes-8)") {
  Plan p = plan_placement(hostfile_load("hostfiles/four-nodes-8"), "node1", 29500);
  CHECK(p.world_size == 32);
  REQUIRE(p.nodes.size() == 4);
  for (int n = 0; n < 4; ++n) {
    const NodePlan& node = p.nodes[static_cast<size_t>(n)];
    CHECK(node.first_rank == 8 * n);
    CHECK(node.ranks.front().rank == 8 * n);
    CHECK(node.ranks.back().rank == 8 * n + 7);
    CHECK(node.ranks.back().local_rank == 7);
  }
}

TEST_CASE("placement: errors") {
  Hostfile hf = hostfile_localhost(2);
  CHECK_THROWS_AS(plan_placement(hf, "", 29500), ConfigError);
  CHECK_THROWS_AS(plan_placement(hf, "localhost", 0), ConfigError);
  CHECK_THROWS_AS(plan_placement(hf, "localhost", 65536), ConfigError);
  CHECK_THROWS_AS(plan_placement(Hostfile{}, "localhost", 29500), ConfigError);
  Hostfile empty_host = hf;
  empty_host.hosts[0].slot_ids.clear();
  CHECK_THROWS_AS(plan_placement(empty_host, "localhost", 29500), ConfigError);
}

TEST_CASE("placement: table") {
  Hostfile hf = hostfile_parse("node1 slots=8\nubuntu@node2 slots=1 port=2222\n", "h");
  std::string t = plan_format_table(plan_placement(hf, "node1", 29500));
  INFO(t);
  CHECK(contains(t, "node"));
  CHECK(contains(t, "devices"));
  CHECK(contains(t, "0-7"));
  CHECK(contains(t, "0,1,2,3,4,5,6,7"));
  CHECK(contains(t, "ubuntu@node2:2222"));
  CHECK(contains(t, "world size 9"));
  CHECK(contains(t, "node1:29500"));
  // One header, one row per node, one summary line.
  CHECK(std::count(t.begin(), t.end(), '\n') == 4);
  // Rank column of the single-slot node is "8", not "8-8".
  CHECK(!contains(t, "8-8"));
}

TEST_CASE("placement: IPv6 hosts and master are bracketed where a port follows") {
  Hostfile hf = hostfile_parse("::1 slots=1\nroot@[fe80::1%eth0] slots=2 port=2222\n", "h");
  Plan plan = plan_placement(hf, "fe80::9%eth0", 29500);
  CHECK(plan.master_addr == "fe80::9%eth0");  // bare: MASTER_ADDR and getaddrinfo take it so
  std::string t = plan_format_table(plan);
  INFO(t);
  CHECK(contains(t, "root@[fe80::1%eth0]:2222"));
  CHECK(contains(t, "master [fe80::9%eth0]:29500"));
  CHECK(contains(t, "\n0     ::1 "));
}
