// The SSH spawner: runs one POSIX sh command line on a remote host over a libssh2 exec
// channel (no pty), with its stdout/stderr line by line on a reader thread, stdin kept
// open, keepalive-based loss detection, and a helper that opens N hosts in parallel.
#pragma once

#include "launch/spawner.h"
#include "launch/ssh_session.h"

#include <memory>
#include <string>
#include <vector>

namespace dtrain::launch {

/// Connects to `host` ("name" or "user@name"; see SshSession), runs `shell_command`
/// through the remote login shell (`$SHELL -c`; quote every word, e.g. with
/// shell_quote), writes `stdin_data` to its stdin and then keeps stdin open (no EOF)
/// until close_stdin() or terminate(), so the remote side sees EOF only when the
/// launcher goes away. No pty is requested (remote processes get no SIGHUP: they must
/// treat stdin EOF as the end).
///
/// The returned Process reports the remote exit code or signal (exit-status /
/// exit-signal). A connection that dies (host down, network cut) is reported as
/// ExitStatus{exited, code 255, connection_lost} with describe()
/// "SSH connection to HOST lost: ..." within keepalive_interval_s * keepalive_count_max
/// seconds (plus one interval). terminate(grace) drops unsent stdin data, sends stdin
/// EOF and waits up to `grace` for the exit status; then it reports exit code 255
/// ("terminated: ... did not exit after stdin EOF") and the channel is closed (sshd
/// closes the command's pipes: it gets EOF/EPIPE but no signal). libssh2 1.10 cannot
/// send SSH "signal" requests, so remote commands (the dtrain agent) must end, and
/// kill what they started, when stdin reaches EOF.
/// Throws LaunchError naming the host when the session or the command cannot start.
std::unique_ptr<Process> spawn_ssh(const std::string& host, const SshOptions& options, const std::string& shell_command,
                                   const std::string& stdin_data, LineCallback callback);

/// One command for spawn_ssh_parallel.
struct SshCommand {
  std::string host;
  std::string shell_command;
  std::string stdin_data;
  LineCallback callback;
};

/// Starts every command at once (at most max_parallel connections in flight), returning
/// the processes in the order of `commands`. If any fails, commands not yet started are
/// skipped, the ones that started are terminated, and one LaunchError lists every
/// failure, one line per host.
std::vector<std::unique_ptr<Process>> spawn_ssh_parallel(const std::vector<SshCommand>& commands,
                                                         const SshOptions& options, int max_parallel = 32);

}  // namespace dtrain::launch
