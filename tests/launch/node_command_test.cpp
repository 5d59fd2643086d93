// Node command: argv/env built from a plan, the sh line run through /bin/sh -c delivering
// hostile values byte-exact, and the AgentArgs argv round-trip and rejections.
#include "launch/node_command.h"

#include "config/host_filter.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <algorithm>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>  // environ (GNU)

#include <cstdlib>
#include <string>

using namespace dtrain;
using namespace dtrain::config;
using namespace dtrain::launch;

namespace {

struct ShResult {
  int status = -1;
  std::string out;
};

// Runs `/bin/sh -c line` and returns its exit status and stdout; killed after 10 s.
ShResult sh_run(const std::string& line) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  const char* args[] = {"/bin/sh", "-c", line.c_str(), nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/bin/sh", &fa, nullptr, const_cast<char**>(args), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  REQUIRE(rc == 0);
  ShResult r;
  char buf[4096];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) {
      kill(pid, SIGKILL);
      FAIL_CHECK("sh -c did not finish within 10 s: " << line);
      break;
    }
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  waitpid(pid, &r.status, 0);
  return r;
}

const std::string HOSTILE =
    "a b  'single' \"double\" $HOME ${PATH} `id` $(id) \\ \\\\ \\n "
    "line1\nline2\n\ttab ; & | < > * ? [x] ~ # ! % ^ { } = é\x01\x7f end\n";

Plan two_node_plan() {
  Hostfile hf = hostfile_parse("n1 slots=4\nroot@n2 slots=2 port=2222\n", "h");
  return plan_placement(hostfile_select(hf, {.include = "n1:1,3@n2"}), "10.0.0.1", 29500);
}

LaunchSpec basic_spec() {
  LaunchSpec s;
  s.job_id = "job-42";
  s.round = 3;
  s.workdir = "/work/dir";
  s.dtrain_path = "/opt/dtrain/bin/dtrain";
  s.run_dir = "/shared/runs/job-42";
  s.forward_prefixes = {"NCCL_", "HF_"};
  s.env_set = {{"OMP_NUM_THREADS", "4"}, {"NCCL_DEBUG", "WARN"}};
  s.config_path = "/shared/runs/job-42/config.yaml";
  s.mode = "train";
  s.rank_args = {"--steps", "10"};
  return s;
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

}  // namespace

// ----------------------------------------------------------------------------
// Quoting through a real shell

TEST_CASE("shell_quote") {
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("abc") == "'abc'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
}

TEST_CASE("shell_line: env values arrive byte-exact through /bin/sh -c") {
  NodeCommand cmd;
  cmd.env = {{"V1", HOSTILE}, {"V2", ""}, {"V3", "x=y=z"}, {"V4", "'"}, {"V5", "\\"}};
  for (const auto& [name, value] : cmd.env) {
    CAPTURE(name);
    cmd.argv = {"/usr/bin/printenv", name};
    ShResult r = sh_run(cmd.shell_line());
    CHECK(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 0);
    CHECK(r.out == value + "\n");
  }
}

TEST_CASE("shell_line: argv words and workdir arrive byte-exact") {
  char tmpl[] = "/tmp/dtrain_nc_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  std::string dir = std::string(tmpl) + "/it's a $dir \\ \"x\"\nnext";
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);

  NodeCommand cmd;
  cmd.workdir = dir;
  cmd.env = {{"DTRAIN_T", "1"}};
  // printf '%s\0' "$@" then the cwd: every argument NUL-terminated.
  cmd.argv = {"/bin/sh", "-c", "printf '%s\\0' \"$@\"; pwd", "sh", HOSTILE, "", "--", "-n", "'"};
  ShResult r = sh_run(cmd.shell_line());
  CHECK(WEXITSTATUS(r.status) == 0);
  std::string expect = HOSTILE + '\0' + "" + '\0' + "--" + '\0' + "-n" + '\0' + "'" + '\0' + dir + "\n";
  CHECK(r.out == expect);

  // Only the listed workdir matters: a failing cd must stop the command.
  cmd.workdir = std::string(tmpl) + "/missing";
  cmd.argv = {"/bin/echo", "ran"};
  ShResult miss = sh_run("exec 2>/dev/null; " + cmd.shell_line());
  CHECK(WEXITSTATUS(miss.status) != 0);
  CHECK(miss.out.empty());

  rmdir(dir.c_str());
  rmdir(tmpl);
}

TEST_CASE("shell_line: format and rejections") {
  NodeCommand cmd;
  cmd.argv = {"dtrain", "agent"};
  cmd.env = {{"A", "1"}};
  CHECK(cmd.shell_line() == "exec env -- 'A=1' 'dtrain' 'agent'");
  cmd.workdir = "/w d";
  CHECK(cmd.shell_line() == "cd '/w d' && exec env -- 'A=1' 'dtrain' 'agent'");
  cmd.workdir = "-odd";
  CHECK(cmd.shell_line() == "cd './-odd' && exec env -- 'A=1' 'dtrain' 'agent'");

  NodeCommand bad = cmd;
  bad.argv = {"/opt/a=b/dtrain"};
  CHECK_THROWS_AS(bad.shell_line(), ConfigError);
  bad = cmd;
  bad.env["BAD-NAME"] = "x";
  CHECK_THROWS_AS(bad.shell_line(), ConfigError);
  bad = cmd;
  bad.argv.clear();
  CHECK_THROWS_AS(bad.shell_line(), InternalError);
}

// ----------------------------------------------------------------------------
// node_command_build

TEST_CASE("node_command_build: argv, forwarded env, overrides and plan variables") {
  Plan plan = two_node_plan();
  std::map<std::string, std::string> launcher_env = {
      {"NCCL_IB_DISABLE", "1"}, {"NCCL_DEBUG", "INFO"},   {"HF_HOME", "/data/hf cache"}, {"HOME", "/home/me"},
      {"PATH", "/usr/bin"},     {"MASTER_ADDR", "wrong"}, {"HF_BAD-NAME", "x"},          {"XNCCL_Y", "no"},
  };
  LaunchSpec spec = basic_spec();
  spec.env_set["WORLD_SIZE"] = "999";  // the plan's value wins

  NodeCommand c1 = node_command_build(plan, 1, spec, launcher_env);
  CHECK(c1.workdir == "/work/dir");
  std::map<std::string, std::string> expect_env = {
      {"DTRAIN_JOB_ID", "job-42"},
      {"HF_HOME", "/data/hf cache"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29500"},
      {"NCCL_DEBUG", "WARN"},
      {"NCCL_IB_DISABLE", "1"},
      {"NNODES", "2"},
      {"NODE_RANK", "1"},
      {"OMP_NUM_THREADS", "4"},
      {"WORLD_SIZE", "4"},
  };
  CHECK(c1.env == expect_env);

  std::vector<std::string> expect_argv = {"/opt/dtrain/bin/dtrain",
                                          "agent",
                                          "--job-id",
                                          "job-42",
                                          "--round",
                                          "3",
                                          "--node-rank",
                                          "1",
                                          "--nnodes",
                                          "2",
                                          "--world-size",
                                          "4",
                                          "--first-rank",
                                          "2",
                                          "--local-world-size",
                                          "2",
                                          "--devices",
                                          "0,1",
                                          "--master-addr",
                                          "10.0.0.1",
                                          "--master-port",
                                          "29500",
                                          "--run-dir",
                                          "/shared/runs/job-42",
                                          "--mode",
                                          "train",
                                          "--config",
                                          "/shared/runs/job-42/config.yaml",
                                          "--",
                                          "--steps",
                                          "10"};
  CHECK(c1.argv == expect_argv);

  NodeCommand c0 = node_command_build(plan, 0, spec, launcher_env);
  AgentArgs a0 = agent_args_parse({c0.argv.begin() + 2, c0.argv.end()});
  CHECK(a0.node_rank == 0);
  CHECK(a0.first_rank == 0);
  CHECK(a0.local_world_size == 2);
  CHECK(a0.devices == std::vector<int>{1, 3});
  CHECK(a0.world_size == 4);
  CHECK(a0.rank_args == spec.rank_args);
  CHECK(c0.env.at("NODE_RANK") == "0");
}

TEST_CASE("node_command_build: the env reaches a real process") {
  Plan plan = two_node_plan();
  LaunchSpec spec = basic_spec();
  spec.workdir = "";
  spec.env_set["DTRAIN_HOSTILE"] = HOSTILE;
  NodeCommand cmd = node_command_build(plan, 1, spec, {{"NCCL_SOCKET_IFNAME", "eth0"}});
  for (const auto& [name, value] : cmd.env) {
    CAPTURE(name);
    NodeCommand probe = cmd;
    probe.argv = {"/usr/bin/printenv", name};
    CHECK(sh_run(probe.shell_line()).out == value + "\n");
  }
}

TEST_CASE("node_command_build: rejections") {
  Plan plan = two_node_plan();
  auto build = [&](LaunchSpec s) { return node_command_build(plan, 0, s, {}); };
  LaunchSpec s = basic_spec();
  s.job_id = "";
  CHECK_THROWS_AS(build(s), ConfigError);
  s = basic_spec();
  s.job_id = "a b";
  CHECK_THROWS_AS(build(s), ConfigError);
  s = basic_spec();
  s.mode = "eval";
  CHECK_THROWS_AS(build(s), ConfigError);
  s = basic_spec();
  s.run_dir = "";
  CHECK_THROWS_AS(build(s), ConfigError);
  s = basic_spec();
  s.round = -1;
  CHECK_THROWS_AS(build(s), ConfigError);
  s = basic_spec();
  s.env_set["1BAD"] = "x";
  CHECK_THROWS_AS(build(s), ConfigError);
  s = basic_spec();
  s.dtrain_path = "/a=b/dtrain";
  CHECK_THROWS_AS(build(s), ConfigError);
  CHECK_THROWS_AS(node_command_build(plan, 2, basic_spec(), {}), InternalError);
  CHECK_THROWS_AS(node_command_build(plan, -1, basic_spec(), {}), InternalError);
}

TEST_CASE("environ_map reads the process environment") {
  setenv("DTRAIN_NC_TEST", "a b\nc", 1);
  auto env = environ_map();
  CHECK(env.at("DTRAIN_NC_TEST") == "a b\nc");
  unsetenv("DTRAIN_NC_TEST");
}

// ----------------------------------------------------------------------------
// AgentArgs

TEST_CASE("agent args: round-trip") {
  AgentArgs a;
  a.job_id = "j.1_x-2";
  a.round = 7;
  a.node_rank = 2;
  a.nnodes = 3;
  a.world_size = 14;
  a.first_rank = 12;
  a.local_world_size = 2;
  a.devices = {5, 1};
  a.master_addr = "node1";
  a.master_port = 65535;
  a.run_dir = "/runs/it's here";
  a.mode = "bench";
  CHECK(agent_args_parse(agent_args_to_argv(a)) == a);

  a.config_path = "/runs/--config";
  a.rank_args = {"--", "--job-id", "x", "", "a b"};
  CHECK(agent_args_parse(agent_args_to_argv(a)) == a);

  // --device travels when it is not the default (cpu).
  for (const char* d : {"cuda", "auto"}) {
    AgentArgs b = a;
    b.device = d;
    std::vector<std::string> words = agent_args_to_argv(b);
    CHECK(std::find(words.begin(), words.end(), "--device") != words.end());
    CHECK(agent_args_parse(words) == b);
  }

  // --key=value is accepted and order does not matter.
  std::vector<std::string> v = agent_args_to_argv(a);
  std::vector<std::string> eq_form = {"--mode=bench", "--devices=5,1"};
  for (size_t i = 0; i < v.size() && v[i] != "--"; i += 2)
    if (v[i] != "--mode" && v[i] != "--devices") {
      eq_form.push_back(v[i]);
      eq_form.push_back(v[i + 1]);
    }
  eq_form.push_back("--");
  eq_form.insert(eq_form.end(), a.rank_args.begin(), a.rank_args.end());
  CHECK(agent_args_parse(eq_form) == a);
}

TEST_CASE("agent args: rejections name the option") {
  AgentArgs good;
  good.job_id = "j";
  good.nnodes = 2;
  good.node_rank = 1;
  good.world_size = 4;
  good.first_rank = 2;
  good.local_world_size = 2;
  good.devices = {0, 1};
  good.master_addr = "m";
  good.master_port = 29500;
  good.run_dir = "/r";
  const std::vector<std::string> base = agent_args_to_argv(good);
  REQUIRE(agent_args_parse(base) == good);

  auto with = [&](const std::string& opt, const std::string& value) {
    std::vector<std::string> v = base;
    for (size_t i = 0; i < v.size(); i += 2)
      if (v[i] == opt) v[i + 1] = value;
    return v;
  };
  auto without = [&](const std::string& opt) {
    std::vector<std::string> v;
    for (size_t i = 0; i < base.size(); i += 2)
      if (base[i] != opt) v.insert(v.end(), {base[i], base[i + 1]});
    return v;
  };
  struct Case {
    std::vector<std::string> argv;
    const char* mentions;
  };
  std::vector<Case> cases = {
      {with("--round", "-1"), "--round"},
      {with("--round", "x"), "--round"},
      {with("--round", "99999999999"), "--round"},
      {with("--node-rank", "2"), "--node-rank"},
      {with("--nnodes", "0"), "--nnodes"},
      {with("--world-size", "3"), "--world-size"},
      {with("--first-rank", "3"), "--world-size"},
      {with("--local-world-size", "1"), "--devices"},
      {with("--local-world-size", "3"), "--world-size"},
      {with("--devices", "0,0"), "twice"},
      {with("--devices", "0,,1"), "--devices"},
      {with("--devices", ""), "--devices"},
      {with("--devices", "0,1,2"), "--devices"},
      {with("--master-port", "0"), "--master-port"},
      {with("--master-port", "65536"), "--master-port"},
      {with("--master-addr", ""), "--master-addr"},
      {with("--run-dir", ""), "--run-dir"},
      {with("--mode", "eval"), "--mode"},
      {[&] {
         auto v = base;
         v.insert(v.end(), {"--device", "gpu"});
         return v;
       }(),
       "--device"},
      {with("--job-id", "a b"), "--job-id"},
      {with("--job-id", ""), "--job-id"},
      {without("--devices"), "--devices is required"},
      {without("--job-id"), "--job-id is required"},
      {{}, "required"},
  };
  std::vector<std::string> dup = base;
  dup.insert(dup.end(), {"--round", "1"});
  cases.push_back({dup, "given twice"});
  std::vector<std::string> unknown = base;
  unknown.insert(unknown.end(), {"--token", "secret"});
  cases.push_back({unknown, "unknown option \"--token\""});
  std::vector<std::string> positional = base;
  positional.push_back("stray");
  cases.push_back({positional, "unexpected argument"});
  std::vector<std::string> dangling = base;
  dangling.push_back("--config");
  cases.push_back({dangling, "--config needs a value"});

  for (const Case& c : cases) {
    std::string joined;
    for (const std::string& w : c.argv) joined += w + " ";
    CAPTURE(joined);
    try {
      agent_args_parse(c.argv);
      FAIL_CHECK("accepted");
    } catch (const UsageError& e) {
      CHECK(contains(e.what(), c.mentions));
    }
  }
}
