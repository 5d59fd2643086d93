// `dtrain run` under another launcher, on the 3-node namespace cluster: a plain shell
// loop stands in for the operator (Kubeflow, an Indexed Job, srun, mpirun): it starts
// one `dtrain run` per node with that launcher's variables, and starts all three again
// when any exits non-zero (a restart policy). With torchrun's, srun's and Open MPI's
// variables the job trains the default job's model and data to the same losses and
// weights as `dtrain launch` on the same nodes; a process with a wrong token or none is
// refused while the job goes on undisturbed; a kill -9 of any process (the store's host
// included) makes every process exit non-zero, and the restarted set resumes from the
// last checkpoint and finishes with the uninterrupted run's weights, then goes on with
// 2 of the 3 nodes (another world size) from there.
#include "cli_harness.h"
#include "run_readers.h"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <sstream>

using namespace dtrain::cli_test;

namespace {

constexpr int kNodes = 3;
constexpr int kSteps = 40;
constexpr double kHeartbeatTimeout = 5;

// The embedded default job (configs/tiny-sft.yaml: the 4-layer Llama on the shipped
// instruction data), shortened, with a checkpoint every 10 steps and fast failure
// detection; every step's loss in metrics.jsonl. Both launchers get exactly these.
std::vector<std::string> job_sets() {
  return {"--set", fmt::format("training.max_steps={}", kSteps),
          "--set", "training.save_steps=10",
          "--set", "steps_per_print=1",
          "--set", "training.keep_last=5",
          "--set", "fault_tolerance.heartbeat_interval=1",
          "--set", fmt::format("fault_tolerance.heartbeat_timeout={}", kHeartbeatTimeout)};
}

struct Env {
  Cluster cluster{kNodes, 1};
  std::string bin = dtrain_bin();
  std::string token_file;
  std::string launch_dir;  // the reference: dtrain launch on the same nodes
  int next_port = 20000 + static_cast<int>(::getpid() % 20000);
};

// Skipped (exit 77, which ctest reports as skipped) rather than passed when the binary
// or the namespace cluster is not available.
[[noreturn]] void skip(const std::string& why) {
  std::printf("dtrain run CLI tests skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

Env* env() {
  if (dtrain_bin().empty()) skip("$DTRAIN_BIN is not set or not executable (run through ctest)");
  static std::unique_ptr<Env> instance = std::make_unique<Env>();
  if (!instance->cluster.usable()) {
    if (instance->cluster.failed()) FAIL("the test cluster could not be started: " << instance->cluster.skip_reason());
    skip(instance->cluster.skip_reason());
  }
  if (instance->token_file.empty()) {
    // The job's Secret: 64 random hex characters in a file every node reads.
    std::random_device rd;
    std::string token;
    for (int i = 0; i < 64; ++i) token += "0123456789abcdef"[rd() % 16];
    instance->token_file = instance->cluster.dir() + "/job-token";
    std::ofstream(instance->token_file) << token << "\n";
  }
  return instance.get();
}

// dtrain launch of the same job on the same 3 nodes (one rank each): the losses and the
// weights every `dtrain run` flavour must reproduce. Run once per test binary.
const std::string& launch_reference(Env& e) {
  if (!e.launch_dir.empty()) return e.launch_dir;
  const std::string dir = e.cluster.dir() + "/run-launch";
  std::vector<std::string> argv = {e.bin,           "launch", "--hostfile",   e.cluster.dir() + "/hostfile",
                                   "--master-port", "0",      "--output-dir", dir};
  for (const auto& s : e.cluster.ssh_sets()) argv.push_back(s);
  for (const auto& s : job_sets()) argv.push_back(s);
  auto r = run(argv, {}, 300s);
  INFO("dtrain launch output:\n" << r.out);
  REQUIRE_MESSAGE(!r.timed_out, "dtrain launch of the reference did not finish in 300 s");
  REQUIRE(r.rc == 0);
  REQUIRE(contains(r.out, "job finished: all 3 rank(s) succeeded in round 0"));
  MESSAGE(fmt::format("dtrain launch on 3 nodes, {} steps: {:.1f} s", kSteps, r.seconds));
  e.launch_dir = dir;
  return e.launch_dir;
}

enum class Flavour { TORCHRUN, SRUN, OPEN_MPI };

// What each launcher sets for the process on node k (of `nodes`, one process per node), and
// the --set arguments for what it does not say (srun's port, Open MPI's address and port).
std::string placement_vars(const Env& e, Flavour f, int k, int nodes, int port) {
  const Cluster& c = e.cluster;
  switch (f) {
    case Flavour::TORCHRUN:  // also Kubeflow's PyTorchJob
      return fmt::format(
          "RANK={0} WORLD_SIZE={1} LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK={0} MASTER_ADDR={2} "
          "MASTER_PORT={3} TORCHELASTIC_RUN_ID=op-test",
          k, nodes, c.addr(0), port);
    case Flavour::SRUN:
      return fmt::format(
          "SLURM_PROCID={0} SLURM_NTASKS={1} SLURM_LOCALID=0 SLURM_NODEID={0} SLURM_NNODES={1} "
          "SLURM_JOB_NODELIST={2},{3},{4} SLURM_TASKS_PER_NODE='1(x{1})' SLURM_JOB_ID=4242",
          k, nodes, c.addr(0), c.addr(1), c.addr(2));
    case Flavour::OPEN_MPI:
      return fmt::format(
          "OMPI_COMM_WORLD_RANK={} OMPI_COMM_WORLD_SIZE={} OMPI_COMM_WORLD_LOCAL_RANK=0 "
          "OMPI_COMM_WORLD_LOCAL_SIZE=1",
          k, nodes);
  }
  return "";
}

std::vector<std::string> flavour_sets(const Env& e, Flavour f, int port) {
  if (f == Flavour::SRUN) return {"--set", fmt::format("cluster.rendezvous.port={}", port)};
  if (f == Flavour::OPEN_MPI)
    return {"--set", "cluster.rendezvous.address=" + e.cluster.addr(0), "--set",
            fmt::format("cluster.rendezvous.port={}", port)};
  return {};
}

// The operator: a shell loop that starts one `dtrain run` on each of the first `nodes`
// nodes (node k's output in <logs>/node<k>.attempt<a>.log), waits for all, and starts all
// again while any exited non-zero, at most `attempts` times. Prints "attempt A exit
// codes: c0 c1 ...". `more` = further arguments of every dtrain run.
struct Operator {
  std::string logs, script;
  int nodes = kNodes;
};

Operator write_operator(Env& e, Flavour f, const std::string& name, const std::string& run_dir, int attempts,
                        int nodes = kNodes, const std::vector<std::string>& more = {}) {
  Operator op;
  op.nodes = nodes;
  op.logs = e.cluster.dir() + "/logs-" + name;
  std::filesystem::create_directories(op.logs);
  const int port = e.next_port++;
  std::string args;
  std::vector<std::string> sets = job_sets();
  for (const auto& s : flavour_sets(e, f, port)) sets.push_back(s);
  sets.insert(sets.end(), {"--set", "cluster.rendezvous.token_file=" + e.token_file, "--output-dir", run_dir});
  sets.insert(sets.end(), more.begin(), more.end());
  for (const auto& s : sets) args += " " + shq(s);
  std::string s = "#!/bin/bash\n# stands in for the operator: one process per node, all restarted when any fails\n";
  s += "set -u\n";
  s += fmt::format("for attempt in $(seq 1 {}); do\n", attempts);
  std::string waits, codes, all_ok = "true";
  for (int k = 0; k < nodes; ++k) {
    s += fmt::format("  ip netns exec {} env {} {} run{} > {}/node{}.attempt$attempt.log 2>&1 &\n  p{}=$!\n",
                     e.cluster.ns(k), placement_vars(e, f, k, nodes, port), shq(e.bin), args, shq(op.logs), k, k);
    waits += fmt::format(" wait $p{0}; c{0}=$?;", k);
    codes += fmt::format(" $c{}", k);
    all_ok += fmt::format(" && [ $c{} -eq 0 ]", k);
  }
  s += " " + waits + "\n";
  s += "  echo \"attempt $attempt exit codes:" + codes + "\"\n";
  s += "  if " + all_ok + "; then exit 0; fi\n";
  s += "done\nexit 1\n";
  op.script = op.logs + "/operator.sh";
  std::ofstream(op.script) << s;
  return op;
}

std::string node_log(const Operator& op, int node, int attempt) {
  return read_text(fmt::format("{}/node{}.attempt{}.log", op.logs, node, attempt));
}

std::string all_logs(const Operator& op, int attempts) {
  std::string s;
  for (int a = 1; a <= attempts; ++a)
    for (int k = 0; k < op.nodes; ++k) s += fmt::format("--- node {} attempt {}:\n{}", k, a, node_log(op, k, a));
  return s;
}

// The exit codes the operator printed for `attempt` (empty when it has not yet).
std::vector<int> exit_codes(const std::string& out, int attempt) {
  const std::string head = fmt::format("attempt {} exit codes: ", attempt);
  const size_t at = out.find(head);
  std::vector<int> codes;
  if (at == std::string::npos) return codes;
  std::istringstream in(out.substr(at + head.size(), out.find('\n', at) - at - head.size()));
  for (int c; in >> c;) codes.push_back(c);
  return codes;
}

// Waits (bounded) until node k's log of `attempt` contains `needle`.
bool wait_log(const Operator& op, int node, int attempt, const std::string& needle, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (contains(node_log(op, node, attempt), needle)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// The `dtrain run` process of node k's namespace (bounded wait).
std::optional<pid_t> run_process(const Env& e, int node, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    for (const auto& p : dtrain_processes(e.cluster.ns(node), e.bin))
      if (p.cmdline.rfind(e.bin + " run", 0) == 0) return p.pid;
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

// The run's losses and final weights equal the dtrain launch reference's.
void check_same_as_launch(Env& e, const std::string& run_dir) {
  const std::string& ref = launch_reference(e);
  const auto want = metric_losses(ref), got = metric_losses(run_dir);
  REQUIRE(want.size() == static_cast<size_t>(kSteps));
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i].first == want[i].first);
    worst = std::max(worst, std::fabs(got[i].second - want[i].second) / std::fabs(want[i].second));
  }
  CHECK_MESSAGE(worst <= 1e-6, "losses differ from dtrain launch's by up to " << worst << " (relative)");
  const double d = weights_diff(run_dir + "/final/model.safetensors", ref + "/final/model.safetensors");
  CHECK_MESSAGE(d <= 1e-6, "final weights differ from dtrain launch's by " << d);
  MESSAGE(
      fmt::format("loss {:.4f} at step 1, {:.4f} at step {} (dtrain launch: {:.4f}, {:.4f}); losses max rel diff "
                  "{:g}, final weights max rel diff {:g}{}",
                  got.front().second, got.back().second, kSteps, want.front().second, want.back().second, worst, d,
                  read_text(run_dir + "/final/model.safetensors") == read_text(ref + "/final/model.safetensors")
                      ? " (bit-identical)"
                      : ""));
}

void train_and_compare(Env& e, Flavour f, const std::string& name, const std::string& found) {
  launch_reference(e);
  const std::string run_dir = e.cluster.dir() + "/run-" + name;
  Operator op = write_operator(e, f, name, run_dir, 1);
  auto r = run({"/bin/bash", op.script}, {}, 300s);
  INFO("operator output:\n" << r.out << "\nprocess logs:\n" << all_logs(op, 1));
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "attempt 1 exit codes: 0 0 0"));
  for (int k = 0; k < kNodes; ++k) CHECK(contains(node_log(op, k, 1), fmt::format("placed by {} (", found)));
  CHECK(contains(node_log(op, 0, 1), fmt::format("dtrain run: {} rank(s) train on cpu, collectives: gloo", kNodes)));
  check_same_as_launch(e, run_dir);
}

}  // namespace

TEST_CASE(
    "dtrain run with torchrun's variables on 3 nodes: the losses of dtrain launch; a wrong or missing token "
    "is refused and the job goes on") {
  Env* e = env();
  if (!e) return;
  launch_reference(*e);
  const std::string run_dir = e->cluster.dir() + "/run-torchrun";
  Operator op = write_operator(*e, Flavour::TORCHRUN, "torchrun", run_dir, 1);
  Child job({"/bin/bash", op.script});
  REQUIRE(job.started());
  REQUIRE_MESSAGE(wait_log(op, 0, 1, "train: ", 120s), "rank 0 did not start training:\n" << all_logs(op, 1));

  // An intruder in node 1's namespace with the job's placement but another token: the
  // store refuses it before it can read or write anything.
  const std::string wrong = e->cluster.dir() + "/wrong-token";
  std::ofstream(wrong) << "0123456789abcdef0123456789abcdef\n";
  const int port = e->next_port - 1;
  const std::string intruder_vars =
      fmt::format("RANK=1 WORLD_SIZE=3 MASTER_ADDR={} MASTER_PORT={}", e->cluster.addr(0), port);
  auto intruder = run({"/bin/sh", "-c",
                       fmt::format("exec ip netns exec {} env {} {} run --set cluster.rendezvous.token_file={} "
                                   "--output-dir {}/run-intruder",
                                   e->cluster.ns(1), intruder_vars, shq(e->bin), shq(wrong), e->cluster.dir())},
                      {}, 60s);
  INFO("intruder output:\n" << intruder.out);
  CHECK(!intruder.timed_out);
  CHECK(intruder.rc != 0);
  CHECK(contains(intruder.out, "refused authentication"));
  // Without any token: a usage error before it connects anywhere.
  auto tokenless = run({"/bin/sh", "-c",
                        fmt::format("exec ip netns exec {} env {} {} run --output-dir {}/run-intruder",
                                    e->cluster.ns(1), intruder_vars, shq(e->bin), e->cluster.dir())},
                       {}, 60s);
  INFO("tokenless output:\n" << tokenless.out);
  CHECK(tokenless.rc == 2);
  CHECK(contains(tokenless.out, "needs the job token from the platform"));
  CHECK(job.running());  // the intruders ran while the job trained

  auto rc = job.wait(300s);
  INFO("operator output:\n" << job.output() << "\nprocess logs:\n" << all_logs(op, 1));
  REQUIRE(rc.has_value());
  CHECK(*rc == 0);
  CHECK(contains(job.output(), "attempt 1 exit codes: 0 0 0"));
  for (int k = 0; k < kNodes; ++k)
    CHECK(contains(node_log(op, k, 1), fmt::format("placed by torchrun (RANK={} WORLD_SIZE=3", k)));
  check_same_as_launch(*e, run_dir);
}

TEST_CASE("dtrain run with srun's variables on 3 nodes: the losses of dtrain launch") {
  Env* e = env();
  if (!e) return;
  train_and_compare(*e, Flavour::SRUN, "srun", "srun");
}

TEST_CASE("dtrain run with Open MPI's variables on 3 nodes: the losses of dtrain launch") {
  Env* e = env();
  if (!e) return;
  train_and_compare(*e, Flavour::OPEN_MPI, "ompi", "Open MPI");
}

TEST_CASE(
    "dtrain run: kill -9 of a process (then of the store's host) stops every process non-zero; the restarted "
    "set resumes and finishes with dtrain launch's weights; 2 of the 3 nodes then go on from its checkpoint") {
  Env* e = env();
  if (!e) return;
  launch_reference(*e);
  const std::string run_dir = e->cluster.dir() + "/run-kill";
  Operator op = write_operator(*e, Flavour::TORCHRUN, "kill", run_dir, 3);
  Child job({"/bin/bash", op.script});
  REQUIRE(job.started());
  const auto hb_timeout = std::chrono::milliseconds(static_cast<int>(kHeartbeatTimeout * 1000));

  // Attempt 1: rank 2 dies after the first checkpoint; every process of the round must
  // exit non-zero within the heartbeat timeout.
  REQUIRE_MESSAGE(wait_log(op, 0, 1, "saved checkpoints/step10", 120s), "no first checkpoint:\n" << all_logs(op, 1));
  auto victim = run_process(*e, 2, 10s);
  REQUIRE_MESSAGE(victim.has_value(), "no dtrain run process in node 2");
  ::kill(*victim, SIGKILL);
  auto killed_at = Clock::now();
  const bool stopped = job.wait_output("attempt 1 exit codes: ", hb_timeout + 10s);
  const double first_stop = std::chrono::duration<double>(Clock::now() - killed_at).count();
  INFO("operator output:\n" << job.output() << "\nprocess logs:\n" << all_logs(op, 3));
  REQUIRE_MESSAGE(stopped, "the processes did not all exit after the kill");
  // Rank 2's SIGKILL as the shell reports it (128 + 9); the others' own non-zero exits.
  const std::vector<int> codes1 = exit_codes(job.output(), 1);
  REQUIRE(codes1.size() == 3);
  CHECK(codes1[0] != 0);
  CHECK(codes1[1] != 0);
  CHECK(codes1[2] == 137);
  for (int k = 0; k < 2; ++k) CHECK(contains(node_log(op, k, 1), "dtrain: error: "));
  CHECK(first_stop <= kHeartbeatTimeout);

  // Attempt 2 resumes from a checkpoint; then the store's host (rank 0) dies.
  REQUIRE_MESSAGE(wait_log(op, 0, 2, "resumed from step ", 120s), "attempt 2 did not resume:\n" << all_logs(op, 2));
  const std::string second = node_log(op, 0, 2);
  const int k1 = std::atoi(second.c_str() + second.find("resumed from step ") + 18);
  CHECK(k1 >= 10);
  REQUIRE(k1 + 10 < kSteps);
  REQUIRE_MESSAGE(wait_log(op, 0, 2, fmt::format("saved checkpoints/step{}", k1 + 10), 120s),
                  "attempt 2 saved no checkpoint:\n"
                      << all_logs(op, 2));
  victim = run_process(*e, 0, 10s);
  REQUIRE_MESSAGE(victim.has_value(), "no dtrain run process in node 0");
  ::kill(*victim, SIGKILL);
  killed_at = Clock::now();
  const bool stopped2 = job.wait_output("attempt 2 exit codes: ", hb_timeout + 10s);
  const double second_stop = std::chrono::duration<double>(Clock::now() - killed_at).count();
  REQUIRE_MESSAGE(stopped2, "the processes did not all exit after rank 0 was killed");
  const std::vector<int> codes2 = exit_codes(job.output(), 2);
  REQUIRE(codes2.size() == 3);
  CHECK(codes2[0] == 137);
  CHECK(codes2[1] != 0);
  CHECK(codes2[2] != 0);
  for (int k = 1; k < 3; ++k) CHECK(contains(node_log(op, k, 2), "dtrain: error: "));
  CHECK(second_stop <= kHeartbeatTimeout);

  // Attempt 3 resumes from the later checkpoint and finishes.
  auto rc = job.wait(300s);
  REQUIRE(rc.has_value());
  CHECK(*rc == 0);
  CHECK(contains(job.output(), "attempt 3 exit codes: 0 0 0"));
  const std::string third = node_log(op, 0, 3);
  REQUIRE(contains(third, "resumed from step "));
  const int k2 = std::atoi(third.c_str() + third.find("resumed from step ") + 18);
  CHECK(k2 >= k1 + 10);
  std::vector<int64_t> steps;
  for (const auto& [s, l] : metric_losses(run_dir)) steps.push_back(s);
  std::vector<int64_t> want;
  for (int s = 1; s <= kSteps; ++s) want.push_back(s);
  CHECK(steps == want);
  check_same_as_launch(*e, run_dir);

  // The platform brings the job back on 2 nodes: the checkpoint written by 3 ranks is
  // resharded, and training goes on from step 40.
  Operator two = write_operator(*e, Flavour::TORCHRUN, "two-nodes", run_dir, 1, 2,
                                {"--set", fmt::format("training.max_steps={}", kSteps + 10)});
  auto r2 = run({"/bin/bash", two.script}, {}, 300s);
  INFO("2-node operator output:\n" << r2.out << "\nprocess logs:\n" << all_logs(two, 1));
  REQUIRE(!r2.timed_out);
  CHECK(r2.rc == 0);
  CHECK(contains(r2.out, "attempt 1 exit codes: 0 0"));
  CHECK(contains(node_log(two, 0, 1), fmt::format("resumed from step {} (checkpoints/step{}, saved at world size 3 "
                                                  "stage 0)",
                                                  kSteps, kSteps)));
  CHECK(contains(node_log(two, 0, 1), "dtrain run: 2 rank(s) train on cpu"));
  steps.clear();
  for (const auto& [s, l] : metric_losses(run_dir)) steps.push_back(s);
  for (int s = kSteps + 1; s <= kSteps + 10; ++s) want.push_back(s);
  CHECK(steps == want);

  // What `dtrain status` reads from the record rank 0 kept: 4 rounds, the 2 failures
  // with their causes, finished.
  auto st = run({e->bin, "status", run_dir}, {}, 30s);
  INFO("dtrain status:\n" << st.out);
  CHECK(st.rc == 0);
  CHECK(contains(st.out, "state      finished"));
  CHECK(contains(st.out, "restarts   3"));
  CHECK(contains(st.out, "  round 0 failed "));
  CHECK(contains(st.out, "  round 1 failed "));
  CHECK(contains(st.out, "[exit code "));

  MESSAGE(
      fmt::format("kill -9 of rank 2: all processes out {:.2f} s later, resumed from step {}; kill -9 of rank 0 "
                  "(the store's host): all out {:.2f} s later, resumed from step {} (heartbeat timeout {:.0f} s)",
                  first_stop, k1, second_stop, k2, kHeartbeatTimeout));
}

TEST_CASE("dtrain run --nproc-per-node 2 on this host (torchrun's node variables): both local ranks train") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) skip("$DTRAIN_BIN is not set or not executable (run through ctest)");
  TempDir dir("dtrain-run-nproc");
  REQUIRE(!dir.path().empty());
  const std::string token = dir.path() + "/token";
  std::ofstream(token) << "local-test-token-0123456789abcdef\n";
  const int port = free_port();
  auto r = run(
      {bin, "run", "--nproc-per-node", "2", "--output-dir", dir.path() + "/run", "--set", "training.max_steps=4",
       "--set", "training.save_steps=2", "--set", "steps_per_print=1", "--set",
       "cluster.rendezvous.token_file=" + token},
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}}, 180s);
  INFO("output:\n" << r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "node 0 of 1 from torchrun (RANK=0 WORLD_SIZE=1): starting 2 local rank(s)"));
  CHECK(contains(r.out, "[rank1] "));
  CHECK(contains(r.out, "dtrain run: rank 1 of 2 (local rank 1 of 2, node 0) placed by torchrun"));
  CHECK(contains(r.out, "[rank0] [dtrain host="));
  CHECK(contains(r.out, "dtrain run: 2 rank(s) train on cpu, collectives: gloo"));
  CHECK(metric_losses(dir.path() + "/run").size() == 4);
  CHECK(std::filesystem::exists(dir.path() + "/run/final/model.safetensors"));
}
