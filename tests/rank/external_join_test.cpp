// `dtrain run`'s join and environment checks at module level: launcher variables that
// overflow, point past the node count or disagree between two launchers; the canonical
// config text and its difference; one claimant per rank; and rank 0's watch naming the
// ranks that never joined while the rank's own client is held by a long request.
#include "rank/external.h"
#include "rank/external_join.h"
#include "rank/rank_context.h"

#include "config/train_config.h"
#include "core/error.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace dtrain;
using namespace dtrain::rank;
using namespace std::chrono_literals;

namespace {

using Env = std::map<std::string, std::string>;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

RankContext joined(rendezvous::StoreServer& server, const std::string& token, int rank, int world) {
  RankContext c;
  c.rank = rank;
  c.world_size = world;
  c.master_addr = "127.0.0.1";
  c.master_port = server.port();
  c.job_id = "t";
  c.token = token;
  rank_context_connect(c, 5s);
  return c;
}

}  // namespace

TEST_CASE("external_placement: counts that overflow and node indices past the node count are errors") {
  const Env slurm = {{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "2"},
                     {"SLURM_NNODES", "2"},
                     {"SLURM_NODEID", "0"},
                     {"SLURM_TASKS_PER_NODE", "99999999999(x2)"}};
  const std::string e = error_of([&] { external_placement(slurm); });
  CHECK(contains(e, "SLURM_TASKS_PER_NODE='99999999999(x2)'"));
  CHECK(contains(e, "outside [1, 1048576]"));
  Env repeat = slurm;
  repeat["SLURM_TASKS_PER_NODE"] = "1(x99999999999)";
  CHECK(contains(error_of([&] { external_placement(repeat); }), "SLURM_TASKS_PER_NODE='1(x99999999999)'"));
  Env fine = slurm;
  fine["SLURM_TASKS_PER_NODE"] = "1(x2)";
  CHECK(external_placement(fine).local_world_size == 1);

  CHECK(contains(error_of([] {
                   external_placement({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"GROUP_RANK", "99999"}});
                 }),
                 "GROUP_RANK='99999' must be an integer in [0, 0]"));
  // 8 ranks, 4 per node: nodes 0 and 1.
  CHECK(contains(
      error_of([] {
        external_placement(
            {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"GROUP_RANK", "2"}});
      }),
      "GROUP_RANK='2' must be an integer in [0, 1]"));
  // torchrun's GROUP_WORLD_SIZE says the node count where the nodes are uneven.
  ExternalPlacement uneven = external_placement({{"RANK", "4"},
                                                 {"WORLD_SIZE", "5"},
                                                 {"LOCAL_WORLD_SIZE", "2"},
                                                 {"LOCAL_RANK", "0"},
                                                 {"GROUP_RANK", "2"},
                                                 {"GROUP_WORLD_SIZE", "3"}});
  CHECK(uneven.nnodes == 3);
  CHECK(uneven.node_rank == 2);
}

TEST_CASE("external_placement: two launchers' placements that disagree are refused, naming both") {
  const std::string e = error_of([] {
    external_placement(
        {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  });
  CHECK(contains(e, "RANK=1 WORLD_SIZE=2"));
  CHECK(contains(e, "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1"));
  CHECK(contains(
      error_of([] {
        external_placement(
            {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
      }),
      "PMI_RANK=0 PMI_SIZE=2"));
  // The same view twice, or mpirun's one process per node starting torchrun: accepted.
  CHECK(external_placement(
            {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
            .rank == 1);
  CHECK(external_placement({{"RANK", "5"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_WORLD_SIZE", "4"},
                            {"LOCAL_RANK", "1"},
                            {"GROUP_RANK", "1"},
                            {"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"}})
            .rank == 5);
  // Slurm's are not compared: a batch step exports SLURM_PROCID=0 to what it starts.
  CHECK(external_placement({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).rank ==
        1);
}

TEST_CASE("external_config_text: the training keys, not how each process reaches the others; the diff names keys") {
  config::TrainConfig a;
  a.training.max_steps = 40;
  config::TrainConfig b = a;
  b.cluster.network_interface = "eth7";
  b.cluster.rendezvous.token_file = "/elsewhere/token";
  b.training.output_dir = "/mnt/other/run";
  CHECK(external_config_text(a) == external_config_text(b));
  CHECK(!contains(external_config_text(a), "cluster."));
  CHECK(contains(external_config_text(a), "training.max_steps="));
  b.training.max_steps = 60;
  const auto diff = external_config_diff(external_config_text(a), external_config_text(b), 3);
  REQUIRE(diff.size() == 1);
  CHECK(diff[0] == "training.max_steps (rank 0: 40, rank 3: 60)");
  CHECK(external_config_diff("x=1\n", "y=2\n", 1) ==
        std::vector<std::string>{"x (rank 0: 1, rank 1: (unset))", "y (rank 0: (unset), rank 1: 2)"});
}

TEST_CASE("external_join_claim: a second claimant of a rank is refused naming both, and the job's stop key is set") {
  const std::string token = rendezvous::token_generate();
  rendezvous::StoreServer server("127.0.0.1", 0, token);
  RankContext a = joined(server, token, 1, 2), b = joined(server, token, 1, 2);
  external_join_claim(*a.round_store, 1, "node-a (pid 11)", kExternalStopKey, 5s);
  const std::string e =
      error_of([&] { external_join_claim(*b.round_store, 1, "node-b (pid 22)", kExternalStopKey, 5s); });
  CHECK(contains(e, "rank 1 was started twice: by node-a (pid 11) and again by node-b (pid 22)"));
  CHECK(contains(a.round_store->get(kExternalStopKey, 1s), "rank 1 was started twice"));
  // Other ranks claim freely.
  external_join_claim(*b.round_store, 0, "node-b (pid 22)", kExternalStopKey, 5s);
}

TEST_CASE("external_config_check: a rank whose config differs from rank 0's gets a ConfigError naming the keys") {
  const std::string token = rendezvous::token_generate();
  rendezvous::StoreServer server("127.0.0.1", 0, token);
  RankContext r0 = joined(server, token, 0, 2), r1 = joined(server, token, 1, 2);
  config::TrainConfig c0;
  c0.model.d_model = 128;
  config::TrainConfig c1 = c0;
  external_config_publish(*r0.round_store, external_config_text(c0));
  external_config_check(*r1.round_store, external_config_text(c1), 1, 5s);
  c1.model.d_model = 192;
  CHECK_THROWS_AS(external_config_check(*r1.round_store, external_config_text(c1), 1, 5s), ConfigError);
  CHECK(contains(error_of([&] { external_config_check(*r1.round_store, external_config_text(c1), 1, 5s); }),
                 "model.d_model (rank 0: 128, rank 1: 192)"));
}

TEST_CASE("ExternalRankZeroWatch names the ranks that never joined while the rank's own client is held") {
  const std::string token = rendezvous::token_generate();
  rendezvous::StoreServer server("127.0.0.1", 0, token);
  RankContext r0 = joined(server, token, 0, 4);
  r0.round_store->set("hb/rank0", "1");
  // The main thread's long request (what device agreement was: a 300 s GET) holds the
  // client's mutex; the watch must not need it.
  std::thread blocked([&] {
    try {
      r0.round_store->get("never", 20s);
    } catch (const Error&) {
    }
  });
  const std::string stop_key = r0.round_store->prefix() + kExternalStopKey;
  {
    ExternalRankZeroWatch zero(server, r0, 4, 60s, 500ms);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (server.entries(stop_key).empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
  }
  const auto stop = server.entries(stop_key);
  REQUIRE(stop.size() == 1);
  CHECK(contains(stop.begin()->second.value, "rank(s) 1, 2, 3 did not join within cluster.rendezvous.join_timeout"));
  server.stop();  // ends the blocked GET
  blocked.join();
}
