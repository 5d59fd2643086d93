// SSH spawner against real sshds: a 2-node cluster of network namespaces from
// scripts/test_cluster.sh (skipped with a message when not root or unsupported).
// Parallel runs, namespace identity, byte-exact env through a quoted shell line, stdin,
// host key policies (mismatch, unknown, accept-new, hashed, [host]:port), connect and
// auth errors, remote signals, terminate, a link cut mid-run, and an sshd on [::1] (IPv6).
#include "launch/ssh_spawner.h"

#include "core/error.h"

#include "line_collector.h"
#include "skip.h"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

using namespace dtrain::launch;
using dtrain::test::Lines;
using namespace std::chrono_literals;

namespace {

std::string quote(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command here; its stdout. No doctest macros: the cluster's destructor
// calls it after the tests, at exit.
std::string run_here(const std::string& command, int* rc = nullptr) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (rc) *rc = -1;
  if (!pipe) return out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = ::pclose(pipe);
  if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The test cluster: `up` once for the whole binary, `down` when the program ends.
class Cluster {
 public:
  Cluster() {
    if (::geteuid() != 0) {
      skip_ = "not root";
      return;
    }
    const char* source = std::getenv("DTRAIN_SOURCE_DIR");
    script_ = std::string(source ? source : ".") + "/scripts/test_cluster.sh";
    std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-ssh-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    int rc = 0;
    std::string log = run_here(script_ + " up 2 " + dir_ + " 2>&1", &rc);
    if (rc == 77) {
      skip_ = log;
      return;
    }
    up_ = true;  // from here `down` runs even when `up` half failed
    REQUIRE_MESSAGE(rc == 0, "test_cluster.sh up failed: " << log);
    std::istringstream env(read_file(dir_ + "/env"));
    for (std::string line; std::getline(env, line);) {
      auto eq = line.find('=');
      if (eq != std::string::npos) env_[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  ~Cluster() {
    if (up_) run_here(script_ + " down " + dir_ + " 2>&1");
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  bool usable() const { return skip_.empty(); }
  const std::string& skip_reason() const { return skip_; }
  const std::string& dir() const { return dir_; }
  const std::string& script() const { return script_; }
  std::string addr(int i) { return env_["NODE_" + std::to_string(i) + "_ADDR"]; }
  std::string host(int i) { return "root@" + addr(i); }
  SshOptions options() {
    SshOptions o;
    o.identity_file = env_["CLUSTER_IDENTITY"];
    o.known_hosts = env_["CLUSTER_KNOWN_HOSTS"];
    o.connect_timeout = 5s;
    o.keepalive_interval_s = 1;
    o.keepalive_count_max = 3;
    return o;
  }

 private:
  std::string script_, dir_, skip_;
  bool up_ = false;
  std::map<std::string, std::string> env_;
};

Cluster* cluster() {
  static std::unique_ptr<Cluster> instance = std::make_unique<Cluster>();
  if (!instance->usable()) {
    ::dtrain::test::skip_test("SSH tests skipped: " + instance->skip_reason());
    return nullptr;
  }
  return instance.get();
}

ExitStatus run_to_end(Process& p, std::chrono::milliseconds timeout = 20s) {
  auto status = p.wait_for(timeout);
  REQUIRE_MESSAGE(status.has_value(), p.where() << " did not end within the timeout");
  return *status;
}

std::string launch_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::LaunchError& e) {
    return e.what();
  }
  FAIL("expected a LaunchError");
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("commands run on every node in parallel with their output and exit codes") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines[2];
  std::vector<SshCommand> commands;
  for (int i = 0; i < 2; ++i)
    commands.push_back({c->host(i),
                        "echo out-" + std::to_string(i) + "; echo err-" + std::to_string(i) +
                            " >&2; hostname -I; exit " + std::to_string(3 + i),
                        "", lines[i].callback()});
  auto processes = spawn_ssh_parallel(commands, c->options());
  REQUIRE(processes.size() == 2);
  for (int i = 0; i < 2; ++i) {
    ExitStatus s = run_to_end(*processes[i]);
    CHECK(s.exited);
    CHECK(s.code == 3 + i);
    CHECK(!s.connection_lost);
    CHECK(processes[i]->where() == c->addr(i));
    auto out = lines[i].of(Stream::STDOUT);
    REQUIRE(out.size() == 2);
    CHECK(out[0] == "out-" + std::to_string(i));
    // The command really ran inside node i's namespace: its only address is node i's.
    CHECK(contains(out[1], c->addr(i)));
    CHECK(!contains(out[1], c->addr(1 - i)));
    CHECK(lines[i].of(Stream::STDERR) == std::vector<std::string>{"err-" + std::to_string(i)});
  }
}

TEST_CASE("environment values arrive byte-exact through a single-quoted shell line") {
  Cluster* c = cluster();
  if (!c) return;
  std::map<std::string, std::string> env = {
      {"DT_SPACE", "with  two spaces "},
      {"DT_QUOTES", "it's \"quoted\" 'single' ''"},
      {"DT_DOLLAR", "$HOME ${PATH} `id` $(id) \\ \\n !"},
      {"DT_NEWLINE", "line1\nline2\n"},
      {"DT_EMPTY", ""},
      {"DT_GLOB", "* ? [a-z] ~"},
  };
  std::string command;
  for (const auto& [key, value] : env) command += "export " + key + "=" + quote(value) + "; ";
  command += "exec env -0";
  Lines lines;
  auto p = spawn_ssh(c->host(0), c->options(), command, "", lines.callback());
  CHECK(run_to_end(*p).success());
  // env -0 ends entries with NUL, so joining the lines with '\n' restores the bytes.
  std::string all;
  for (const auto& line : lines.of(Stream::STDOUT)) all += line + "\n";
  all.pop_back();
  std::map<std::string, std::string> got;
  std::size_t begin = 0;
  while (begin < all.size()) {
    std::size_t end = all.find('\0', begin);
    if (end == std::string::npos) end = all.size();
    std::string entry = all.substr(begin, end - begin);
    std::size_t eq = entry.find('=');
    if (eq != std::string::npos) got[entry.substr(0, eq)] = entry.substr(eq + 1);
    begin = end + 1;
  }
  for (const auto& [key, value] : env) CHECK_MESSAGE(got[key] == value, key);
}

TEST_CASE("stdin data arrives and stdin stays open until close_stdin") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  auto p = spawn_ssh(c->host(1), c->options(), "read x; echo got:$x; if read y; then echo more:$y; else echo eof; fi",
                     "first line\n", lines.callback());
  REQUIRE(lines.wait_stdout(1));
  CHECK(lines.of(Stream::STDOUT)[0] == "got:first line");
  CHECK(!p->wait_for(300ms).has_value());  // the second read waits: no EOF was sent
  p->close_stdin();
  CHECK(run_to_end(*p).success());
  CHECK(lines.of(Stream::STDOUT) == std::vector<std::string>{"got:first line", "eof"});

  Lines big;
  std::string data(3 << 20, 'k');
  auto counter = spawn_ssh(c->host(0), c->options(), "wc -c", data, big.callback());
  counter->close_stdin();
  CHECK(run_to_end(*counter).success());
  REQUIRE(big.of(Stream::STDOUT).size() == 1);
  CHECK(std::stol(big.of(Stream::STDOUT)[0]) == (3 << 20));
}

TEST_CASE("remote exit codes and signals are reported") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  auto killed = spawn_ssh(c->host(0), c->options(), "echo before; kill -9 $$; echo after", "", lines.callback());
  ExitStatus s = run_to_end(*killed);
  CHECK(!s.exited);
  CHECK(s.signal == 9);
  CHECK(contains(s.describe(), "SIGKILL"));
  CHECK(lines.of(Stream::STDOUT) == std::vector<std::string>{"before"});

  auto partial = spawn_ssh(c->host(1), c->options(), "printf 'no newline'; exit 7", "", lines.callback());
  s = run_to_end(*partial);
  CHECK(s.exited);
  CHECK(s.code == 7);
  CHECK(lines.of(Stream::STDOUT).back() == "no newline");
}

TEST_CASE("terminate: stdin EOF ends a command that watches stdin; one that does not is abandoned") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  // Like the node agent: background work, stdin watched, cleanup on EOF.
  auto p = spawn_ssh(c->host(0), c->options(), "sleep 4242 & echo started; cat >/dev/null; kill $!; exit 5", "",
                     lines.callback());
  REQUIRE(lines.wait_stdout(1));
  p->terminate(5s);
  auto s = p->wait_for(0ms);
  REQUIRE(s.has_value());
  INFO(s->describe());
  CHECK(s->exited);
  CHECK(s->code == 5);
  Lines check;
  auto probe = spawn_ssh(c->host(0), c->options(), "pgrep -f '[s]leep 4242' || echo none", "", check.callback());
  CHECK(run_to_end(*probe).success());
  CHECK(check.of(Stream::STDOUT) == std::vector<std::string>{"none"});

  Lines deaf_lines;
  auto deaf = spawn_ssh(c->host(0), c->options(), "echo started; exec sleep 4243", "", deaf_lines.callback());
  REQUIRE(deaf_lines.wait_stdout(1));
  deaf->terminate(300ms);
  s = deaf->wait_for(0ms);
  REQUIRE(s.has_value());
  CHECK(s->exited);
  CHECK(s->code == 255);
  CHECK(!s->connection_lost);
  CHECK(contains(s->describe(), "did not exit after stdin EOF"));
  deaf.reset();
  auto cleanup = spawn_ssh(c->host(0), c->options(), "pkill -f '[s]leep 4243'; true", "", check.callback());
  CHECK(run_to_end(*cleanup).success());
}

TEST_CASE("host key policies") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  std::string dir = c->dir() + "/hostkeys";
  std::filesystem::create_directories(dir);
  std::string expected = run_here("ssh-keygen -l -E sha256 -f " + c->dir() + "/host_ed25519_key.pub | cut -d' ' -f2");
  expected.erase(expected.find_last_not_of("\n") + 1);
  REQUIRE(expected.rfind("SHA256:", 0) == 0);

  SUBCASE("a different key for the host is a mismatch, under strict and accept-new") {
    run_here("ssh-keygen -q -t ed25519 -N '' -f " + dir + "/other_key");
    std::string known = dir + "/known_mismatch";
    std::ofstream(known) << c->addr(0) << " " << read_file(dir + "/other_key.pub");
    SshOptions o = c->options();
    o.known_hosts = known;
    for (auto policy : {SshOptions::HostKeyPolicy::STRICT, SshOptions::HostKeyPolicy::ACCEPT_NEW}) {
      o.policy = policy;
      std::string error = launch_error([&] { spawn_ssh(c->host(0), o, "true", "", lines.callback()); });
      CHECK(contains(error, "HOST KEY MISMATCH"));
      CHECK(contains(error, c->addr(0)));
      CHECK(contains(error, known));
      CHECK(contains(error, expected));
      CHECK(contains(error, "ssh-ed25519"));
    }
  }
  SUBCASE("an unknown host is refused under strict and recorded under accept-new") {
    std::string known = dir + "/known_new";
    std::ofstream(known) << "# no entries yet\n";
    SshOptions o = c->options();
    o.known_hosts = known;
    std::string error = launch_error([&] { spawn_ssh(c->host(1), o, "true", "", lines.callback()); });
    CHECK(contains(error, "unknown host key"));
    CHECK(contains(error, c->addr(1)));
    CHECK(contains(error, known));
    CHECK(contains(error, expected));
    CHECK(contains(error, "ssh-keyscan"));
    CHECK(contains(error, "accept-new"));

    o.policy = SshOptions::HostKeyPolicy::ACCEPT_NEW;
    CHECK(run_to_end(*spawn_ssh(c->host(1), o, "true", "", lines.callback())).success());
    std::string text = read_file(known);
    CHECK(contains(text, c->addr(1) + " ssh-ed25519 "));
    // The recorded entry now satisfies strict checking; hashed (ssh-keygen -H) too.
    o.policy = SshOptions::HostKeyPolicy::STRICT;
    CHECK(run_to_end(*spawn_ssh(c->host(1), o, "true", "", lines.callback())).success());
    int rc = 0;
    run_here("ssh-keygen -H -f " + known + " >/dev/null 2>&1", &rc);
    REQUIRE(rc == 0);
    CHECK(!contains(read_file(known), c->addr(1)));
    CHECK(run_to_end(*spawn_ssh(c->host(1), o, "true", "", lines.callback())).success());
  }
  SUBCASE("a non-22 port uses the [host]:port form") {
    // A second sshd on node 0, port 2222.
    int rc = 0;
    std::string log = run_here(c->script() + " exec " + c->dir() + " 0 /usr/sbin/sshd -f " + c->dir() +
                                   "/sshd_config -o Port=2222 -o ListenAddress=" + c->addr(0) +
                                   ":2222 -o PidFile=" + dir + "/sshd-2222.pid 2>&1",
                               &rc);
    REQUIRE_MESSAGE(rc == 0, log);
    // sshd may still be setting up its listener when the daemonizing parent returns.
    run_here("bash -c 'for i in $(seq 100); do (exec 3<>/dev/tcp/" + c->addr(0) +
                 "/2222) 2>/dev/null && exit 0; sleep 0.05; done; exit 1'",
             &rc);
    REQUIRE(rc == 0);
    std::string known = dir + "/known_port";
    // The plain entry is for port 22 only in OpenSSH's reading, but libssh2 also
    // accepts it for other ports; an empty file shows the [host]:port entry is written.
    std::ofstream(known) << "";
    SshOptions o = c->options();
    o.known_hosts = known;
    o.port = 2222;
    o.policy = SshOptions::HostKeyPolicy::ACCEPT_NEW;
    Lines port_lines;
    auto p = spawn_ssh(c->host(0), o, "echo port-ok", "", port_lines.callback());
    CHECK(run_to_end(*p).success());
    CHECK(port_lines.of(Stream::STDOUT) == std::vector<std::string>{"port-ok"});
    CHECK(contains(read_file(known), "[" + c->addr(0) + "]:2222 ssh-ed25519 "));
    o.policy = SshOptions::HostKeyPolicy::STRICT;
    CHECK(run_to_end(*spawn_ssh(c->host(0), o, "true", "", lines.callback())).success());
  }
  SUBCASE("policy off connects without any known_hosts") {
    SshOptions o = c->options();
    o.known_hosts = dir + "/does-not-exist";
    o.policy = SshOptions::HostKeyPolicy::OFF;
    CHECK(run_to_end(*spawn_ssh(c->host(0), o, "true", "", lines.callback())).success());
    CHECK(!std::filesystem::exists(o.known_hosts));
  }
}

TEST_CASE("connection and authentication errors name the host or the file") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  SUBCASE("refused port") {
    SshOptions o = c->options();
    o.port = 1;
    std::string error = launch_error([&] { spawn_ssh(c->host(0), o, "true", "", lines.callback()); });
    CHECK(contains(error, c->addr(0)));
    CHECK(contains(error, "refused"));
  }
  SUBCASE("a port that accepts TCP but never speaks SSH times out") {
    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener, 4) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    SshOptions o = c->options();
    o.port = ntohs(addr.sin_port);
    o.connect_timeout = 700ms;
    std::string error = launch_error([&] { spawn_ssh("127.0.0.1", o, "true", "", lines.callback()); });
    ::close(listener);
    CHECK(contains(error, "127.0.0.1"));
    CHECK(contains(error, "timed out"));
  }
  SUBCASE("unresolvable host") {
    std::string error =
        launch_error([&] { spawn_ssh("root@no-such-host.invalid", c->options(), "true", "", lines.callback()); });
    CHECK(contains(error, "no-such-host.invalid"));
  }
  SUBCASE("missing identity file") {
    SshOptions o = c->options();
    o.identity_file = c->dir() + "/no_such_key";
    std::string error = launch_error([&] { spawn_ssh(c->host(0), o, "true", "", lines.callback()); });
    CHECK(contains(error, o.identity_file));
    CHECK(contains(error, "does not exist"));  // the input rule's words (core/input_file)
  }
  SUBCASE("garbage identity file") {
    SshOptions o = c->options();
    o.identity_file = c->dir() + "/garbage_key";
    std::ofstream(o.identity_file) << "this is not a key\n";
    std::string error = launch_error([&] { spawn_ssh(c->host(0), o, "true", "", lines.callback()); });
    CHECK(contains(error, o.identity_file));
  }
  SUBCASE("a valid key the node does not accept") {
    SshOptions o = c->options();
    o.identity_file = c->dir() + "/unauthorized_key";
    run_here("ssh-keygen -q -t ed25519 -N '' -f " + o.identity_file);
    std::string error = launch_error([&] { spawn_ssh(c->host(1), o, "true", "", lines.callback()); });
    CHECK(contains(error, o.identity_file));
    CHECK(contains(error, c->addr(1)));
    CHECK(contains(error, "authorized_keys"));
  }
  SUBCASE("parallel spawn collects every failure and names each host") {
    std::vector<SshCommand> commands = {{c->host(0), "sleep 30", "", lines.callback()},
                                        {"root@no-such-host.invalid", "true", "", lines.callback()}};
    std::string error = launch_error([&] { spawn_ssh_parallel(commands, c->options()); });
    CHECK(contains(error, "1 of 2 host(s)"));
    CHECK(contains(error, "no-such-host.invalid"));
  }
}

TEST_CASE("without an identity file: ssh-agent, then default keys, else a list of what was tried") {
  Cluster* c = cluster();
  if (!c) return;
  // HOME and SSH_AUTH_SOCK steer the fallbacks; restored afterwards.
  struct SavedEnv {
    std::map<std::string, std::optional<std::string>> saved;
    void set(const std::string& key, const char* value) {
      if (!saved.count(key)) {
        const char* old = std::getenv(key.c_str());
        saved[key] = old ? std::optional<std::string>(old) : std::nullopt;
      }
      if (value) ::setenv(key.c_str(), value, 1);
      else ::unsetenv(key.c_str());
    }
    ~SavedEnv() {
      for (auto& [key, value] : saved) {
        if (value) ::setenv(key.c_str(), value->c_str(), 1);
        else ::unsetenv(key.c_str());
      }
    }
  } env;
  std::string home = c->dir() + "/home";
  std::filesystem::create_directories(home + "/.ssh");
  env.set("HOME", home.c_str());
  env.set("SSH_AUTH_SOCK", nullptr);
  SshOptions o = c->options();
  std::string identity = o.identity_file;
  o.identity_file.clear();
  Lines lines;

  std::string error = launch_error([&] { spawn_ssh(c->host(0), o, "true", "", lines.callback()); });
  CHECK(contains(error, "SSH_AUTH_SOCK is not set"));
  CHECK(contains(error, c->addr(0)));
  CHECK(contains(error, "identity"));

  std::string sock = c->dir() + "/agent.sock";
  std::string agent = run_here("ssh-agent -s -a " + sock);
  auto at = agent.find("SSH_AGENT_PID=");
  REQUIRE(at != std::string::npos);
  int agent_pid = std::atoi(agent.c_str() + at + 14);
  REQUIRE(agent_pid > 0);
  int rc = 0;
  run_here("SSH_AUTH_SOCK=" + sock + " ssh-add " + identity + " 2>&1", &rc);
  CHECK(rc == 0);
  env.set("SSH_AUTH_SOCK", sock.c_str());
  CHECK(run_to_end(*spawn_ssh(c->host(0), o, "true", "", lines.callback())).success());
  ::kill(agent_pid, SIGTERM);

  // Agent gone: the default key file in ~/.ssh is used.
  env.set("SSH_AUTH_SOCK", nullptr);
  std::filesystem::copy_file(identity, home + "/.ssh/id_ed25519");
  CHECK(run_to_end(*spawn_ssh(c->host(1), o, "true", "", lines.callback())).success());
}

TEST_CASE("a node whose link goes down is reported lost within the keepalive bound") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  auto p = spawn_ssh(c->host(1), c->options(), "echo up; sleep 60", "", lines.callback());
  REQUIRE(lines.wait_stdout(1));
  int rc = 0;
  std::string log = run_here(c->script() + " link-down " + c->dir() + " 1 2>&1", &rc);
  REQUIRE_MESSAGE(rc == 0, log);
  // keepalive 1 s x 3: lost after ~3-4 s; 20 s is a generous bound, not a timing check.
  auto s = p->wait_for(20s);
  run_here(c->script() + " link-up " + c->dir() + " 1 2>&1");
  REQUIRE(s.has_value());
  CHECK(s->connection_lost);
  CHECK(s->exited);
  CHECK(s->code == 255);
  CHECK(!s->success());
  CHECK(contains(s->describe(), "SSH connection to " + c->addr(1) + " lost"));
  p.reset();  // destroying a lost session does not wait on the dead peer
  // The node is reachable again after link-up.
  Lines again;
  auto q = spawn_ssh(c->host(1), c->options(), "echo back", "", again.callback());
  CHECK(run_to_end(*q).success());
  CHECK(again.of(Stream::STDOUT) == std::vector<std::string>{"back"});
}

TEST_CASE("an idle command survives many keepalive intervals") {
  Cluster* c = cluster();
  if (!c) return;
  Lines lines;
  auto p = spawn_ssh(c->host(0), c->options(), "sleep 4; echo done", "", lines.callback());
  ExitStatus s = run_to_end(*p);
  INFO(s.describe());
  CHECK(s.success());
  CHECK(lines.of(Stream::STDOUT) == std::vector<std::string>{"done"});
}

TEST_CASE("SSH over IPv6: root@::1 and root@[::1] reach an sshd on [::1], known_hosts gets [::1]:port") {
  Cluster* c = cluster();
  if (!c) return;
  // A free port on [::1] of this namespace (skip when it has no IPv6 loopback).
  int port = 0;
  {
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    socklen_t len = sizeof a;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin6_port);
    if (fd >= 0) ::close(fd);
  }
  if (port == 0) {
    ::dtrain::test::skip_test("skipped: no IPv6 loopback in this namespace");
    return;
  }
  // The cluster's sshd config and keys, listening on [::1] only, for this test.
  const std::string pid_file = c->dir() + "/sshd-v6.pid";
  int rc = 0;
  std::string log =
      run_here("/usr/sbin/sshd -f " + c->dir() + "/sshd_config -o Port=" + std::to_string(port) +
                   " -o ListenAddress=[::1]:" + std::to_string(port) + " -o PidFile=" + pid_file + " 2>&1",
               &rc);
  REQUIRE_MESSAGE(rc == 0, log);
  struct StopSshd {
    std::string pid_file;
    ~StopSshd() {
      std::ifstream in(pid_file);
      int pid = 0;
      if (in >> pid && pid > 0) ::kill(pid, SIGTERM);
    }
  } stop{pid_file};
  // sshd may still be setting up its listener when the daemonizing parent returns.
  bool listening = false;
  for (int i = 0; i < 100 && !listening; ++i) {
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    listening = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (!listening) std::this_thread::sleep_for(50ms);
  }
  REQUIRE(listening);

  const std::string known = c->dir() + "/known_v6";
  std::ofstream(known) << "";
  SshOptions o = c->options();
  o.known_hosts = known;
  o.port = port;
  o.policy = SshOptions::HostKeyPolicy::ACCEPT_NEW;
  Lines lines;
  CHECK(run_to_end(*spawn_ssh("root@::1", o, "echo v6-ok", "", lines.callback())).success());
  CHECK(lines.of(Stream::STDOUT) == std::vector<std::string>{"v6-ok"});
  CHECK(contains(read_file(known), "[::1]:" + std::to_string(port) + " ssh-ed25519 "));
  o.policy = SshOptions::HostKeyPolicy::STRICT;
  Lines strict;
  CHECK(run_to_end(*spawn_ssh("root@[::1]", o, "echo v6-strict", "", strict.callback())).success());
  CHECK(strict.of(Stream::STDOUT) == std::vector<std::string>{"v6-strict"});
}
