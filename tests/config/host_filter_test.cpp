// Host selection: DeepSpeed's include/exclude examples, num-nodes/num-gpus, their
// combination, and every error (mutual exclusion, unknown host/slot, empty result).
#include "config/host_filter.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

using namespace dtrain;
using namespace dtrain::config;

namespace {

const char* WORKERS =
    "worker-0 slots=4\n"
    "worker-1 slots=4\n"
    "worker-2 slots=2\n";

Hostfile workers() { return hostfile_parse(WORKERS, "workers"); }

std::string select_error(const HostSelection& sel) {
  try {
    hostfile_select(workers(), sel);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL_CHECK("expected a ConfigError");
  return "";
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

std::vector<std::string> names(const Hostfile& hf) {
  std::vector<std::string> out;
  for (const HostEntry& h : hf.hosts) out.push_back(h.host);
  return out;
}

using Ids = std::vector<int>;

}  // namespace

TEST_CASE("select: no filter keeps everything") {
  Hostfile hf = hostfile_select(workers(), {});
  CHECK(names(hf) == std::vector<std::string>{"worker-0", "worker-1", "worker-2"});
  CHECK(hf.total_slots() == 10);
  CHECK(hf.path == "workers");
}

TEST_CASE("select: DeepSpeed --include worker-0@worker-1:0,2") {
  Hostfile hf = hostfile_select(workers(), {.include = "worker-0@worker-1:0,2"});
  REQUIRE(hf.hosts.size() == 2);
  CHECK(hf.hosts[0].host == "worker-0");
  CHECK(hf.hosts[0].slot_ids == Ids{0, 1, 2, 3});
  CHECK(hf.hosts[1].host == "worker-1");
  CHECK(hf.hosts[1].slot_ids == Ids{0, 2});
  CHECK(hf.hosts[1].slots == 4);  // the declared count stays, only the selection shrinks
  CHECK(hf.total_slots() == 6);
}

TEST_CASE("select: DeepSpeed --exclude worker-1:0") {
  Hostfile hf = hostfile_select(workers(), {.exclude = "worker-1:0"});
  REQUIRE(hf.hosts.size() == 3);
  CHECK(hf.hosts[0].slot_ids == Ids{0, 1, 2, 3});
  CHECK(hf.hosts[1].slot_ids == Ids{1, 2, 3});
  CHECK(hf.hosts[2].slot_ids == Ids{0, 1});
  CHECK(hf.total_slots() == 9);
}

TEST_CASE("select: include keeps hostfile order and sorts slots") {
  Hostfile hf = hostfile_select(workers(), {.include = "worker-2@worker-0:3,1"});
  CHECK(names(hf) == std::vector<std::string>{"worker-0", "worker-2"});
  CHECK(hf.hosts[0].slot_ids == Ids{1, 3});
  CHECK(hf.hosts[1].slot_ids == Ids{0, 1});
}

TEST_CASE("select: exclude a whole host, several slots, spaces and case") {
  Hostfile hf = hostfile_select(workers(), {.exclude = "worker-1 @ WORKER-0:0, 3"});
  CHECK(names(hf) == std::vector<std::string>{"worker-0", "worker-2"});
  CHECK(hf.hosts[0].slot_ids == Ids{1, 2});
  // Excluding every slot of a host drops the host.
  Hostfile hf2 = hostfile_select(workers(), {.exclude = "worker-2:0,1"});
  CHECK(names(hf2) == std::vector<std::string>{"worker-0", "worker-1"});
}

TEST_CASE("select: num-nodes and num-gpus") {
  Hostfile a = hostfile_select(workers(), {.num_nodes = 2});
  CHECK(names(a) == std::vector<std::string>{"worker-0", "worker-1"});
  CHECK(a.total_slots() == 8);

  Hostfile b = hostfile_select(workers(), {.num_gpus = 2});
  CHECK(b.hosts.size() == 3);
  for (const HostEntry& h : b.hosts) CHECK(h.slot_ids == Ids{0, 1});

  Hostfile c = hostfile_select(workers(), {.num_nodes = 1, .num_gpus = 3});
  REQUIRE(c.hosts.size() == 1);
  CHECK(c.hosts[0].slot_ids == Ids{0, 1, 2});

  // After a filter, "first N" means the first N of what the filter left.
  Hostfile d = hostfile_select(workers(), {.exclude = "worker-0@worker-1:0", .num_nodes = 1, .num_gpus = 2});
  REQUIRE(d.hosts.size() == 1);
  CHECK(d.hosts[0].host == "worker-1");
  CHECK(d.hosts[0].slot_ids == Ids{1, 2});

  Hostfile e = hostfile_select(workers(), {.include = "worker-1:1,3", .num_gpus = 1});
  CHECK(e.hosts[0].slot_ids == Ids{1});
}

TEST_CASE("select: a selected hostfile can be selected again") {
  Hostfile once = hostfile_select(workers(), {.include = "worker-0:1,2,3"});
  Hostfile twice = hostfile_select(once, {.exclude = "worker-0:2"});
  CHECK(twice.hosts[0].slot_ids == Ids{1, 3});
  std::string m;
  try {
    hostfile_select(once, {.include = "worker-0:0"});
  } catch (const ConfigError& e) {
    m = e.what();
  }
  CHECK(contains(m, "no slot 0"));
  CHECK(contains(m, "filtered out"));
}

TEST_CASE("select: IPv6 hosts as [addr] or [addr]:slots, or bare when they match a host exactly") {
  Hostfile v6 = hostfile_parse("::1 slots=2\nroot@fe80::1%eth0 slots=4\nnode-a slots=1\n", "v6");
  Hostfile hf = hostfile_select(v6, {.include = "[fe80::1%eth0]:1,3@::1"});
  REQUIRE(hf.hosts.size() == 2);
  CHECK(hf.hosts[0].host == "::1");
  CHECK(hf.hosts[0].slot_ids == Ids{0, 1});
  CHECK(hf.hosts[1].host == "fe80::1%eth0");
  CHECK(hf.hosts[1].slot_ids == Ids{1, 3});
  hf = hostfile_select(v6, {.exclude = "[::1]@node-a:0"});
  REQUIRE(hf.hosts.size() == 1);
  CHECK(hf.hosts[0].slot_ids == Ids{0, 1, 2, 3});
  hf = hostfile_select(v6, {.include = "fe80::1%ETH0"});
  REQUIRE(hf.hosts.size() == 1);
  CHECK(hf.hosts[0].host == "fe80::1%eth0");

  auto error = [&](const std::string& include) {
    try {
      hostfile_select(v6, {.include = include});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    FAIL_CHECK("expected a ConfigError for " << include);
    return std::string();
  };
  CHECK(contains(error("::1:0"), "write an IPv6 host in brackets"));
  CHECK(contains(error("[::1"), "bad node spec"));
  CHECK(contains(error("[::1]0"), "bad node spec"));
  CHECK(contains(error("[::1]:2"), "has no slot 2"));
  CHECK(contains(error("[::2]"), "not in hostfile v6"));
}

TEST_CASE("select errors") {
  std::string m = select_error({.include = "worker-0", .exclude = "worker-1"});
  CHECK(contains(m, "mutually exclusive"));

  m = select_error({.include = "worker-9"});
  CHECK(contains(m, "\"worker-9\""));
  CHECK(contains(m, "not in hostfile workers"));
  CHECK(contains(m, "worker-0, worker-1, worker-2"));

  m = select_error({.exclude = "worker-0@nobody:1"});
  CHECK(contains(m, "\"nobody\""));

  m = select_error({.include = "worker-2:2"});
  CHECK(contains(m, "\"worker-2\" has no slot 2"));

  m = select_error({.exclude = "worker-1:4"});
  CHECK(contains(m, "no slot 4"));

  for (const char* bad : {"worker-1:", "worker-1:a", "worker-1:-1", "worker-1:1,,2", "worker-1:99999999999999999"}) {
    CAPTURE(bad);
    m = select_error({.include = bad});
    CHECK(contains(m, "bad slot"));
    CHECK(contains(m, "worker-1"));
  }
  for (const char* bad : {"@worker-1", "worker-1@", "worker-0@@worker-1", ":1"}) {
    CAPTURE(bad);
    select_error({.include = bad});
  }
  CHECK(contains(select_error({.include = "worker-0@worker-0:1"}), "named twice"));
  CHECK(contains(select_error({.exclude = "worker-0:1,1"}), "listed twice"));

  m = select_error({.exclude = "worker-0@worker-1@worker-2"});
  CHECK(contains(m, "leaves no host"));
  m = select_error({.exclude = "worker-0@worker-1@worker-2:0,1"});
  CHECK(contains(m, "leaves no host"));

  CHECK(contains(select_error({.num_nodes = 0}), "--num-nodes must be a positive"));
  CHECK(contains(select_error({.num_nodes = -2}), "--num-nodes must be a positive"));
  CHECK(contains(select_error({.num_nodes = 4}), "--num-nodes 4 asks for more nodes"));
  CHECK(contains(select_error({.exclude = "worker-2", .num_nodes = 3}), "--num-nodes 3"));
  CHECK(contains(select_error({.num_gpus = 0}), "--num-gpus must be a positive"));
  m = select_error({.num_gpus = 3});
  CHECK(contains(m, "--num-gpus 3"));
  CHECK(contains(m, "\"worker-2\""));
  CHECK(contains(select_error({.num_gpus = 5}), "--num-gpus 5"));
}

TEST_CASE("select: seeded random filters raise only ConfigError") {
  const std::vector<std::string> atoms = {"worker-0", "worker-1", "WORKER-2", "nobody", ":",  "@", ",",
                                          "0",        "3",        "9",        " ",      "-1", "",  "x"};
  std::mt19937 rng(7u);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string filter;
    int n = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) filter += atoms[rng() % atoms.size()];
    HostSelection sel;
    (rng() % 2 ? sel.include : sel.exclude) = filter;
    if (rng() % 4 == 0) sel.num_nodes = static_cast<int>(rng() % 4) - 1;
    if (rng() % 4 == 0) sel.num_gpus = static_cast<int>(rng() % 5) - 1;
    try {
      Hostfile hf = hostfile_select(workers(), sel);
      ++accepted;
      CHECK(hf.total_slots() >= 1);
      for (const HostEntry& h : hf.hosts) {
        CHECK(!h.slot_ids.empty());
        CHECK(std::is_sorted(h.slot_ids.begin(), h.slot_ids.end()));
      }
    } catch (const ConfigError&) {
      ++rejected;
    }
  }
  CHECK(accepted > 50);
  CHECK(rejected > 50);
}
