// The process-spawner interface shared by the local spawner (fork/exec) and the SSH
// spawner (libssh2 exec channel): a running command whose stdout/stderr arrive line by
// line on a reader thread, with a bounded wait, a graceful-then-hard terminate and an
// exit status that says how the command ended (code, signal or lost SSH connection).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace dtrain::launch {

enum class Stream { STDOUT, STDERR };

/// Called once per complete line (without the '\n'; a partial last line is delivered
/// when the stream ends; a line longer than LineSplitter's limit arrives in pieces).
/// Runs on the process's reader thread: it must be thread-safe and must not block for
/// long (it stalls that process's output), and must not destroy its own Process.
using LineCallback = std::function<void(Stream, std::string_view line)>;

/// How a command ended.
struct ExitStatus {
  bool exited = false;           ///< true: ended normally with `code`; false: killed by `signal`
  int code = 0;                  ///< exit code when exited (255 when the SSH connection was lost)
  int signal = 0;                ///< signal number when !exited
  bool connection_lost = false;  ///< SSH only: the session dropped before an exit status came
  std::string detail;            ///< extra words for describe() (host, reason), may be empty

  bool success() const { return exited && code == 0 && !connection_lost; }
  /// "exited with code 3", "killed by signal 9 (SIGKILL)",
  /// "SSH connection to node1 lost: no reply to keepalive for 15 s", ...
  std::string describe() const;
};

/// A running command: a local child process or a remote command over SSH.
/// Not copyable or movable; hold it in a std::unique_ptr. All members are thread-safe.
class Process {
 public:
  Process() = default;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  /// Terminates the command if it is still running (terminate(default_grace)), then
  /// joins the reader thread and reaps the child: no leaked fds, threads or zombies.
  virtual ~Process();

  /// True until the exit status is known.
  virtual bool running() = 0;
  /// Waits up to `timeout` for the command to end; the status once it has (then every
  /// line it wrote has already been delivered to the callback), nullopt on timeout.
  virtual std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout) = 0;
  /// Stops the command and returns once it has ended (or was abandoned, see the
  /// implementations). Local: SIGTERM to the process group, SIGKILL to the group after
  /// `grace`. SSH: stdin EOF to the remote command, whose exit status is awaited for
  /// `grace`; then the channel is closed (see spawn_ssh: no remote signal with libssh2 1.10).
  virtual void terminate(std::chrono::milliseconds grace) = 0;
  /// Closes the command's stdin once the stdin data given at spawn has been written
  /// (the command then reads EOF). Idempotent.
  virtual void close_stdin() = 0;
  /// "node1" (SSH) or "localhost pid 1234" (local): for log and error messages.
  virtual std::string where() const = 0;

  /// Grace used by the destructor when the command is still running.
  static constexpr std::chrono::milliseconds default_grace{2000};
};

/// "SIGKILL" for 9, "signal 77" for numbers without a name.
std::string signal_name(int signal);

}  // namespace dtrain::launch
