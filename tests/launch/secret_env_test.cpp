// cluster.env.set (secrets) in the node command (issue 33 item 13): never in the sh line or
// the agent's argv, always in the stdin payload, byte-exact through its hex encoding, and
// the plan's variables and dtrain's own settings still win over it.
#include "launch/node_command.h"

#include "config/host_filter.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <string>

using namespace dtrain;
using namespace dtrain::launch;

namespace {

Plan one_remote_node() {
  config::Hostfile hf = config::hostfile_parse("root@n2 slots=2\n", "h");
  return plan_placement(hf, "10.0.0.1", 29500);
}

LaunchSpec spec_with_secret(const std::string& value) {
  LaunchSpec s;
  s.job_id = "job-7";
  s.run_dir = "/shared/run";
  s.dtrain_path = "/opt/dtrain";
  s.forward_prefixes = {"HF_"};
  s.env_set = {{"DTRAIN_HEARTBEAT_INTERVAL", "1"}};
  s.secret_env = {{"HF_TOKEN", value}, {"WORLD_SIZE", "999"}, {"DTRAIN_HEARTBEAT_INTERVAL", "99"}};
  return s;
}

// The secret lines of a payload, parsed back as the agent does.
std::map<std::string, std::string> parse_payload(const std::string& payload, std::string* token) {
  std::map<std::string, std::string> out;
  size_t at = payload.find('\n');
  *token = payload.substr(0, at);
  for (++at; at < payload.size();) {
    const size_t end = payload.find('\n', at);
    const std::string line = payload.substr(at, end - at);
    at = end + 1;
    if (line.empty()) break;
    out.insert(agent_env_line_parse(line));
  }
  return out;
}

}  // namespace

TEST_CASE("secret env: not in the sh line or argv, in the stdin payload byte-exact") {
  const std::string value = "hf_s3cr3t 'q' \"d\" $HOME\nline2\t\x01\xff=";
  const NodeCommand cmd =
      node_command_build(one_remote_node(), 0, spec_with_secret(value), {{"HF_TOKEN", "forwarded"}});
  const std::string line = cmd.shell_line();
  CAPTURE(line);
  CHECK(line.find("hf_s3cr3t") == std::string::npos);
  CHECK(line.find("HF_TOKEN") == std::string::npos);  // the forwarded one is overridden, so not sent either
  for (const auto& a : cmd.argv) CHECK(a.find("s3cr3t") == std::string::npos);
  CHECK(cmd.env.count("HF_TOKEN") == 0);
  // The plan's WORLD_SIZE and dtrain's own interval win over cluster.env.set.
  CHECK(cmd.env.at("WORLD_SIZE") == "2");
  CHECK(cmd.env.at("DTRAIN_HEARTBEAT_INTERVAL") == "1");
  CHECK(cmd.secret_env == std::map<std::string, std::string>{{"HF_TOKEN", value}});

  const std::string payload = agent_stdin_payload("tok-123", cmd.secret_env);
  CHECK(payload.find("s3cr3t") == std::string::npos);  // hex: not even the payload shows it in clear
  std::string token;
  CHECK(parse_payload(payload, &token) == cmd.secret_env);
  CHECK(token == "tok-123");
  CHECK(payload.size() >= 2);
  CHECK(payload.substr(payload.size() - 2) == "\n\n");  // the block ends with an empty line
}

TEST_CASE("secret env: malformed stdin lines are usage errors") {
  CHECK_THROWS_AS(agent_env_line_parse("NOEQUALS"), UsageError);
  CHECK_THROWS_AS(agent_env_line_parse("1BAD=00"), UsageError);
  CHECK_THROWS_AS(agent_env_line_parse("A=0"), UsageError);
  CHECK_THROWS_AS(agent_env_line_parse("A=zz"), UsageError);
  CHECK(agent_env_line_parse("A=").second.empty());
  CHECK(agent_env_line_parse("A=41").second == "A");
}

TEST_CASE("secret env: a bad cluster.env.set name is a config error") {
  LaunchSpec s = spec_with_secret("x");
  s.secret_env["BAD-NAME"] = "v";
  CHECK_THROWS_AS(node_command_build(one_remote_node(), 0, s, {}), ConfigError);
}
