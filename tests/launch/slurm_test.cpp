// Slurm launching: per-node count lists, GPU counts, the allocation from SLURM_*
// variables, the hostfile and placement it implies, the srun command line, and the
// spawner end to end through a stand-in srun that runs the step's command locally.
#include "launch/slurm.h"

#include "core/error.h"
#include "launch/placement.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace dtrain::launch;
using Env = std::map<std::string, std::string>;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::ConfigError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("slurm: per-node count lists") {
  CHECK(slurm_counts_expand("2(x3),1", "V") == std::vector<int>{2, 2, 2, 1});
  CHECK(slurm_counts_expand("8", "V") == std::vector<int>{8});
  CHECK(slurm_counts_expand("72(x2)", "V") == std::vector<int>{72, 72});
  CHECK(slurm_counts_expand("1,4(x1),2", "V") == std::vector<int>{1, 4, 2});
  for (const char* bad : {"", "2,", ",2", "0", "-1", "2(x0)", "2(3)", "2(x3", "2(x)", "x", "2(x3)4", "2 (x3)"}) {
    CAPTURE(std::string(bad));
    std::string msg = error_of([&] { slurm_counts_expand(bad, "SLURM_TASKS_PER_NODE"); });
    CHECK(msg.find("SLURM_TASKS_PER_NODE='") != std::string::npos);
  }
}

TEST_CASE("slurm: GPU counts") {
  CHECK(slurm_gpus_parse("8", "V") == 8);
  CHECK(slurm_gpus_parse("a100:4", "V") == 4);
  CHECK(slurm_gpus_parse("a100:4,v100:2", "V") == 6);
  CHECK(slurm_gpus_parse("0", "V") == 0);
  CHECK(error_of([] { slurm_gpus_parse("a100", "SLURM_GPUS_PER_NODE"); }).find("not a GPU count") != std::string::npos);
}

TEST_CASE("slurm: allocation from the environment") {
  Env env{{"SLURM_JOB_ID", "4242"},
          {"SLURM_JOB_NODELIST", "gpu[01-03],login-x"},
          {"SLURM_TASKS_PER_NODE", "2(x3),1"},
          {"SLURM_JOB_CPUS_PER_NODE", "64(x2),32(x2)"},
          {"SLURM_GPUS_PER_NODE", "a100:4"}};
  SlurmAllocation a = slurm_allocation_from_env(env);
  CHECK(a.job_id == "4242");
  CHECK(a.nodes == std::vector<std::string>{"gpu01", "gpu02", "gpu03", "login-x"});
  CHECK(a.tasks_per_node == std::vector<int>{2, 2, 2, 1});
  CHECK(a.cpus_per_node == std::vector<int>{64, 64, 32, 32});
  CHECK(a.gpus_per_node == 4);

  // GPUS_ON_NODE wins over GPUS_PER_NODE; SLURM_JOB_GPUS counts ids; NTASKS_PER_NODE fills in.
  CHECK(slurm_allocation_from_env({{"SLURM_NODELIST", "n1"}, {"SLURM_GPUS_ON_NODE", "2"}, {"SLURM_GPUS_PER_NODE", "8"}})
            .gpus_per_node == 2);
  CHECK(slurm_allocation_from_env({{"SLURM_NODELIST", "n1"}, {"SLURM_JOB_GPUS", "0,1,2"}}).gpus_per_node == 3);
  auto b = slurm_allocation_from_env({{"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_NTASKS_PER_NODE", "3"}});
  CHECK(b.tasks_per_node == std::vector<int>{3, 3});
  CHECK(b.gpus_per_node == 0);

  CHECK(error_of([] { slurm_allocation_from_env({}); }).find("not inside a Slurm allocation") != std::string::npos);
  CHECK(error_of([] {
          slurm_allocation_from_env({{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}});
        }).find("does not match the 3 node(s)") != std::string::npos);
  CHECK(error_of([] {
          slurm_allocation_from_env({{"SLURM_JOB_NODELIST", "n[1-"}});
        }).find("never closed") != std::string::npos);
  CHECK(error_of([] {
          slurm_allocation_from_env({{"SLURM_JOB_NODELIST", "n1"}, {"SLURM_NTASKS_PER_NODE", "x"}});
        }).find("SLURM_NTASKS_PER_NODE='x'") != std::string::npos);
}

TEST_CASE("slurm: hostfile and placement") {
  SlurmAllocation a;
  a.nodes = {"n1", "n2", "n3"};
  a.tasks_per_node = {2, 1, 3};
  auto hf = slurm_hostfile(a);
  CHECK(hf.path == "SLURM_JOB_NODELIST=n[1-3]");
  REQUIRE(hf.hosts.size() == 3);
  CHECK(hf.hosts[2].slots == 3);
  CHECK(hf.total_slots() == 6);
  Plan p = plan_placement(hf, "n1", 29500);
  CHECK(p.world_size == 6);
  CHECK(p.nodes[1].first_rank == 2);
  CHECK(p.nodes[2].cuda_visible_devices == "0,1,2");

  a.gpus_per_node = 8;  // GPUs decide the slots when Slurm knows them
  auto g = slurm_hostfile(a);
  CHECK(g.total_slots() == 24);
  a.gpus_per_node = 0;
  a.tasks_per_node.clear();
  CHECK(slurm_hostfile(a).total_slots() == 3);
}

TEST_CASE("slurm: srun command line") {
  NodeCommand cmd;
  cmd.argv = {"/opt/dtrain", "agent", "--job-id", "j 1"};
  cmd.env = {{"A", "it's"}};
  cmd.workdir = "/scratch/run";
  SrunOptions o;
  o.cpus = 64;
  o.gpus = 4;
  o.extra = {"--mpi=none"};
  auto argv = slurm_srun_argv("gpu02", 1, cmd, o);
  std::vector<std::string> expected{"srun",
                                    "--nodes=1",
                                    "--ntasks=1",
                                    "--nodelist=gpu02",
                                    "--export=ALL",
                                    "--unbuffered",
                                    "--overlap",
                                    "--job-name=dtrain-node1",
                                    "--cpus-per-task=64",
                                    "--gres=gpu:4",
                                    "--mem=0",
                                    "--mpi=none",
                                    "/bin/sh",
                                    "-c",
                                    cmd.shell_line()};
  CHECK(argv == expected);
  auto plain = slurm_srun_argv("n1", 0, cmd, SrunOptions{});
  CHECK(std::find(plain.begin(), plain.end(), "--gres=gpu:4") == plain.end());
  CHECK(plain[plain.size() - 3] == "/bin/sh");
}

TEST_CASE("slurm: the spawner runs each agent through srun") {
  fs::path dir = fs::temp_directory_path() / ("dtrain-slurm-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A stand-in srun: records its options, then runs the step's command here.
  const fs::path fake = dir / "srun";
  {
    std::ofstream f(fake);
    f << "#!/bin/sh\n"
         "while [ \"$1\" != /bin/sh ]; do echo \"$1\" >> '"
      << (dir / "args").string()
      << "'; shift; done\n"
         "exec \"$@\"\n";
  }
  ::chmod(fake.c_str(), 0755);

  SlurmAllocation a;
  a.nodes = {"nodeA", "nodeB"};
  a.tasks_per_node = {1, 1};
  a.cpus_per_node = {4, 8};
  Plan plan = plan_placement(slurm_hostfile(a), "nodeA", 29500);
  NodeSpawner spawn = node_spawner_slurm(a, fake.string());

  NodeCommand cmd;
  cmd.argv = {"/bin/sh", "-c", "read tok; echo \"token=$tok node=$NODE\""};
  cmd.env = {{"NODE", "B"}};
  std::mutex mu;
  std::vector<std::string> lines;
  auto proc = spawn(plan.nodes[1], cmd, "secret\n", [&](Stream, std::string_view l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(l);
  });
  auto st = proc->wait_for(std::chrono::seconds(20));
  REQUIRE(st);
  CHECK(st->success());
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(lines == std::vector<std::string>{"token=secret node=B"});
  }
  std::ifstream args(dir / "args");
  std::string all((std::istreambuf_iterator<char>(args)), std::istreambuf_iterator<char>());
  CHECK(all.find("--nodelist=nodeB\n") != std::string::npos);
  CHECK(all.find("--cpus-per-task=8\n") != std::string::npos);
  CHECK(all.find("--job-name=dtrain-node1\n") != std::string::npos);
  CHECK(all.find("--gres") == std::string::npos);
  proc.reset();
  fs::remove_all(dir);
}
