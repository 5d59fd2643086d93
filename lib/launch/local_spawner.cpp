// The local spawner: fork/execve with pipes, one poll()-driven reader thread per child
// that splits output into lines, feeds stdin and reaps the child through a pidfd;
// process-group termination with orphan reaping; and host_is_local().
#include "launch/local_spawner.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/line_splitter.h"
#include "launch/spawner_io.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

extern char** environ;

namespace dtrain::launch {
namespace {

using detail::UniqueFd;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// fork/exec helpers

struct Pipe {
  UniqueFd read, write;
};

Pipe make_pipe() {
  int fds[2];
  DT_SYS_CHECK(::pipe2(fds, O_CLOEXEC));
  Pipe p{UniqueFd(fds[0]), UniqueFd(fds[1])};
  // Keep both ends above 2 so the child's dup2 onto 0/1/2 never clobbers another end
  // (possible when the launcher runs with a closed stdin).
  for (UniqueFd* f : {&p.read, &p.write}) {
    if (f->get() < 3) {
      int moved = ::fcntl(f->get(), F_DUPFD_CLOEXEC, 3);
      DT_SYS_CHECK(moved);
      f->reset(moved);
    }
  }
  return p;
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  DT_SYS_CHECK(flags);
  DT_SYS_CHECK(::fcntl(fd, F_SETFL, flags | O_NONBLOCK));
}

ExitStatus status_from_wait(int wstatus) {
  ExitStatus s;
  if (WIFEXITED(wstatus)) {
    s.exited = true;
    s.code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    s.signal = WTERMSIG(wstatus);
    if (WCOREDUMP(wstatus)) s.detail = "core dumped";
  }
  return s;
}

std::string find_in_path(const std::string& name, const std::string& path) {
  std::size_t begin = 0;
  while (begin <= path.size()) {
    std::size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(begin, end - begin);
    if (dir.empty()) dir = ".";  // POSIX: an empty PATH entry is the current directory
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return {};
}

// What the child reports through the exec-error pipe before _exit(127).
struct ChildFailure {
  int stage;  // 1 = chdir, 2 = execve
  int error;
};

[[noreturn]] void child_fail(int fd, int stage) {
  ChildFailure f{stage, errno};
  [[maybe_unused]] ssize_t r = ::write(fd, &f, sizeof f);
  ::_exit(127);
}

// Runs in the forked child: only async-signal-safe calls from here to execve.
[[noreturn]] void child_exec(bool own_group, int in_fd, int out_fd, int err_fd, int report_fd, const char* workdir,
                             const char* exe, char* const* argv, char* const* envp) {
  if (own_group) ::setpgid(0, 0);
  if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) child_fail(report_fd, 2);
  // The launcher may block or ignore signals (signalfd, SIGPIPE); the child starts clean.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  if (workdir[0] != '\0' && ::chdir(workdir) != 0) child_fail(report_fd, 1);
  // fds other threads opened without O_CLOEXEC must not leak into the command.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execve(exe, argv, envp);
  child_fail(report_fd, 2);
}

// ---------------------------------------------------------------------------
// Process-group inspection

// Whether a process of group pgid still runs. Zombies do not count: they are dead
// members nobody reaped yet (re-parented to a PID 1 that may never reap them).
bool group_has_live_members(pid_t pgid) {
  if (::kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  DIR* dir = ::opendir("/proc");
  if (!dir) return true;
  bool live = false;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string text;
    if (!std::getline(stat, text)) continue;
    // "pid (comm) S ppid pgrp ...": comm may hold spaces and parens, so parse after the last ')'.
    std::size_t close = text.rfind(')');
    if (close == std::string::npos || close + 2 >= text.size()) continue;
    char state = text[close + 2];
    long ppid = 0, pgrp = 0;
    if (std::sscanf(text.c_str() + close + 3, "%ld %ld", &ppid, &pgrp) != 2) continue;
    if (pgrp == pgid && state != 'Z' && state != 'X') {
      live = true;
      break;
    }
  }
  ::closedir(dir);
  return live;
}

// ---------------------------------------------------------------------------
// ChildPipes

// The child's three pipes, on the reader thread: stdin fed from a buffer (closed once
// written when asked), stdout and stderr read into lines until EOF.
class ChildPipes {
 public:
  ChildPipes(UniqueFd in, UniqueFd out, UniqueFd err, std::string stdin_data, LineCallback callback)
      : in_(std::move(in)), out_(std::move(out)), err_(std::move(err)), stdin_buf_(std::move(stdin_data)),
        callback_(std::move(callback)), out_lines_(Stream::STDOUT, callback_), err_lines_(Stream::STDERR, callback_) {}

  bool stdin_open() const { return in_.valid(); }
  bool output_open() const { return out_.valid() || err_.valid(); }
  void close_stdin_when_written() {
    if (stdin_buf_.empty()) in_.reset();
  }
  // Appends the poll() entries of the pipes that can move now to fds[n...]; the new n.
  int poll_fds(pollfd* fds, int n);
  // Reads and writes what poll() found ready in the entries poll_fds added.
  void on_ready(const pollfd* fds);
  void write_stdin();
  // Whatever the child wrote before it ended. A bounded drain: a grandchild may keep writing.
  void drain();
  // The end of both streams: partial last lines are delivered.
  void finish() {
    out_lines_.finish();
    err_lines_.finish();
  }

 private:
  // One read; false at EOF (fd closed, partial line delivered) or when nothing is ready.
  bool read_some(UniqueFd& fd, LineSplitter& lines);

  UniqueFd in_, out_, err_;
  std::string stdin_buf_;
  LineCallback callback_;
  LineSplitter out_lines_, err_lines_;
  int out_idx_ = -1, err_idx_ = -1, in_idx_ = -1;  // in the last poll_fds
};

int ChildPipes::poll_fds(pollfd* fds, int n) {
  out_idx_ = err_idx_ = in_idx_ = -1;
  if (out_.valid()) out_idx_ = n, fds[n++] = {out_.get(), POLLIN, 0};
  if (err_.valid()) err_idx_ = n, fds[n++] = {err_.get(), POLLIN, 0};
  if (in_.valid() && !stdin_buf_.empty()) in_idx_ = n, fds[n++] = {in_.get(), POLLOUT, 0};
  return n;
}

void ChildPipes::on_ready(const pollfd* fds) {
  if (out_idx_ >= 0 && fds[out_idx_].revents) read_some(out_, out_lines_);
  if (err_idx_ >= 0 && fds[err_idx_].revents) read_some(err_, err_lines_);
  if (in_idx_ >= 0 && fds[in_idx_].revents) write_stdin();
}

void ChildPipes::drain() {
  for (int i = 0; i < 64 && out_.valid() && read_some(out_, out_lines_); ++i) {
  }
  for (int i = 0; i < 64 && err_.valid() && read_some(err_, err_lines_); ++i) {
  }
}

bool ChildPipes::read_some(UniqueFd& fd, LineSplitter& lines) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n > 0) {
      lines.feed(std::string_view(buf, static_cast<std::size_t>(n)));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    lines.finish();  // EOF, or an error that ends the stream the same way
    fd.reset();
    return false;
  }
}

void ChildPipes::write_stdin() {
  while (!stdin_buf_.empty()) {
    ssize_t n = ::write(in_.get(), stdin_buf_.data(), stdin_buf_.size());
    if (n > 0) {
      stdin_buf_.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EPIPE: the child closed its stdin; what it did not read is dropped.
    detail::discard_pending_sigpipe();
    stdin_buf_.clear();
    in_.reset();
    return;
  }
}

// ---------------------------------------------------------------------------
// ChildGroup

// The child and, when it leads its own process group, the group's members: signals,
// reaping and the terminate sequence. The leader is reaped under the state's mutex and
// signalled under it, so a signal never reaches a reused pid.
class ChildGroup {
 public:
  ChildGroup(pid_t pid, bool own_group, detail::ProcessState& state)
      : pid_(pid), own_group_(own_group), state_(state) {}

  pid_t pid() const { return pid_; }
  bool own_group() const { return own_group_; }
  bool has_live_members() const { return own_group_ && group_has_live_members(pid_); }

  // SIGTERM (and SIGCONT), SIGKILL after `grace`; returns once the group is gone (or
  // after warning that a member outlived SIGKILL by 10 s).
  void terminate(std::chrono::milliseconds grace, const std::string& where);
  // The leader's status once it is reaped (then it is the caller's to publish).
  std::optional<ExitStatus> reap_leader();
  // Reaps group members re-parented to this process (see spawner_become_subreaper).
  // Only after the leader is reaped, so its status is never taken here.
  void reap_orphans();

 private:
  // The child has been reaped and, with its own group, no member of the group runs.
  bool finished();
  bool wait_finished(Clock::time_point deadline);
  void send_signal(int sig);
  // Members that died a moment ago may still be zombies on their way to this process
  // (re-parenting after their parent's exit is not instant): reap them for a bounded
  // while, so the group is gone when terminate() returns, not merely dead.
  void reap_tail();

  const pid_t pid_;
  const bool own_group_;
  detail::ProcessState& state_;
};

void ChildGroup::terminate(std::chrono::milliseconds grace, const std::string& where) {
  if (finished()) return;
  send_signal(SIGTERM);
  // A stopped process (SIGSTOP, a debugger, a hung-rank test) acts on SIGTERM only once
  // continued, as systemd does it; otherwise it would sit out the grace and need SIGKILL.
  send_signal(SIGCONT);
  if (!wait_finished(Clock::now() + grace)) {
    send_signal(SIGKILL);
    // SIGKILL cannot be caught; only a process stuck in the kernel (D state) outlives it.
    if (!wait_finished(Clock::now() + std::chrono::seconds(10)))
      log_warn("{} still has live processes 10 s after SIGKILL", where);
  }
  reap_tail();
}

std::optional<ExitStatus> ChildGroup::reap_leader() {
  int ws = 0;
  pid_t r = 0;
  const bool reaped = state_.with_status([&](const std::optional<ExitStatus>&) {
    do r = ::waitpid(pid_, &ws, WNOHANG);
    while (r < 0 && errno == EINTR);
    return r != 0;
  });
  if (!reaped) return std::nullopt;
  if (r == pid_) return status_from_wait(ws);
  ExitStatus status;
  status.exited = true;
  status.code = 255;
  status.detail = "exit status unavailable: the child was reaped elsewhere (is SIGCHLD ignored?)";
  return status;
}

void ChildGroup::reap_orphans() {
  if (!own_group_ || state_.running()) return;
  int ws;
  while (::waitpid(-pid_, &ws, WNOHANG) > 0) {
  }
}

bool ChildGroup::finished() {
  if (state_.running()) return false;
  if (!own_group_) return true;
  reap_orphans();
  return !group_has_live_members(pid_);
}

bool ChildGroup::wait_finished(Clock::time_point deadline) {
  while (!finished()) {
    if (Clock::now() >= deadline) return false;
    state_.wait_notified(std::chrono::milliseconds(10));
  }
  return true;
}

void ChildGroup::send_signal(int sig) {
  state_.with_status([&](const std::optional<ExitStatus>& status) {
    if (own_group_) {
      // The group id stays reserved while any member exists, so this reaches only it.
      ::kill(-pid_, sig);
    } else if (!status) {
      ::kill(pid_, sig);
    }
  });
}

void ChildGroup::reap_tail() {
  if (!own_group_) return;
  for (int i = 0; i < 200 && ::kill(-pid_, 0) == 0; ++i) {
    reap_orphans();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// ---------------------------------------------------------------------------
// LocalProcessImpl

class LocalProcessImpl final : public LocalProcess {
 public:
  LocalProcessImpl(pid_t pid, bool own_group, UniqueFd in, UniqueFd out, UniqueFd err, std::string stdin_data,
                   LineCallback callback)
      : group_(pid, own_group, state_),
        pipes_(std::move(in), std::move(out), std::move(err), std::move(stdin_data), std::move(callback)) {
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd >= 0) pidfd_.reset(pidfd);  // else: kernels < 5.3, the thread polls waitpid
    thread_ = std::thread([this] { run(); });
  }

  ~LocalProcessImpl() override {
    if (running() || group_.has_live_members()) terminate(default_grace);
    state_.request_stop();
    thread_.join();
    group_.reap_orphans();
    if (state_.running()) log_warn("{} did not end after SIGKILL; leaving it behind", where());
  }

  int pid() const override { return group_.pid(); }
  int pgid() const override { return group_.own_group() ? group_.pid() : -1; }
  bool running() override { return state_.running(); }
  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout) override { return state_.wait_for(timeout); }
  void terminate(std::chrono::milliseconds grace) override { group_.terminate(grace, where()); }
  void close_stdin() override { state_.request_close_stdin(); }
  std::string where() const override { return fmt::format("localhost pid {}", group_.pid()); }

 private:
  // Tries to reap the leader; true once it is reaped (status published).
  bool try_reap() {
    std::optional<ExitStatus> status = group_.reap_leader();
    if (!status) return false;
    // Whatever the child wrote is in the pipes now; deliver it before the status so
    // wait_for() callers have every line.
    pipes_.drain();
    state_.finish(*status);
    group_.reap_orphans();
    return true;
  }

  void run();

  detail::ProcessState state_;
  ChildGroup group_;
  UniqueFd pidfd_;
  ChildPipes pipes_;    // owned by the reader thread once it runs
  std::thread thread_;  // last: starts after every member above is constructed
};

void LocalProcessImpl::run() {
  detail::block_sigpipe_in_this_thread();
  bool reaped = false;
  if (pipes_.stdin_open()) pipes_.write_stdin();
  for (;;) {
    const detail::ProcessState::Requests req = state_.requests();
    if (req.stop) break;
    if (req.close_stdin) pipes_.close_stdin_when_written();
    if (reaped && !pipes_.output_open()) break;

    pollfd fds[5];
    int n = 0;
    fds[n++] = {state_.wake_fd(), POLLIN, 0};
    int pid_idx = -1;
    if (!reaped && pidfd_.valid()) pid_idx = n, fds[n++] = {pidfd_.get(), POLLIN, 0};
    n = pipes_.poll_fds(fds, n);
    // Without a pidfd the child is polled; after the leader is gone, group orphans
    // (whose exit no fd reports) are reaped now and then while the pipes stay open.
    int timeout = -1;
    if (!reaped && !pidfd_.valid()) timeout = 50;
    if (reaped && group_.own_group()) timeout = 200;
    int r = ::poll(fds, static_cast<nfds_t>(n), timeout);
    if (r < 0 && errno != EINTR) {
      log_error("{}: poll failed: {}", where(), std::strerror(errno));
      break;
    }
    if (r > 0 && (fds[0].revents & POLLIN)) state_.drain_wake();
    pipes_.on_ready(fds);
    if (!reaped && (pid_idx < 0 || fds[pid_idx].revents)) reaped = try_reap();
    if (reaped && r == 0) group_.reap_orphans();
  }
  pipes_.finish();
  if (!reaped) try_reap();
}

}  // namespace

// ---------------------------------------------------------------------------
// spawn_local

namespace {

// The child's environment: inherited first (first occurrence wins, like getenv), then env.
std::map<std::string, std::string> child_environment(const std::string& argv0,
                                                     const std::map<std::string, std::string>& env, EnvMode env_mode) {
  std::map<std::string, std::string> merged;
  if (env_mode == EnvMode::INHERIT) {
    for (char** e = environ; e && *e; ++e) {
      std::string_view entry(*e);
      std::size_t eq = entry.find('=');
      if (eq == std::string_view::npos || eq == 0) continue;
      merged.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
    }
  }
  for (const auto& [key, value] : env) {
    DT_ENFORCE(!key.empty() && key.find('=') == std::string::npos && key.find('\0') == std::string::npos, LaunchError,
               "cannot spawn '{}': environment variable name '{}' is empty or holds '=' or NUL", argv0, key);
    DT_ENFORCE(value.find('\0') == std::string::npos, LaunchError,
               "cannot spawn '{}': the value of environment variable {} contains a NUL byte", argv0, key);
    merged[key] = value;
  }
  return merged;
}

// argv0 when it names a path, else the first match in the PATH of the child's environment.
std::string child_executable(const std::string& argv0, const std::map<std::string, std::string>& merged) {
  std::string exe = argv0;
  if (exe.find('/') == std::string::npos) {
    auto it = merged.find("PATH");
    std::string path = it != merged.end() ? it->second : "/usr/local/bin:/usr/bin:/bin";
    exe = find_in_path(argv0, path);
    DT_ENFORCE(!exe.empty(), LaunchError, "cannot spawn '{}': no executable of that name in PATH={}", argv0, path);
  }
  return exe;
}

}  // namespace

std::unique_ptr<LocalProcess> spawn_local(const std::vector<std::string>& argv,
                                          const std::map<std::string, std::string>& env, const std::string& workdir,
                                          const std::string& stdin_data, LineCallback callback, bool own_process_group,
                                          EnvMode env_mode) {
  DT_ENFORCE(!argv.empty() && !argv[0].empty(), LaunchError, "cannot spawn an empty command line");
  for (const auto& arg : argv)
    DT_ENFORCE(arg.find('\0') == std::string::npos, LaunchError, "cannot spawn '{}': an argument contains a NUL byte",
               argv[0]);

  const std::map<std::string, std::string> merged = child_environment(argv[0], env, env_mode);
  const std::string exe = child_executable(argv[0], merged);

  // Everything the child needs is built before fork: after it only syscalls are safe.
  std::vector<std::string> env_strings;
  env_strings.reserve(merged.size());
  for (const auto& [key, value] : merged) env_strings.push_back(key + "=" + value);
  std::vector<char*> argv_ptrs, env_ptrs;
  for (const auto& arg : argv) argv_ptrs.push_back(const_cast<char*>(arg.c_str()));
  argv_ptrs.push_back(nullptr);
  for (const auto& entry : env_strings) env_ptrs.push_back(const_cast<char*>(entry.c_str()));
  env_ptrs.push_back(nullptr);

  Pipe in = make_pipe(), out = make_pipe(), err = make_pipe(), report = make_pipe();
  pid_t pid = ::fork();
  DT_SYS_CHECK(pid);
  if (pid == 0)
    child_exec(own_process_group, in.read.get(), out.write.get(), err.write.get(), report.write.get(), workdir.c_str(),
               exe.c_str(), argv_ptrs.data(), env_ptrs.data());

  // Also set the group here: whichever of parent and child runs first, the group exists
  // before anyone signals it.
  if (own_process_group) ::setpgid(pid, pid);
  in.read.reset();
  out.write.reset();
  err.write.reset();
  report.write.reset();

  ChildFailure failure{};
  ssize_t n;
  do n = ::read(report.read.get(), &failure, sizeof failure);
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof failure)) {
    int ws;
    while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (failure.stage == 1)
      DT_THROW(LaunchError, "cannot spawn '{}': cannot change to working directory '{}': {}", argv[0], workdir,
               std::strerror(failure.error));
    DT_THROW(LaunchError, "cannot spawn '{}' ({}): {}", argv[0], exe, std::strerror(failure.error));
  }

  set_nonblocking(in.write.get());
  set_nonblocking(out.read.get());
  set_nonblocking(err.read.get());
  return std::make_unique<LocalProcessImpl>(pid, own_process_group, std::move(in.write), std::move(out.read),
                                            std::move(err.read), stdin_data, std::move(callback));
}

void spawner_become_subreaper() { DT_SYS_CHECK(::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)); }

// ---------------------------------------------------------------------------
// host_is_local

namespace {

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool same_address(const sockaddr* a, const sockaddr* b) {
  if (!a || !b || a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  return false;
}

bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

bool host_is_local(const std::string& host_spec) {
  std::string host = host_spec.substr(host_spec.rfind('@') == std::string::npos ? 0 : host_spec.rfind('@') + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  host = lowercase(host);
  if (host.empty()) return false;
  if (host == "localhost" || host == "localhost.localdomain" || host == "ip6-localhost") return true;

  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) {
    std::string self = lowercase(name);
    if (host == self || host == self.substr(0, self.find('.'))) return true;
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0 || !resolved) return false;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) interfaces = nullptr;
  bool local = false;
  for (addrinfo* a = resolved; a && !local; a = a->ai_next) {
    if (is_loopback(a->ai_addr)) local = true;
    for (ifaddrs* i = interfaces; i && !local; i = i->ifa_next)
      if (same_address(a->ai_addr, i->ifa_addr)) local = true;
  }
  ::freeaddrinfo(resolved);
  if (interfaces) ::freeifaddrs(interfaces);
  return local;
}

}  // namespace dtrain::launch
