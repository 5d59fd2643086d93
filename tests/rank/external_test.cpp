// dtrain run: the placement read from each launcher's environment, the local ranks'
// environment under --nproc-per-node, the token from the platform and rank 0's verdict
// over the heartbeats.
#include "rank/external.h"

#include "core/error.h"
#include "rank/rank_context.h"
#include "launch/rank_watch.h"
#include "rendezvous/store.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

using namespace dtrain;
using namespace dtrain::launch;
using namespace dtrain::rank;
using namespace std::chrono_literals;
using Env = std::map<std::string, std::string>;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("external_placement: torchrun and Kubeflow PyTorchJob variables") {
  ExternalPlacement p = external_placement({{"RANK", "5"},
                                            {"WORLD_SIZE", "8"},
                                            {"LOCAL_RANK", "1"},
                                            {"LOCAL_WORLD_SIZE", "4"},
                                            {"GROUP_RANK", "1"},
                                            {"MASTER_ADDR", "job-master-0"},
                                            {"MASTER_PORT", "23456"},
                                            {"TORCHELASTIC_RUN_ID", "abc"}});
  CHECK(p.launcher == "torchrun");
  CHECK(p.rank == 5);
  CHECK(p.world_size == 8);
  CHECK(p.local_rank == 1);
  CHECK(p.local_world_size == 4);
  CHECK(p.node_rank == 1);
  CHECK(p.nnodes == 2);
  CHECK(p.master_addr == "job-master-0");
  CHECK(p.master_port == 23456);
  CHECK(p.run_id == "abc");
  CHECK(contains(p.evidence, "RANK=5 WORLD_SIZE=8"));

  // A PyTorchJob pod: RANK/WORLD_SIZE/MASTER_*, no LOCAL_* (one process per pod).
  ExternalPlacement pod =
      external_placement({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "29500"}});
  CHECK(pod.local_rank == 0);
  CHECK(pod.local_world_size == 1);
  CHECK(pod.node_rank == 2);
  CHECK(pod.nnodes == 3);
}

TEST_CASE("external_placement: srun, Open MPI and PMI") {
  ExternalPlacement s = external_placement({{"SLURM_PROCID", "3"},
                                            {"SLURM_NTASKS", "4"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODEID", "1"},
                                            {"SLURM_NNODES", "2"},
                                            {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                            {"SLURM_STEP_NODELIST", "gpu[007-008]"},
                                            {"SLURM_JOB_NODELIST", "other[1-9]"},
                                            {"SLURM_JOB_ID", "4242"},
                                            {"SLURM_STEP_ID", "0"}});
  CHECK(s.launcher == "srun");
  CHECK(s.rank == 3);
  CHECK(s.world_size == 4);
  CHECK(s.local_rank == 1);
  CHECK(s.local_world_size == 2);
  CHECK(s.node_rank == 1);
  CHECK(s.master_addr == "gpu007");  // the step's first node
  CHECK(s.master_port == 0);         // not given: the config's port
  CHECK(s.run_id == "4242.0");
  // Uneven tasks per node: "3,1" gives node 1 one task.
  ExternalPlacement u = external_placement({{"SLURM_PROCID", "3"},
                                            {"SLURM_NTASKS", "4"},
                                            {"SLURM_NODEID", "1"},
                                            {"SLURM_NNODES", "2"},
                                            {"SLURM_TASKS_PER_NODE", "3,1"}});
  CHECK(u.local_world_size == 1);
  // MASTER_ADDR wins over the nodelist.
  CHECK(external_placement(
            {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n[1-2]"}, {"MASTER_ADDR", "login"}})
            .master_addr == "login");

  ExternalPlacement o = external_placement({{"OMPI_COMM_WORLD_RANK", "6"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                            {"SLURM_PROCID", "0"}});  // mpirun inside an allocation
  CHECK(o.launcher == "Open MPI");
  CHECK(o.rank == 6);
  CHECK(o.local_rank == 2);
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr.empty());

  ExternalPlacement m =
      external_placement({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  CHECK(m.launcher == "PMI");
  CHECK(m.rank == 1);
  CHECK(m.local_rank == 1);

  // torchrun's variables come first (a torchrun inside an srun step).
  CHECK(
      external_placement({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}).launcher ==
      "torchrun");
}

TEST_CASE("external_placement: errors name the variable") {
  CHECK(contains(error_of([] { external_placement({}); }), "no launcher's placement"));
  CHECK(contains(error_of([] { external_placement({{"RANK", "3"}, {"WORLD_SIZE", "3"}}); }), "RANK='3'"));
  CHECK(contains(error_of([] { external_placement({{"RANK", "0"}}); }), "WORLD_SIZE is not set"));
  CHECK(contains(error_of([] { external_placement({{"RANK", "x"}, {"WORLD_SIZE", "2"}}); }), "RANK='x'"));
  CHECK(contains(error_of([] { external_placement({{"SLURM_PROCID", "0"}}); }), "SLURM_NTASKS is not set"));
  CHECK(contains(error_of([] {
                   external_placement({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
                 }),
                 "MASTER_PORT='70000'"));
  CHECK(contains(error_of([] {
                   external_placement({{"OMPI_COMM_WORLD_RANK", "0"},
                                       {"OMPI_COMM_WORLD_SIZE", "2"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
                 }),
                 "OMPI_COMM_WORLD_LOCAL_RANK"));
}

TEST_CASE("external_placement: a Kubernetes Indexed Job pod's index is its rank") {
  ExternalPlacement p = external_placement({{"JOB_COMPLETION_INDEX", "2"},
                                            {"WORLD_SIZE", "3"},
                                            {"MASTER_ADDR", "dtrain-0.dtrain"},
                                            {"MASTER_PORT", "29500"}});
  CHECK(p.launcher == "a Kubernetes Indexed Job");
  CHECK(p.rank == 2);
  CHECK(p.world_size == 3);
  CHECK(p.node_rank == 2);
  CHECK(p.master_addr == "dtrain-0.dtrain");
  CHECK(contains(p.evidence, "JOB_COMPLETION_INDEX=2 WORLD_SIZE=3"));
  // RANK, where a manifest sets it too, wins; an index beyond WORLD_SIZE is an error.
  CHECK(external_placement({{"JOB_COMPLETION_INDEX", "2"}, {"RANK", "1"}, {"WORLD_SIZE", "3"}}).rank == 1);
  CHECK(contains(error_of([] {
                   external_placement({{"JOB_COMPLETION_INDEX", "3"}, {"WORLD_SIZE", "3"}});
                 }),
                 "JOB_COMPLETION_INDEX='3' must be an integer in [0, 2]"));
}

TEST_CASE("external_node: PET_NNODES / PET_NODE_RANK, where Kubeflow sets them, say the node") {
  const Env pod = {{"RANK", "1"}, {"WORLD_SIZE", "16"}, {"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}};
  ExternalPlacement node = external_node(external_placement(pod), pod);
  CHECK(node.rank == 1);
  CHECK(node.world_size == 2);
  // Without them the launcher's own rank and size are the node's.
  const Env plain = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  CHECK(external_node(external_placement(plain), plain).world_size == 2);
  const Env bad = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PET_NNODES", "2"}, {"PET_NODE_RANK", "2"}};
  CHECK(contains(error_of([&] { external_node(external_placement(bad), bad); }), "PET_NODE_RANK='2'"));
}

TEST_CASE("external_local_rank_env: --nproc-per-node children read torchrun's variables") {
  ExternalPlacement node = external_placement({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_ID", "77"}});
  Env base = {{"SLURM_PROCID", "1"},
              {"SLURM_NTASKS", "3"},
              {"SLURM_LOCALID", "0"},
              {"PATH", "/bin"},
              {"OMPI_COMM_WORLD_RANK", "9"}};
  Env e = external_local_rank_env(base, node, 4, 2, "n1", 29500);
  CHECK(e.at("RANK") == "6");
  CHECK(e.at("WORLD_SIZE") == "12");
  CHECK(e.at("LOCAL_RANK") == "2");
  CHECK(e.at("LOCAL_WORLD_SIZE") == "4");
  CHECK(e.at("GROUP_RANK") == "1");
  CHECK(e.at("MASTER_ADDR") == "n1");
  CHECK(e.at("PATH") == "/bin");
  CHECK(e.count("SLURM_PROCID") == 0);
  CHECK(e.count("OMPI_COMM_WORLD_RANK") == 0);
  ExternalPlacement child = external_placement(e);
  CHECK(child.launcher == "torchrun");
  CHECK(child.rank == 6);
  CHECK(child.node_rank == 1);
  CHECK(external_job_id(child.run_id) == "77");
}

TEST_CASE("external_job_id keeps the key-safe characters") {
  CHECK(external_job_id("") == "dtrain-run");
  CHECK(external_job_id("4242.0") == "4242.0");
  CHECK(external_job_id("a/b c:d") == "abcd");
  CHECK(external_job_id("--x") == "x");
  CHECK(external_job_id(std::string(100, 'a')).size() == 64);
}

TEST_CASE("external_token: a mounted file or a named variable, never empty or short") {
  const std::string path = "/tmp/dtrain-token-test-" + std::to_string(::getpid());
  std::ofstream(path) << "  0123456789abcdef0123\n";
  CHECK(external_token(path, "", {}, "c.yaml") == "0123456789abcdef0123");
  // ~/ is the process's HOME (a private file on a shared home directory).
  const auto slash = path.rfind('/');
  CHECK(external_token("~" + path.substr(slash), "", {{"HOME", path.substr(0, slash)}}, "c.yaml") ==
        "0123456789abcdef0123");
  CHECK(external_token("", "JOB_TOKEN", {{"JOB_TOKEN", "fedcba9876543210fedc"}}, "c.yaml") == "fedcba9876543210fedc");

  std::string none = error_of([] { external_token("", "", {}, "c.yaml"); });
  CHECK(contains(none, "c.yaml"));
  CHECK(contains(none, "cluster.rendezvous.token_file"));
  CHECK(contains(none, "never taken from the command line"));
  CHECK(contains(error_of([&] { external_token(path, "X", {}, "c.yaml"); }), "not both"));
  CHECK(contains(error_of([] { external_token("/nonexistent/tok", "", {}, "c.yaml"); }), "/nonexistent/tok"));
  CHECK(contains(error_of([] { external_token("", "JOB_TOKEN", {}, "c.yaml"); }), "JOB_TOKEN, which is not set"));
  std::ofstream(path) << "short\n";
  CHECK(contains(error_of([&] { external_token(path, "", {}, "c.yaml"); }), "has 5 characters"));
  std::remove(path.c_str());
}

TEST_CASE("external_watch_verdict: silent, missing and exited ranks") {
  using Beats = std::map<int, std::pair<std::string, std::chrono::milliseconds>>;
  const std::map<int, std::string> hosts = {{1, "pid 42 node-b"}};
  // Everyone beating recently: go on.
  CHECK(external_watch_verdict({{0, {"1", 100ms}}, {1, {"2", 900ms}}}, hosts, 2, 5s, true, 60s).empty());
  // A rank silent past the timeout is named with its host.
  std::string silent = external_watch_verdict({{0, {"1", 100ms}}, {1, {"2", 6500ms}}}, hosts, 2, 5s, false, 60s);
  CHECK(contains(silent, "rank 1 (pid 42 node-b) missed heartbeats for 6.5 s"));
  // Exited ranks are silent by design.
  CHECK(external_watch_verdict({{0, {"1", 100ms}}, {1, {kRankBeatExited, 60s}}}, hosts, 2, 5s, true, 60s).empty());
  // Absent ranks: still joining until the join deadline, then named.
  Beats only0 = {{0, {"1", 100ms}}};
  CHECK(external_watch_verdict(only0, hosts, 3, 5s, false, 60s).empty());
  CHECK(contains(external_watch_verdict(only0, hosts, 3, 5s, true, 60s), "rank(s) 1, 2 did not join within"));
}

TEST_CASE("external_failure_reason: a rank's own error before its peers' communication errors") {
  const int comm = static_cast<int>(Exit::COMM);
  const std::string peer = std::to_string(comm) + " rank 1 on b failed: connection reset by peer";
  const std::string own = "1 rank 2 on c failed: cannot write checkpoint file x: No space left on device";
  CHECK(external_failure_reason({{"rank1", peer}}, comm, 200ms).empty());  // wait a second for the cause
  CHECK(external_failure_reason({{"rank1", peer}}, comm, 1500ms) == "rank 1 on b failed: connection reset by peer");
  CHECK(external_failure_reason({{"rank1", peer}, {"rank2", own}}, comm, 0ms) ==
        "rank 2 on c failed: cannot write checkpoint file x: No space left on device");
}

namespace {
// A store on loopback with the contexts of `world` ranks joined to it.
struct LocalJob {
  std::string token = rendezvous::token_generate();
  rendezvous::StoreServer server{"127.0.0.1", 0, token};
  std::vector<RankContext> ranks;
  explicit LocalJob(int world) {
    for (int r = 0; r < world; ++r) {
      RankContext c;
      c.rank = r;
      c.world_size = world;
      c.master_addr = "127.0.0.1";
      c.master_port = server.port();
      c.job_id = "t";
      c.token = token;
      rank_context_connect(c, 5s);
      ranks.push_back(std::move(c));
    }
  }
};

// Waits (bounded) until `flag` is set.
bool wait_for(const std::atomic<bool>& flag, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!flag && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  return flag;
}
}  // namespace

TEST_CASE("ExternalRankZeroWatch sets the stop key with a rank's failure; every ExternalStopWatch reports it") {
  LocalJob job(3);
  std::mutex mu;
  std::vector<std::string> stopped(3);
  std::atomic<int> count{0};
  std::atomic<bool> all{false};
  {
    std::vector<std::unique_ptr<ExternalStopWatch>> watches;
    for (int r = 0; r < 3; ++r)
      watches.push_back(std::make_unique<ExternalStopWatch>(job.ranks[r], 5s, r == 0 ? &job.server : nullptr,
                                                            [&, r](const std::string& why) {
                                                              std::lock_guard<std::mutex> lock(mu);
                                                              stopped[r] = why;
                                                              if (++count == 3) all = true;
                                                            }));
    ExternalRankZeroWatch zero(job.server, job.ranks[0], 3, 60s, 60s);
    for (int r = 0; r < 3; ++r) job.ranks[r].round_store->set(fmt::format("hb/rank{}", r), "1");
    std::this_thread::sleep_for(500ms);
    CHECK(count == 0);  // everyone beating, nobody failed: nothing stops
    job.ranks[2].round_store->set("fail/rank2", "1 rank 2 on c failed: bad data");
    REQUIRE(wait_for(all, 10s));
  }
  for (int r = 0; r < 3; ++r) CHECK(stopped[r] == "the job stops: rank 2 on c failed: bad data");
}

TEST_CASE("ExternalRankZeroWatch names a rank that stops beating; a watch whose store is gone reports it") {
  LocalJob job(2);
  job.ranks[0].round_store->set("rankinfo/rank1", "4242 node-b");
  for (int r = 0; r < 2; ++r) job.ranks[r].round_store->set(fmt::format("hb/rank{}", r), "1");
  std::atomic<bool> done{false};
  std::string why;
  {
    ExternalStopWatch watch(job.ranks[0], 5s, nullptr, [&](const std::string& w) {
      why = w;
      done = true;
    });
    ExternalRankZeroWatch zero(job.server, job.ranks[0], 2, 1s, 60s);
    // Rank 0 keeps beating, rank 1 falls silent.
    for (int i = 0; i < 40 && !done; ++i) {
      job.ranks[0].round_store->set("hb/rank0", "1");
      std::this_thread::sleep_for(100ms);
    }
    REQUIRE(wait_for(done, 5s));
  }
  CHECK(contains(why, "rank 1 (pid 4242 node-b) missed heartbeats"));

  // The store goes away (rank 0's process died): the watch gives up after lost_timeout.
  LocalJob other(1);
  std::atomic<bool> lost{false};
  std::string lost_why;
  ExternalStopWatch watch(other.ranks[0], 600ms, nullptr, [&](const std::string& w) {
    lost_why = w;
    lost = true;
  });
  std::this_thread::sleep_for(300ms);
  CHECK(!lost);
  other.server.stop();
  REQUIRE(wait_for(lost, 10s));
  CHECK(contains(lost_why, "lost the job's store at 127.0.0.1:"));
  CHECK(contains(lost_why, "the job stops"));
}

TEST_CASE("external_store_wait: a wrong token is refused at once; an address that never answers times out") {
  LocalJob job(1);
  std::string e =
      error_of([&] { external_store_wait("127.0.0.1", job.server.port(), rendezvous::token_generate(), 30s); });
  CHECK(contains(e, "cannot join the job's store at 127.0.0.1:"));
  CHECK(contains(e, "refused authentication"));
  external_store_wait("127.0.0.1", job.server.port(), job.token, 5s);  // the right one joins
  // A name that never resolves: retried until the join timeout, then named.
  e = error_of([] { external_store_wait("no-such-pod.invalid", 29500, "x", 2500ms); });
  CHECK(contains(e, "no-such-pod.invalid:29500"));
  CHECK(contains(e, "cluster.rendezvous.join_timeout"));
}
