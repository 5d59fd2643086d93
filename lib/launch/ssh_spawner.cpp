// SshProcess: one exec channel driven by a non-blocking poll() loop on its own thread:
// line-split stdout/stderr, stdin writes, liveness probes (channel requests the server
// must answer), terminate by stdin EOF then channel close, and the exit status; plus
// spawn_ssh and spawn_ssh_parallel.
#include "launch/ssh_spawner.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/line_splitter.h"
#include "launch/spawner_io.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Errors of the transport (socket, crypto, protocol): the session is unusable.
bool connection_error(int rc) {
  switch (rc) {
    case LIBSSH2_ERROR_SOCKET_NONE:
    case LIBSSH2_ERROR_BANNER_RECV:
    case LIBSSH2_ERROR_BANNER_SEND:
    case LIBSSH2_ERROR_INVALID_MAC:
    case LIBSSH2_ERROR_KEX_FAILURE:
    case LIBSSH2_ERROR_SOCKET_SEND:
    case LIBSSH2_ERROR_KEY_EXCHANGE_FAILURE:
    case LIBSSH2_ERROR_TIMEOUT:
    case LIBSSH2_ERROR_DECRYPT:
    case LIBSSH2_ERROR_SOCKET_DISCONNECT:
    case LIBSSH2_ERROR_PROTO:
    case LIBSSH2_ERROR_SOCKET_TIMEOUT:
    case LIBSSH2_ERROR_SOCKET_RECV:
    case LIBSSH2_ERROR_ENCRYPT:
    case LIBSSH2_ERROR_BAD_SOCKET: return true;
    default: return false;
  }
}

int signal_number(const std::string& name) {
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    if (abbrev && name == abbrev) return sig;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// SshProcess

class SshProcess final : public Process {
 public:
  SshProcess(std::unique_ptr<SshSession> session, LIBSSH2_CHANNEL* channel, std::string stdin_data,
             LineCallback callback)
      : session_(std::move(session)), channel_(channel), stdin_buf_(std::move(stdin_data)),
        callback_(std::move(callback)) {
    thread_ = std::thread([this] { run(); });
  }

  ~SshProcess() override {
    if (running()) terminate(default_grace);
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify();
    thread_.join();
    // Closing is bounded: blocking calls with a short timeout, and a dead connection
    // is shut down first so they fail at once instead of waiting for the peer.
    if (lost_ || abandoned_) session_->shutdown_socket();
    libssh2_session_set_blocking(session_->get(), 1);
    libssh2_session_set_timeout(session_->get(), 2000);
    libssh2_channel_free(channel_);
  }

  bool running() override {
    std::lock_guard lock(mu_);
    return !status_;
  }

  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return status_.has_value(); });
    return status_;
  }

  void terminate(std::chrono::milliseconds grace) override {
    {
      std::lock_guard lock(mu_);
      if (status_) return;
      if (!terminate_requested_) {
        terminate_requested_ = true;
        terminate_deadline_ = Clock::now() + grace;
      }
    }
    wake_.notify();
    // The I/O thread publishes a status by the deadline at the latest.
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, terminate_deadline_ + std::chrono::seconds(2), [&] { return status_.has_value(); });
  }

  void close_stdin() override {
    {
      std::lock_guard lock(mu_);
      close_stdin_requested_ = true;
    }
    wake_.notify();
  }

  std::string where() const override { return session_->host(); }

 private:
  void finish(ExitStatus status) {
    {
      std::lock_guard lock(mu_);
      status_ = std::move(status);
    }
    cv_.notify_all();
  }

  void finish_lost(const std::string& why) {
    lost_ = true;
    ExitStatus s;
    s.exited = true;
    s.code = 255;
    s.connection_lost = true;
    s.detail = fmt::format("SSH connection to {} lost: {}", session_->host(), why);
    finish(std::move(s));
  }

  // Reads what is buffered on one stream; false when the connection failed.
  bool read_stream(int stream_id, LineSplitter& lines) {
    char buf[32768];
    for (int i = 0; i < 64; ++i) {
      ssize_t n = libssh2_channel_read_ex(channel_, stream_id, buf, sizeof buf);
      if (n > 0) {
        lines.feed(std::string_view(buf, static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && n != LIBSSH2_ERROR_EAGAIN && connection_error(static_cast<int>(n))) {
        finish_lost(session_->last_error());
        return false;
      }
      return true;
    }
    return true;
  }

  // Starts or continues a liveness probe: a channel request the server must answer.
  // libssh2 1.10 can send no "signal" request and no request after exec other than
  // "env"; sshd refuses "env" once the command runs, and that refusal is the answer.
  // (libssh2_keepalive_send's global-request replies pile up unread in libssh2's packet
  // queue, so they are not used.) Returns false when the connection failed.
  bool drive_probe(bool& pending) {
    if (!pending) return true;
    static const char name[] = "DTRAIN_KEEPALIVE";
    int rc = libssh2_channel_setenv_ex(channel_, name, sizeof name - 1, "1", 1);
    if (rc == LIBSSH2_ERROR_EAGAIN) return true;
    if (rc != 0 && connection_error(rc)) {
      finish_lost(session_->last_error());
      return false;
    }
    pending = false;
    return true;
  }

  ExitStatus collect_exit_status() {
    ExitStatus s;
    char* signal = nullptr;
    size_t signal_length = 0;
    libssh2_channel_get_exit_signal(channel_, &signal, &signal_length, nullptr, nullptr, nullptr, nullptr);
    if (signal) {
      std::string name(signal, signal_length);
      libssh2_free(session_->get(), signal);
      s.exited = false;
      s.signal = signal_number(name);
      if (s.signal == 0) s.detail = fmt::format("remote signal {}", name);
    } else {
      s.exited = true;
      s.code = libssh2_channel_get_exit_status(channel_);
    }
    return s;
  }

  void run() {
    detail::block_sigpipe_in_this_thread();
    LineSplitter out_lines(Stream::STDOUT, callback_);
    LineSplitter err_lines(Stream::STDERR, callback_);
    LIBSSH2_SESSION* session = session_->get();
    const SshOptions& options = session_->options();
    const bool probing = options.keepalive_interval_s > 0;
    const auto interval = std::chrono::seconds(std::max(options.keepalive_interval_s, 1));
    const auto silence_limit = interval * std::max(options.keepalive_count_max, 1);
    auto next_probe = Clock::now() + interval;
    bool eof_sent = false, probe_pending = false;

    for (;;) {
      bool close_requested, terminating;
      Clock::time_point term_deadline;
      {
        std::lock_guard lock(mu_);
        if (stop_) break;
        close_requested = close_stdin_requested_;
        terminating = terminate_requested_;
        term_deadline = terminate_deadline_;
      }
      auto now = Clock::now();

      if (!read_stream(0, out_lines) || !read_stream(SSH_EXTENDED_DATA_STDERR, err_lines)) break;

      // stdin: pending data first (dropped when terminating), then EOF when asked.
      if (terminating) stdin_buf_.clear();
      while (!stdin_buf_.empty()) {
        ssize_t n = libssh2_channel_write(channel_, stdin_buf_.data(), stdin_buf_.size());
        if (n > 0) {
          stdin_buf_.erase(0, static_cast<std::size_t>(n));
          continue;
        }
        if (n == LIBSSH2_ERROR_EAGAIN) break;
        if (connection_error(static_cast<int>(n))) {
          finish_lost(session_->last_error());
          break;
        }
        log_debug("{}: stdin data dropped: {}", session_->host(), session_->last_error());
        stdin_buf_.clear();
      }
      if (status_known()) break;
      if ((close_requested || terminating) && stdin_buf_.empty() && !eof_sent) {
        int rc = libssh2_channel_send_eof(channel_);
        if (rc != LIBSSH2_ERROR_EAGAIN) eof_sent = true;
        if (rc != 0 && connection_error(rc)) {
          finish_lost(session_->last_error());
          break;
        }
      }

      if (probing && !probe_pending && now >= next_probe) {
        probe_pending = true;
        next_probe = now + interval;
      }
      if (!drive_probe(probe_pending)) break;

      // The end: the remote side sent EOF and closed the channel (exit status first).
      if (libssh2_channel_eof(channel_)) {
        int rc = libssh2_channel_wait_closed(channel_);
        if (rc == 0) {
          read_stream(0, out_lines);
          read_stream(SSH_EXTENDED_DATA_STDERR, err_lines);
          out_lines.finish();
          err_lines.finish();
          if (!status_known()) finish(collect_exit_status());
          break;
        }
        if (rc != LIBSSH2_ERROR_EAGAIN && connection_error(rc)) {
          finish_lost(session_->last_error());
          break;
        }
      }

      now = Clock::now();
      if (probing && now - session_->last_received() > silence_limit) {
        finish_lost(
            fmt::format("nothing received for {} s (keepalive every {} s)",
                        std::chrono::duration_cast<std::chrono::seconds>(now - session_->last_received()).count(),
                        interval.count()));
        break;
      }
      if (terminating && now >= term_deadline) {
        // Abandoned: the peer may be unreachable, so the destructor must not wait for it
        // to acknowledge the channel close (that cost seconds per dead node).
        abandoned_ = true;
        ExitStatus s;
        s.exited = true;
        s.code = 255;
        s.detail = fmt::format(
            "terminated: the command on {} did not exit after stdin EOF; SSH channel closed "
            "(a process that ignores stdin EOF and never writes may still run there)",
            session_->host());
        finish(std::move(s));
        break;
      }

      // Sleep until the socket or a request wakes us, or the next deadline.
      auto wake_at = now + std::chrono::seconds(1);
      if (probing) wake_at = std::min({wake_at, next_probe, session_->last_received() + silence_limit});
      if (terminating) wake_at = std::min(wake_at, term_deadline);
      short events = POLLIN;
      if (libssh2_session_block_directions(session) & LIBSSH2_SESSION_BLOCK_OUTBOUND) events |= POLLOUT;
      pollfd fds[2] = {{session_->socket(), events, 0}, {wake_.fd(), POLLIN, 0}};
      int r = ::poll(fds, 2, detail::poll_timeout_ms(wake_at, 1000));
      if (r > 0 && (fds[1].revents & POLLIN)) wake_.drain();
    }
    out_lines.finish();
    err_lines.finish();
  }

  bool status_known() {
    std::lock_guard lock(mu_);
    return status_.has_value();
  }

  std::unique_ptr<SshSession> session_;
  LIBSSH2_CHANNEL* channel_;
  std::string stdin_buf_;  // I/O thread only
  LineCallback callback_;
  detail::Wakeup wake_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> abandoned_{false};  // terminate() gave up waiting for the remote exit

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ExitStatus> status_;
  bool close_stdin_requested_ = false;
  bool terminate_requested_ = false;
  Clock::time_point terminate_deadline_{};
  bool stop_ = false;

  std::thread thread_;  // last: starts after every member above is constructed
};

}  // namespace

// ---------------------------------------------------------------------------
// spawn_ssh

std::unique_ptr<Process> spawn_ssh(const std::string& host, const SshOptions& options, const std::string& shell_command,
                                   const std::string& stdin_data, LineCallback callback) {
  DT_ENFORCE(shell_command.find('\0') == std::string::npos, LaunchError,
             "SSH to {}: the command line contains a NUL byte", host);
  auto session = std::make_unique<SshSession>(host, options);
  LIBSSH2_SESSION* s = session->get();
  LIBSSH2_CHANNEL* channel = libssh2_channel_open_session(s);
  DT_ENFORCE(channel != nullptr, LaunchError, "SSH to {}: cannot open a session channel: {}", session->host(),
             session->last_error());
  int rc = libssh2_channel_exec(channel, shell_command.c_str());
  if (rc != 0) {
    std::string error = session->last_error();
    libssh2_channel_free(channel);
    DT_THROW(LaunchError, "SSH to {}: the server refused to run the command: {}", session->host(), error);
  }
  libssh2_session_set_blocking(s, 0);
  return std::make_unique<SshProcess>(std::move(session), channel, stdin_data, std::move(callback));
}

std::vector<std::unique_ptr<Process>> spawn_ssh_parallel(const std::vector<SshCommand>& commands,
                                                         const SshOptions& options, int max_parallel) {
  const std::size_t n = commands.size();
  std::vector<std::unique_ptr<Process>> processes(n);
  std::vector<std::string> errors(n);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      if (failed) continue;  // fail fast: do not start more connections
      const SshCommand& c = commands[i];
      try {
        processes[i] = spawn_ssh(c.host, options, c.shell_command, c.stdin_data, c.callback);
      } catch (const std::exception& e) {
        errors[i] = e.what();
        failed = true;
      }
    }
  };
  std::size_t thread_count = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(max_parallel, 1)));
  {
    std::vector<std::jthread> threads;
    for (std::size_t t = 0; t < thread_count; ++t) threads.emplace_back(worker);
  }
  if (!failed) return processes;

  std::string report;
  std::size_t failures = 0, skipped = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) {
      ++failures;
      report += fmt::format("\n  {}: {}", commands[i].host, errors[i]);
    } else if (!processes[i]) {
      ++skipped;
    }
  }
  if (skipped) report += fmt::format("\n  ({} host(s) not attempted after the first failure)", skipped);
  {
    // Stop the ones that did start, all at once (each waits out its own grace).
    std::vector<std::jthread> stoppers;
    for (auto& p : processes)
      if (p) stoppers.emplace_back([&p] { p.reset(); });
  }
  DT_THROW(LaunchError, "SSH: could not start the command on {} of {} host(s):{}", failures, n, report);
}

}  // namespace dtrain::launch
