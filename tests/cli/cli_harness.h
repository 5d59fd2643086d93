// Shared pieces of the end-to-end CLI tests: a child process running the real `dtrain`
// binary (output captured, every wait bounded, process group killed on timeout), the
// namespace test cluster of scripts/test_cluster.sh (up once per binary, always down at
// exit), and queries of the processes living in each node's namespace.
#pragma once

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::cli_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A path's permission bits with setuid/setgid/sticky (07777), or 077777 when it is
/// missing: never a valid mode, so a comparison with any expected mode fails.
inline unsigned mode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 077777;
  return st.st_mode & 07777;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// `s` quoted for a POSIX shell.
inline std::string shq(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

// Runs a shell command to its end (bounded by `timeout` in the command itself where it
// matters); its stdout. No doctest macros: cluster teardown calls it at exit.
inline std::string shell(const std::string& command, int* rc = nullptr) {
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

/// The source tree ($DTRAIN_SOURCE_DIR, which ctest sets; else the working directory):
/// where the tests find configs/, examples/, docs/ and scripts/.
inline std::filesystem::path source_root() {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  return src && *src ? std::filesystem::path(src) : std::filesystem::current_path();
}

/// The dtrain binary under test ($DTRAIN_BIN), or "" when unset or not executable.
inline std::string dtrain_bin() {
  const char* b = std::getenv("DTRAIN_BIN");
  if (!b || !*b || ::access(b, X_OK) != 0) return "";
  return std::filesystem::canonical(b).string();
}

inline std::string make_temp_dir(const std::string& stem) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) return "";
  return tmpl;
}

// A temporary directory removed with everything in it when the object dies; path() is
// "" when it could not be created.
class TempDir {
 public:
  explicit TempDir(const std::string& stem) : path_(make_temp_dir(stem)) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------
// A child process: argv with extra environment, stdin /dev/null, stdout+stderr merged
// into one captured text. Its own process group, killed (TERM, then KILL) when the
// object dies while it still runs.

class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::fprintf(stderr, "exec %s failed\n", args[0]);
      std::_Exit(127);
    }
    ::close(fds[1]);
    if (pid_ < 0) {
      ::close(fds[0]);
      return;
    }
    ::setpgid(pid_, pid_);
    fd_ = fds[0];
    // Reads until EOF or until told to stop (grandchildren may hold the pipe open).
    reader_ = std::thread([this] {
      char buf[8192];
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        int r = ::poll(&p, 1, 100);
        if (r <= 0) continue;
        ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          eof_ = true;
          break;
        }
        std::lock_guard lock(mu_);
        out_.append(buf, static_cast<size_t>(n));
      }
    });
  }
  ~Child() {
    if (running()) kill_group();
    stop_ = true;
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  bool running() { return pid_ > 0 && !status_ && !poll_exit(); }

  std::string output() {
    std::lock_guard lock(mu_);
    return out_;
  }

  /// Exit code (128 + signal when killed), or nullopt when still running after `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!poll_exit()) {
      if (Clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(20ms);
    }
    // Let the reader drain what the process wrote before it exited: until it reached the
    // end (every writer gone) or nothing is pending (a grandchild holds the pipe open).
    // A pipe whose writers are gone polls ready (POLLHUP) forever: without the reader's
    // EOF this waited its whole bound, half a second, after every command.
    for (int i = 0; i < 50 && !eof_; ++i) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      std::this_thread::sleep_for(10ms);
    }
    return status_;
  }

  /// Waits until the output contains `needle`; false on timeout or when the child ended.
  bool wait_output(const std::string& needle, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (contains(output(), needle)) return true;
      if (poll_exit()) return contains(output(), needle);
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  /// Waits until `needle` occurs `count` times in the output (false on timeout or exit).
  bool wait_count(const std::string& needle, int count, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    auto occurrences = [&] {
      std::string out = output();
      int k = 0;
      for (size_t pos = out.find(needle); pos != std::string::npos; pos = out.find(needle, pos + 1)) ++k;
      return k;
    };
    while (Clock::now() < deadline) {
      if (occurrences() >= count) return true;
      if (poll_exit()) return occurrences() >= count;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  void kill_group() {
    if (pid_ <= 0 || status_) return;
    ::kill(-pid_, SIGTERM);
    if (wait(5s)) return;
    ::kill(-pid_, SIGKILL);
    wait(5s);
  }

  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  bool poll_exit() {
    if (status_) return true;
    if (pid_ <= 0) return true;
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r != pid_) return false;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::optional<int> status_;
  std::mutex mu_;
  std::string out_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> eof_{false};
  std::thread reader_;
  Clock::time_point start_;
};

struct RunResult {
  int rc = -1;
  bool timed_out = false;
  double seconds = 0;
  std::string out;
};

/// Runs argv to its end within `timeout` (killed and timed_out = true otherwise).
inline RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                     std::chrono::milliseconds timeout) {
  RunResult r;
  Child c(argv, env);
  if (!c.started()) return r;
  auto rc = c.wait(timeout);
  r.seconds = c.seconds();
  if (!rc) {
    r.timed_out = true;
    c.kill_group();
  } else {
    r.rc = *rc;
  }
  r.out = c.output();
  return r;
}

/// `dtrain ARGS...` (the binary under test) to its end within `seconds`.
inline RunResult run_dtrain(const std::vector<std::string>& args, int seconds = 240) {
  std::vector<std::string> argv = {dtrain_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {}, std::chrono::seconds(seconds));
}

/// A loopback port nobody listens on now (the kernel's pick): for a store a test starts on
/// this host; a fixed or pid-derived number can be taken by another test run beside it.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  REQUIRE(port > 0);
  return port;
}

// ---------------------------------------------------------------------------
// The namespace cluster

class Cluster {
 public:
  Cluster(int nodes, int slots) {
    if (::geteuid() != 0) {
      skip_ = "not root (network namespaces need it)";
      return;
    }
    if (shell("command -v ip").empty()) {
      skip_ = "no 'ip' command (iproute2)";
      return;
    }
    if (::access("/usr/sbin/sshd", X_OK) != 0) {
      skip_ = "no /usr/sbin/sshd (openssh-server)";
      return;
    }
    const char* source = std::getenv("DTRAIN_SOURCE_DIR");
    script_ = std::string(source ? source : ".") + "/scripts/test_cluster.sh";
    dir_ = make_temp_dir("dtrain-cli");
    if (dir_.empty()) {
      skip_ = "cannot create a temporary directory";
      return;
    }
    int rc = 0;
    std::string log = shell("timeout 60 bash " + script_ + " up " + std::to_string(nodes) + " " + dir_ + " " +
                                std::to_string(slots) + " 2>&1",
                            &rc);
    up_ = true;  // from here `down` runs even when `up` half failed
    if (rc == 77) {
      skip_ = log;
      return;
    }
    if (rc != 0) {
      skip_ = "test_cluster.sh up failed: " + log;
      failed_ = true;
      return;
    }
    for (const auto& line : split_lines(read_text(dir_ + "/env"))) {
      auto eq = line.find('=');
      if (eq != std::string::npos) env_[line.substr(0, eq)] = line.substr(eq + 1);
    }
    n_ = nodes;
  }
  ~Cluster() {
    if (up_) shell("timeout 60 bash " + script_ + " down " + dir_ + " 2>&1");
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  bool usable() const { return skip_.empty(); }
  bool failed() const { return failed_; }
  const std::string& skip_reason() const { return skip_; }
  const std::string& dir() const { return dir_; }
  int nodes() const { return n_; }
  std::string addr(int i) const { return env_.at("NODE_" + std::to_string(i) + "_ADDR"); }
  std::string ns(int i) const { return env_.at("NODE_" + std::to_string(i) + "_NS"); }
  /// The bridge-side end of node i's veth: a `tc` qdisc on it shapes the traffic *to* node i
  /// (it goes with the cluster at `test_cluster.sh down`, its qdisc with it).
  std::string veth(int i) const { return env_.at("NODE_" + std::to_string(i) + "_VETH"); }
  std::string launcher_addr() const { return env_.at("CLUSTER_LAUNCHER_ADDR"); }
  std::string identity() const { return env_.at("CLUSTER_IDENTITY"); }
  std::string known_hosts() const { return env_.at("CLUSTER_KNOWN_HOSTS"); }

  /// Writes a hostfile "root@<addr i> slots=<slots[i]>" into the state dir; its path.
  std::string hostfile(const std::string& name, const std::vector<int>& slots) const {
    std::string path = dir_ + "/" + name;
    std::ofstream out(path);
    for (size_t i = 0; i < slots.size(); ++i)
      out << "root@" << addr(static_cast<int>(i)) << " slots=" << slots[i] << "\n";
    return path;
  }

  /// --set arguments for this cluster's SSH identity and known_hosts.
  std::vector<std::string> ssh_sets() const {
    return {"--set", "cluster.ssh.identity_file=" + identity(), "--set", "cluster.ssh.known_hosts=" + known_hosts(),
            "--set", "cluster.ssh.connect_timeout=10"};
  }

  bool link(int i, bool up) const {
    int rc = 0;
    shell("timeout 20 bash " + script_ + (up ? " link-up " : " link-down ") + dir_ + " " + std::to_string(i) + " 2>&1",
          &rc);
    return rc == 0;
  }

 private:
  std::string script_, dir_, skip_;
  bool up_ = false, failed_ = false;
  int n_ = 0;
  std::map<std::string, std::string> env_;
};

// ---------------------------------------------------------------------------
// Processes of a namespace

struct NsProcess {
  pid_t pid;
  std::string cmdline;  // argv joined by spaces
};

inline std::string proc_cmdline(pid_t pid) {
  std::string s = read_text("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : s)
    if (c == '\0') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

/// Value of `name` in /proc/<pid>/environ ("" when absent or unreadable).
inline std::string proc_env(pid_t pid, const std::string& name) {
  std::string s = read_text("/proc/" + std::to_string(pid) + "/environ");
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find('\0', pos);
    if (end == std::string::npos) end = s.size();
    std::string entry = s.substr(pos, end - pos);
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
    pos = end + 1;
  }
  return "";
}

/// Processes of the namespace whose argv[0] is the dtrain binary (agents and workers).
inline std::vector<NsProcess> dtrain_processes(const std::string& ns, const std::string& bin) {
  std::vector<NsProcess> out;
  std::istringstream pids(shell("timeout 10 ip netns pids " + ns + " 2>/dev/null"));
  for (pid_t pid; pids >> pid;) {
    std::string cmd = proc_cmdline(pid);
    if (cmd.rfind(bin + " ", 0) == 0 || cmd == bin) out.push_back({pid, cmd});
  }
  return out;
}

/// A rank process (`dtrain worker` with RANK in its environment) of namespace `ns`: its
/// pid and RANK, waiting up to `timeout` for one.
inline std::optional<std::pair<pid_t, int>> ns_worker(const std::string& ns, const std::string& bin,
                                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto& p : dtrain_processes(ns, bin)) {
      if (p.cmdline.find(" worker") == std::string::npos) continue;
      const std::string rank = proc_env(p.pid, "RANK");
      if (!rank.empty()) return std::make_pair(p.pid, std::stoi(rank));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

inline std::string describe(const std::vector<NsProcess>& ps) {
  std::string s;
  for (auto& p : ps) s += std::to_string(p.pid) + ": " + p.cmdline + "\n";
  return s;
}

// ---------------------------------------------------------------------------
// The nccl-tests table printed by `dtrain bench`

struct TableRow {
  size_t bytes = 0;
  std::vector<std::string> cols;
};

/// Data rows of the table: lines that do not start with '#' and whose first word is a number.
inline std::vector<TableRow> table_rows(const std::string& out) {
  std::vector<TableRow> rows;
  for (const auto& line : split_lines(out)) {
    if (line.empty() || line[0] == '#' || line[0] == '[') continue;
    std::istringstream in(line);
    TableRow r;
    for (std::string w; in >> w;) r.cols.push_back(w);
    if (r.cols.empty() || r.cols[0].find_first_not_of("0123456789") != std::string::npos) continue;
    r.bytes = std::stoull(r.cols[0]);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace dtrain::cli_test
