// SshProcess: one exec channel driven by a non-blocking poll() loop on its own thread
// (SshChannelPump): line-split stdout/stderr, stdin writes, liveness probes (channel
// requests the server must answer), terminate by stdin EOF then channel close, and the
// exit status; plus spawn_ssh and spawn_ssh_parallel.
#include "launch/ssh_spawner.h"

#include "core/check.h"
#include "core/log.h"
#include "launch/line_splitter.h"
#include "launch/spawner_io.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
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
// How the remote command ended

// The connection died (host down, network cut, no reply to the probes).
ExitStatus exit_status_lost(const std::string& host, const std::string& why) {
  ExitStatus s;
  s.exited = true;
  s.code = 255;
  s.connection_lost = true;
  s.detail = fmt::format("SSH connection to {} lost: {}", host, why);
  return s;
}

// terminate()'s grace ran out: the channel is given up, the command may still run.
ExitStatus exit_status_abandoned(const std::string& host) {
  ExitStatus s;
  s.exited = true;
  s.code = 255;
  s.detail = fmt::format(
      "terminated: the command on {} did not exit after stdin EOF; SSH channel closed "
      "(a process that ignores stdin EOF and never writes may still run there)",
      host);
  return s;
}

// The exit-status or exit-signal the server sent with the channel's close.
ExitStatus exit_status_of(LIBSSH2_SESSION* session, LIBSSH2_CHANNEL* channel) {
  ExitStatus s;
  char* signal = nullptr;
  size_t signal_length = 0;
  libssh2_channel_get_exit_signal(channel, &signal, &signal_length, nullptr, nullptr, nullptr, nullptr);
  if (signal) {
    std::string name(signal, signal_length);
    libssh2_free(session, signal);
    s.exited = false;
    s.signal = signal_number(name);
    if (s.signal == 0) s.detail = fmt::format("remote signal {}", name);
  } else {
    s.exited = true;
    s.code = libssh2_channel_get_exit_status(channel);
  }
  return s;
}

// ---------------------------------------------------------------------------
// SshChannelPump

// The I/O of one exec channel, driven by a non-blocking poll() loop on the process's
// thread: stdout/stderr split into lines, stdin writes and EOF, liveness probes, and the
// end (exit status, lost connection or abandoned channel) published to `state`.
class SshChannelPump {
 public:
  SshChannelPump(SshSession& session, LIBSSH2_CHANNEL* channel, std::string stdin_data, LineCallback callback,
                 detail::ProcessState& state);

  // Until the status is published or the owner asks to stop.
  void run();

  bool lost() const { return lost_; }
  bool abandoned() const { return abandoned_; }  // terminate() gave up waiting for the remote exit

 private:
  using Requests = detail::ProcessState::Requests;

  void finish_lost(const std::string& why);
  // Reads what is buffered on one stream; false when the connection failed.
  bool read_stream(int stream_id, LineSplitter& lines);
  // stdin: pending data first (dropped when terminating), then EOF when asked. False
  // when the connection failed.
  bool write_stdin(bool close_requested, bool terminating);
  // Starts or continues a liveness probe: a channel request the server must answer.
  // libssh2 1.10 can send no "signal" request and no request after exec other than
  // "env"; sshd refuses "env" once the command runs, and that refusal is the answer.
  // (libssh2_keepalive_send's global-request replies pile up unread in libssh2's packet
  // queue, so they are not used.) Returns false when the connection failed.
  bool drive_probe();
  // The end: the remote side sent EOF and closed the channel (exit status first). True
  // once the channel is closed or the connection failed.
  bool channel_ended();
  // The server silent past the keepalive limit, or terminate()'s grace over: the status
  // says which, true.
  bool past_deadline(Clock::time_point now, const Requests& req);
  // Sleeps until the socket or a request wakes us, or the next deadline.
  void wait_io(Clock::time_point now, const Requests& req, Clock::time_point next_probe);

  SshSession& session_;
  LIBSSH2_CHANNEL* channel_;
  detail::ProcessState& state_;
  std::string stdin_buf_;
  LineCallback callback_;
  LineSplitter out_lines_, err_lines_;
  const bool probing_;
  const std::chrono::seconds interval_;
  const std::chrono::seconds silence_limit_;
  bool eof_sent_ = false, probe_pending_ = false;
  std::atomic<bool> lost_{false};
  std::atomic<bool> abandoned_{false};
};

SshChannelPump::SshChannelPump(SshSession& session, LIBSSH2_CHANNEL* channel, std::string stdin_data,
                               LineCallback callback, detail::ProcessState& state)
    : session_(session), channel_(channel), state_(state), stdin_buf_(std::move(stdin_data)),
      callback_(std::move(callback)), out_lines_(Stream::STDOUT, callback_), err_lines_(Stream::STDERR, callback_),
      probing_(session.options().keepalive_interval_s > 0),
      interval_(std::max(session.options().keepalive_interval_s, 1)),
      silence_limit_(interval_ * std::max(session.options().keepalive_count_max, 1)) {}

void SshChannelPump::run() {
  detail::block_sigpipe_in_this_thread();
  auto next_probe = Clock::now() + interval_;
  for (;;) {
    const Requests req = state_.requests();
    if (req.stop) break;
    auto now = Clock::now();
    if (!read_stream(0, out_lines_) || !read_stream(SSH_EXTENDED_DATA_STDERR, err_lines_)) break;
    if (!write_stdin(req.close_stdin, req.terminate)) break;
    if (probing_ && !probe_pending_ && now >= next_probe) {
      probe_pending_ = true;
      next_probe = now + interval_;
    }
    if (!drive_probe()) break;
    if (channel_ended()) break;
    now = Clock::now();
    if (past_deadline(now, req)) break;
    wait_io(now, req, next_probe);
  }
  out_lines_.finish();
  err_lines_.finish();
}

void SshChannelPump::finish_lost(const std::string& why) {
  lost_ = true;
  state_.finish(exit_status_lost(session_.host(), why));
}

bool SshChannelPump::read_stream(int stream_id, LineSplitter& lines) {
  char buf[32768];
  for (int i = 0; i < 64; ++i) {
    ssize_t n = libssh2_channel_read_ex(channel_, stream_id, buf, sizeof buf);
    if (n > 0) {
      lines.feed(std::string_view(buf, static_cast<std::size_t>(n)));
      continue;
    }
    if (n < 0 && n != LIBSSH2_ERROR_EAGAIN && connection_error(static_cast<int>(n))) {
      finish_lost(session_.last_error());
      return false;
    }
    return true;
  }
  return true;
}

bool SshChannelPump::write_stdin(bool close_requested, bool terminating) {
  if (terminating) stdin_buf_.clear();
  while (!stdin_buf_.empty()) {
    ssize_t n = libssh2_channel_write(channel_, stdin_buf_.data(), stdin_buf_.size());
    if (n > 0) {
      stdin_buf_.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n == LIBSSH2_ERROR_EAGAIN) break;
    if (connection_error(static_cast<int>(n))) {
      finish_lost(session_.last_error());
      break;
    }
    log_debug("{}: stdin data dropped: {}", session_.host(), session_.last_error());
    stdin_buf_.clear();
  }
  if (!state_.running()) return false;
  if ((close_requested || terminating) && stdin_buf_.empty() && !eof_sent_) {
    int rc = libssh2_channel_send_eof(channel_);
    if (rc != LIBSSH2_ERROR_EAGAIN) eof_sent_ = true;
    if (rc != 0 && connection_error(rc)) {
      finish_lost(session_.last_error());
      return false;
    }
  }
  return true;
}

bool SshChannelPump::drive_probe() {
  if (!probe_pending_) return true;
  static const char name[] = "DTRAIN_KEEPALIVE";
  int rc = libssh2_channel_setenv_ex(channel_, name, sizeof name - 1, "1", 1);
  if (rc == LIBSSH2_ERROR_EAGAIN) return true;
  if (rc != 0 && connection_error(rc)) {
    finish_lost(session_.last_error());
    return false;
  }
  probe_pending_ = false;
  return true;
}

bool SshChannelPump::channel_ended() {
  if (!libssh2_channel_eof(channel_)) return false;
  int rc = libssh2_channel_wait_closed(channel_);
  if (rc == 0) {
    read_stream(0, out_lines_);
    read_stream(SSH_EXTENDED_DATA_STDERR, err_lines_);
    out_lines_.finish();
    err_lines_.finish();
    if (state_.running()) state_.finish(exit_status_of(session_.get(), channel_));
    return true;
  }
  if (rc != LIBSSH2_ERROR_EAGAIN && connection_error(rc)) {
    finish_lost(session_.last_error());
    return true;
  }
  return false;
}

bool SshChannelPump::past_deadline(Clock::time_point now, const Requests& req) {
  if (probing_ && now - session_.last_received() > silence_limit_) {
    finish_lost(fmt::format("nothing received for {} s (keepalive every {} s)",
                            std::chrono::duration_cast<std::chrono::seconds>(now - session_.last_received()).count(),
                            interval_.count()));
    return true;
  }
  if (req.terminate && now >= req.terminate_deadline) {
    // Abandoned: the peer may be unreachable, so the destructor must not wait for it
    // to acknowledge the channel close (that cost seconds per dead node).
    abandoned_ = true;
    state_.finish(exit_status_abandoned(session_.host()));
    return true;
  }
  return false;
}

void SshChannelPump::wait_io(Clock::time_point now, const Requests& req, Clock::time_point next_probe) {
  auto wake_at = now + std::chrono::seconds(1);
  if (probing_) wake_at = std::min({wake_at, next_probe, session_.last_received() + silence_limit_});
  if (req.terminate) wake_at = std::min(wake_at, req.terminate_deadline);
  short events = POLLIN;
  if (libssh2_session_block_directions(session_.get()) & LIBSSH2_SESSION_BLOCK_OUTBOUND) events |= POLLOUT;
  pollfd fds[2] = {{session_.socket(), events, 0}, {state_.wake_fd(), POLLIN, 0}};
  int r = ::poll(fds, 2, detail::poll_timeout_ms(wake_at, 1000));
  if (r > 0 && (fds[1].revents & POLLIN)) state_.drain_wake();
}

// ---------------------------------------------------------------------------
// SshProcess

class SshProcess final : public Process {
 public:
  SshProcess(std::unique_ptr<SshSession> session, LIBSSH2_CHANNEL* channel, std::string stdin_data,
             LineCallback callback)
      : session_(std::move(session)), channel_(channel),
        pump_(*session_, channel, std::move(stdin_data), std::move(callback), state_) {
    thread_ = std::thread([this] { pump_.run(); });
  }

  ~SshProcess() override {
    if (running()) terminate(default_grace);
    state_.request_stop();
    thread_.join();
    // Closing is bounded: blocking calls with a short timeout, and a dead connection
    // is shut down first so they fail at once instead of waiting for the peer.
    if (pump_.lost() || pump_.abandoned()) session_->shutdown_socket();
    libssh2_session_set_blocking(session_->get(), 1);
    libssh2_session_set_timeout(session_->get(), 2000);
    libssh2_channel_free(channel_);
  }

  bool running() override { return state_.running(); }

  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout) override { return state_.wait_for(timeout); }

  void terminate(std::chrono::milliseconds grace) override {
    const auto deadline = state_.request_terminate(Clock::now() + grace);
    if (!deadline) return;
    // The I/O thread publishes a status by the deadline at the latest.
    state_.wait_until(*deadline + std::chrono::seconds(2));
  }

  void close_stdin() override { state_.request_close_stdin(); }

  std::string where() const override { return session_->host(); }

 private:
  std::unique_ptr<SshSession> session_;
  LIBSSH2_CHANNEL* channel_;
  detail::ProcessState state_;
  SshChannelPump pump_;
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
