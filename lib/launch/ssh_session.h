// One authenticated SSH connection (libssh2): bounded TCP connect, handshake, host key
// check against an OpenSSH known_hosts file (strict, accept-new or off), public-key
// authentication (identity file, ssh-agent, default keys) and keepalive bookkeeping.
// Every blocking step is bounded by SshOptions::connect_timeout.
#pragma once

#include "core/error.h"

#include <libssh2.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {
/// A launch error that retrying cannot fix: the host key does not match or is unknown
/// under the strict policy, or authentication was refused. The supervisor does not
/// spend restarts on it.
class SshRefusedError : public LaunchError {
 public:
  using LaunchError::LaunchError;
};
}  // namespace dtrain

namespace dtrain::launch {

/// The largest identity file accepted (an RSA-16384 key in PEM is under 13 KiB).
constexpr size_t kIdentityFileMaxBytes = 1 << 20;
/// The largest known_hosts file read (an entry is under 1 KiB: tens of thousands of hosts).
constexpr size_t kKnownHostsMaxBytes = 64u << 20;

/// True when path is the null device (as in ssh's UserKnownHostsFile=/dev/null): a
/// known_hosts file that holds no keys and takes appended ones, accepted although it is
/// not a regular file.
bool known_hosts_is_dev_null(const std::string& path);

struct SshOptions {
  /// Login name; empty: the "user@" part of the host, else $USER (or the passwd name).
  std::string user;
  int port = 22;
  /// Private key file (its ".pub" beside it is used when present). Empty: the keys of
  /// ssh-agent ($SSH_AUTH_SOCK), then ~/.ssh/id_ed25519, id_ecdsa, id_rsa.
  std::string identity_file;
  /// OpenSSH known_hosts file (plain and hashed entries, "[host]:port" for port != 22).
  /// Empty: ~/.ssh/known_hosts.
  std::string known_hosts;
  /// STRICT: unknown host or changed key is an error. ACCEPT_NEW: unknown hosts are
  /// appended to known_hosts, a changed key is still an error. OFF: no check (warns once).
  enum class HostKeyPolicy { STRICT, ACCEPT_NEW, OFF } policy = HostKeyPolicy::STRICT;
  /// Bound for the TCP connect and for each SSH step (handshake, auth, channel open).
  std::chrono::milliseconds connect_timeout{10000};
  /// Seconds between keepalive requests (0: none; a dead peer is then only noticed when
  /// TCP gives up). The connection counts as lost when nothing at all has been received
  /// for keepalive_interval_s * keepalive_count_max seconds.
  int keepalive_interval_s = 5;
  int keepalive_count_max = 3;
};

/// Calls libssh2_init once per process (thread-safe); libssh2_exit runs at exit.
void ssh_library_init();

/// An open, authenticated SSH session. Not thread-safe: one thread at a time uses it
/// (SshProcess hands it to its I/O thread after setup). Closes cleanly on destruction.
class SshSession {
 public:
  /// Connects to `host` ("name", "user@name", "1.2.3.4" or "[v6addr]"), verifies the
  /// host key and authenticates. Throws LaunchError naming the host (and the
  /// known_hosts or identity file involved) with what to do about it.
  SshSession(const std::string& host, const SshOptions& options);
  ~SshSession();
  SshSession(const SshSession&) = delete;
  SshSession& operator=(const SshSession&) = delete;

  LIBSSH2_SESSION* get() const { return session_; }
  int socket() const { return socket_; }
  const std::string& host() const { return host_; }  ///< without "user@" and brackets
  const std::string& user() const { return user_; }
  const SshOptions& options() const { return options_; }

  /// When a byte was last received from the server (keepalive replies count).
  std::chrono::steady_clock::time_point last_received() const;
  /// libssh2's text for the last error on this session.
  std::string last_error() const;
  /// After a lost connection: makes every further socket call fail at once, so that
  /// closing the session cannot wait on a dead peer.
  void shutdown_socket();

 private:
  void connect_tcp();
  void handshake_and_verify();
  // The server's host key against known_hosts under options_.policy; known_kinds: the
  // key types known_hosts holds for this host ("" = none), for the error message.
  void verify_host_key(LIBSSH2_KNOWNHOSTS* known, const std::string& path, const std::string& known_kinds);
  // Public-key authentication: the identity file when set, else ssh-agent, then the
  // default key files.
  void authenticate();
  bool auth_key_file(const std::string& file, std::string* error);
  void auth_identity_file();
  bool auth_default_keys(std::vector<std::string>& tried);
  static ssize_t recv_hook(libssh2_socket_t socket, void* buffer, size_t length, int flags, void** abstract);

  std::string host_;
  std::string user_;
  SshOptions options_;
  int socket_ = -1;
  LIBSSH2_SESSION* session_ = nullptr;
  std::atomic<std::int64_t> last_received_ns_{0};
};

}  // namespace dtrain::launch
