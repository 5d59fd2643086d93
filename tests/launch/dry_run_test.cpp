// Dry-run report: table, one section per node with its destination, the exact sh line
// and one escaped K=V line per variable.
#include "launch/dry_run.h"

#include "config/hostfile.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <sstream>

using namespace dtrain;
using namespace dtrain::config;
using namespace dtrain::launch;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("dry_run_report: heterogeneous hostfile") {
  Hostfile hf = hostfile_load("hostfiles/hetero");
  Plan plan = plan_placement(hf, "node1", 29500);
  LaunchSpec spec;
  spec.job_id = "j1";
  spec.run_dir = "/runs/j1";
  spec.forward_prefixes = {"NCCL_"};
  spec.env_set = {{"MULTI", "line1\nline2"}};
  std::map<std::string, std::string> env = {{"NCCL_DEBUG", "INFO"}, {"SECRETLESS", "no"}};
  std::string r = dry_run_report(plan, spec, env);
  INFO(r);

  CHECK(contains(r, plan_format_table(plan)));
  CHECK(contains(r, "node 0 (node1):\n"));
  CHECK(contains(r, "node 1 (node2):\n"));
  CHECK(contains(r, "node 2 (ubuntu@node3:2222):\n"));
  for (int n = 0; n < 3; ++n) {
    NodeCommand cmd = node_command_build(plan, n, spec, env);
    CHECK(contains(r, "  command: " + cmd.shell_line() + "\n"));
  }
  CHECK(contains(r, "    NCCL_DEBUG=INFO\n"));
  CHECK(contains(r, "    MULTI=line1\\nline2\n"));
  CHECK(contains(r, "    NODE_RANK=2\n"));
  CHECK(contains(r, "    WORLD_SIZE=14\n"));
  CHECK(!contains(r, "SECRETLESS"));

  // Every env line of every node is a single K=V line.
  std::istringstream in(r);
  std::string line;
  int env_lines = 0;
  bool in_env = false;
  while (std::getline(in, line)) {
    if (line == "  env:") {
      in_env = true;
      continue;
    }
    if (in_env && line.rfind("    ", 0) == 0) {
      ++env_lines;
      CHECK(line.find('=') != std::string::npos);
    } else {
      in_env = false;
    }
  }
  CHECK(env_lines == 3 * 8);  // NCCL_DEBUG, MULTI and the six plan variables per node
}

TEST_CASE("dry_run_report: bad spec is a ConfigError") {
  Plan plan = plan_placement(hostfile_localhost(1), "localhost", 29500);
  LaunchSpec spec;
  spec.job_id = "j";
  spec.run_dir = "/r";
  spec.mode = "nope";
  CHECK_THROWS_AS(dry_run_report(plan, spec, {}), ConfigError);
}
