// SshSession: bounded TCP connect, libssh2 handshake with host key types ordered by
// what known_hosts holds, the known_hosts check (strict / accept-new / off) with
// OpenSSH-style fingerprints, public-key auth (identity file, agent, default keys), and
// a recv hook that timestamps every byte from the server for keepalive liveness.
#include "launch/ssh_session.h"

#include "core/check.h"
#include "core/env.h"
#include "core/input_file.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::string home_dir() {
  if (const char* home = env_get("HOME"); home && *home) return home;
  if (passwd* pw = ::getpwuid(::getuid())) return pw->pw_dir;
  return "/";
}

std::string login_name() {
  if (const char* user = env_get("USER"); user && *user) return user;
  if (passwd* pw = ::getpwuid(::getuid())) return pw->pw_name;
  return "root";
}

std::string base64(const unsigned char* data, std::size_t length, bool pad) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < length; i += 3) {
    std::uint32_t chunk = std::uint32_t(data[i]) << 16;
    if (i + 1 < length) chunk |= std::uint32_t(data[i + 1]) << 8;
    if (i + 2 < length) chunk |= data[i + 2];
    out += alphabet[(chunk >> 18) & 63];
    out += alphabet[(chunk >> 12) & 63];
    if (i + 1 < length) out += alphabet[(chunk >> 6) & 63];
    else if (pad) out += '=';
    if (i + 2 < length) out += alphabet[chunk & 63];
    else if (pad) out += '=';
  }
  return out;
}

// One host key algorithm family: libssh2's session type, the known_hosts type bit, the
// name OpenSSH prints and the handshake method names that yield it.
struct KeyKind {
  int hostkey_type;
  int knownhost_bit;
  const char* name;
  const char* methods;
};
constexpr KeyKind kKeyKinds[] = {
    {LIBSSH2_HOSTKEY_TYPE_ED25519, LIBSSH2_KNOWNHOST_KEY_ED25519, "ssh-ed25519", "ssh-ed25519"},
    {LIBSSH2_HOSTKEY_TYPE_ECDSA_256, LIBSSH2_KNOWNHOST_KEY_ECDSA_256, "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp256"},
    {LIBSSH2_HOSTKEY_TYPE_ECDSA_384, LIBSSH2_KNOWNHOST_KEY_ECDSA_384, "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp384"},
    {LIBSSH2_HOSTKEY_TYPE_ECDSA_521, LIBSSH2_KNOWNHOST_KEY_ECDSA_521, "ecdsa-sha2-nistp521", "ecdsa-sha2-nistp521"},
    {LIBSSH2_HOSTKEY_TYPE_RSA, LIBSSH2_KNOWNHOST_KEY_SSHRSA, "ssh-rsa", "rsa-sha2-512,rsa-sha2-256,ssh-rsa"},
    {LIBSSH2_HOSTKEY_TYPE_DSS, LIBSSH2_KNOWNHOST_KEY_SSHDSS, "ssh-dss", "ssh-dss"},
};

const KeyKind* key_kind(int hostkey_type) {
  for (const auto& kind : kKeyKinds)
    if (kind.hostkey_type == hostkey_type) return &kind;
  return nullptr;
}

// known_hosts is read and appended under one lock: parallel sessions accepting new
// hosts must not interleave or lose lines.
std::mutex& known_hosts_mutex() {
  static std::mutex mu;
  return mu;
}

// RAII for LIBSSH2_KNOWNHOSTS.
struct KnownHosts {
  LIBSSH2_KNOWNHOSTS* hosts;
  explicit KnownHosts(LIBSSH2_SESSION* session) : hosts(libssh2_knownhost_init(session)) {}
  ~KnownHosts() {
    if (hosts) libssh2_knownhost_free(hosts);
  }
};

}  // namespace

bool known_hosts_is_dev_null(const std::string& path) {
  struct stat st {
  }, null_st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && ::stat("/dev/null", &null_st) == 0 &&
         S_ISCHR(null_st.st_mode) && st.st_rdev == null_st.st_rdev;
}

namespace {

// Loads a known_hosts file line by line: libssh2_knownhost_readfile stops at the first
// line it cannot parse (certificate authorities, @revoked, sk-* keys), which would
// silently drop every entry after it. Returns the number of lines skipped. A file that is
// absent holds no keys; one that is not a regular file of at most kKnownHostsMaxBytes (a
// FIFO would block the read, /dev/zero never end it) is refused naming it, checked on the
// descriptor before the first byte is read.
int known_hosts_load(LIBSSH2_KNOWNHOSTS* hosts, const std::string& path, const std::string& host) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !std::filesystem::is_symlink(path, ec)) return 0;
  if (known_hosts_is_dev_null(path)) return 0;  // ssh's UserKnownHostsFile=/dev/null: no keys
  if (const std::string problem = input_file_problem(path, kKnownHostsMaxBytes); !problem.empty())
    DT_THROW(SshRefusedError,
             "SSH to {}: known_hosts file {} {}: set cluster.ssh.known_hosts to an OpenSSH "
             "known_hosts file",
             host, path, problem);
  std::istringstream in(input_file_read(path, "known_hosts file", kKnownHostsMaxBytes));
  std::string line;
  int skipped = 0, number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    if (libssh2_knownhost_readline(hosts, line.c_str(), line.size(), LIBSSH2_KNOWNHOST_FILE_OPENSSH) != 0) {
      log_debug("{}:{}: known_hosts line not understood by libssh2, skipped", path, number);
      ++skipped;
    }
  }
  return skipped;
}

// Names of the key types known_hosts holds for host:port. libssh2 has no lookup by
// name, so each type is probed with a dummy key: MISMATCH means an entry exists.
std::vector<const KeyKind*> known_key_kinds(LIBSSH2_KNOWNHOSTS* hosts, const std::string& host, int port) {
  std::vector<const KeyKind*> kinds;
  static const char dummy[] = "dtrain-probe";
  for (const auto& kind : kKeyKinds) {
    int r = libssh2_knownhost_checkp(hosts, host.c_str(), port, dummy, sizeof dummy - 1,
                                     LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | kind.knownhost_bit,
                                     nullptr);
    if (r == LIBSSH2_KNOWNHOST_CHECK_MISMATCH) kinds.push_back(&kind);
  }
  return kinds;
}

std::string kinds_text(const std::vector<const KeyKind*>& kinds) {
  std::string text;
  for (const auto* kind : kinds) text += (text.empty() ? "" : ", ") + std::string(kind->name);
  return text;
}

// Like OpenSSH: ask first for the key types known_hosts already holds for this host, so
// a server with several host keys is checked against the one we know.
std::string host_key_prefs(const std::vector<const KeyKind*>& known_kinds) {
  std::string prefs;
  for (const auto* kind : known_kinds) prefs += (prefs.empty() ? "" : ",") + std::string(kind->methods);
  for (const auto& kind : kKeyKinds)
    if (std::find(known_kinds.begin(), known_kinds.end(), &kind) == known_kinds.end())
      prefs += (prefs.empty() ? "" : ",") + std::string(kind.methods);
  return prefs;
}

std::string known_hosts_name(const std::string& host, int port) {
  if (port == 22) return host;
  return fmt::format("[{}]:{}", host, port);
}

// Appends one entry (the line libssh2 formats) to known_hosts, creating the file (and
// ~/.ssh) when missing.
void known_hosts_append(LIBSSH2_KNOWNHOSTS* hosts, libssh2_knownhost* entry, const std::string& path) {
  char line[8192];
  size_t length = 0;
  int r = libssh2_knownhost_writeline(hosts, entry, line, sizeof line, &length, LIBSSH2_KNOWNHOST_FILE_OPENSSH);
  DT_ENFORCE(r == 0, LaunchError, "cannot format a known_hosts line for {} (libssh2 error {})", path, r);
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent)) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (!ec) ::chmod(parent.c_str(), 0700);
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  DT_ENFORCE(fd >= 0, LaunchError, "cannot add a host key to known_hosts file {}: {}", path, std::strerror(errno));
  std::string text(line, length);
  // A file whose last line lacks '\n' would glue the new entry onto it.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    char last = '\n';
    if (::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n') text.insert(text.begin(), '\n');
  }
  ssize_t written = ::write(fd, text.data(), text.size());
  int saved = errno;
  ::close(fd);
  DT_ENFORCE(written == static_cast<ssize_t>(text.size()), LaunchError,
             "cannot add a host key to known_hosts file {}: {}", path, std::strerror(saved));
}

std::string strip_host(const std::string& spec, std::string* user) {
  std::string host = spec;
  std::size_t at = host.rfind('@');
  if (at != std::string::npos) {
    if (user) *user = host.substr(0, at);
    host = host.substr(at + 1);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

// ---------------------------------------------------------------------------
// Library init and helpers

void ssh_library_init() {
  // A function-local static: initialized once (thread-safe), libssh2_exit at exit.
  static struct Library {
    int rc;
    Library() : rc(libssh2_init(0)) {}
    ~Library() {
      if (rc == 0) libssh2_exit();
    }
  } library;
  DT_ENFORCE(library.rc == 0, LaunchError, "libssh2_init failed with code {}", library.rc);
}

// ---------------------------------------------------------------------------
// SshSession

SshSession::SshSession(const std::string& host, const SshOptions& options) : options_(options) {
  ssh_library_init();
  std::string user_from_host;
  host_ = strip_host(host, &user_from_host);
  DT_ENFORCE(!host_.empty(), LaunchError, "SSH: empty host name in '{}'", host);
  user_ = !options_.user.empty() ? options_.user : !user_from_host.empty() ? user_from_host : login_name();
  DT_ENFORCE(options_.port > 0 && options_.port < 65536, LaunchError, "SSH to {}: port {} is out of range", host_,
             options_.port);
  last_received_ns_ = now_ns();
  try {
    connect_tcp();
    handshake_and_verify();
    authenticate();
  } catch (...) {
    if (session_) {
      libssh2_session_set_timeout(session_, 1000);
      libssh2_session_disconnect(session_, "dtrain: setup failed");
      libssh2_session_free(session_);
      session_ = nullptr;
    }
    if (socket_ >= 0) ::close(socket_);
    socket_ = -1;
    throw;
  }
}

SshSession::~SshSession() {
  if (session_) {
    // Bounded goodbye: blocking with a short timeout (a dead peer was shut down already).
    libssh2_session_set_blocking(session_, 1);
    libssh2_session_set_timeout(session_, 2000);
    libssh2_session_disconnect(session_, "dtrain: done");
    libssh2_session_free(session_);
  }
  if (socket_ >= 0) ::close(socket_);
}

std::chrono::steady_clock::time_point SshSession::last_received() const {
  return Clock::time_point(std::chrono::nanoseconds(last_received_ns_.load()));
}

std::string SshSession::last_error() const {
  if (!session_) return "no session";
  char* message = nullptr;
  int length = 0;
  libssh2_session_last_error(session_, &message, &length, 0);
  return message && length > 0 ? std::string(message, static_cast<std::size_t>(length)) : "unknown error";
}

void SshSession::shutdown_socket() {
  if (socket_ >= 0) ::shutdown(socket_, SHUT_RDWR);
}

ssize_t SshSession::recv_hook(libssh2_socket_t socket, void* buffer, size_t length, int flags, void** abstract) {
  ssize_t n = ::recv(socket, buffer, length, flags);
  if (n < 0) {
    // libssh2's convention (as its own _libssh2_recv): -errno, EWOULDBLOCK as EAGAIN.
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
  if (n > 0) static_cast<SshSession*>(*abstract)->last_received_ns_ = now_ns();
  return n;
}

void SshSession::connect_tcp() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  std::string port = std::to_string(options_.port);
  int gai = ::getaddrinfo(host_.c_str(), port.c_str(), &hints, &resolved);
  if (gai != 0) DT_THROW(LaunchError, "SSH to {}: cannot resolve the host name: {}", host_, ::gai_strerror(gai));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(resolved, &::freeaddrinfo);

  auto deadline = Clock::now() + options_.connect_timeout;
  std::string errors;
  for (addrinfo* a = resolved; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      errors += fmt::format("; socket: {}", std::strerror(errno));
      continue;
    }
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    int error = r == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int left;
      do {
        left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
        r = ::poll(&p, 1, std::max(left, 0));
      } while (r < 0 && errno == EINTR);
      if (r == 0) {
        error = ETIMEDOUT;
      } else {
        socklen_t len = sizeof error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      }
    }
    if (error == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      socket_ = fd;
      return;
    }
    ::close(fd);
    char address[INET6_ADDRSTRLEN] = "?";
    const void* raw = a->ai_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    ::inet_ntop(a->ai_family, raw, address, sizeof address);
    if (error == ETIMEDOUT)
      errors +=
          fmt::format("; {} port {}: no answer within {} ms", address, options_.port, options_.connect_timeout.count());
    else errors += fmt::format("; {} port {}: {}", address, options_.port, std::strerror(error));
    if (Clock::now() >= deadline) break;
  }
  DT_THROW(LaunchError,
           "SSH to {}: cannot connect{}. Check the host name, that sshd runs there and that no "
           "firewall blocks port {}",
           host_, errors, options_.port);
}

void SshSession::handshake_and_verify() {
  session_ = libssh2_session_init_ex(nullptr, nullptr, nullptr, this);
  DT_ENFORCE(session_ != nullptr, LaunchError, "SSH to {}: cannot create a libssh2 session", host_);
  libssh2_session_set_blocking(session_, 1);
  libssh2_session_set_timeout(session_, static_cast<long>(options_.connect_timeout.count()));
  libssh2_session_callback_set(session_, LIBSSH2_CALLBACK_RECV, reinterpret_cast<void*>(&SshSession::recv_hook));

  using Policy = SshOptions::HostKeyPolicy;
  std::string path = options_.known_hosts.empty() ? home_dir() + "/.ssh/known_hosts" : options_.known_hosts;
  KnownHosts known(session_);
  DT_ENFORCE(known.hosts != nullptr, LaunchError, "SSH to {}: cannot create the known_hosts store", host_);
  std::vector<const KeyKind*> known_kinds;
  if (options_.policy != Policy::OFF) {
    std::lock_guard lock(known_hosts_mutex());
    known_hosts_load(known.hosts, path, host_);
    known_kinds = known_key_kinds(known.hosts, host_, options_.port);
  }
  const std::string prefs = host_key_prefs(known_kinds);
  if (libssh2_session_method_pref(session_, LIBSSH2_METHOD_HOSTKEY, prefs.c_str()) != 0)
    log_debug("SSH to {}: host key preference '{}' not accepted: {}", host_, prefs, last_error());

  int rc = libssh2_session_handshake(session_, socket_);
  if (rc == LIBSSH2_ERROR_TIMEOUT || rc == LIBSSH2_ERROR_SOCKET_TIMEOUT)
    DT_THROW(LaunchError,
             "SSH to {} port {}: the SSH handshake timed out after {} ms (the port accepts TCP "
             "connections but does not speak SSH?)",
             host_, options_.port, options_.connect_timeout.count());
  if (rc != 0)
    DT_THROW(LaunchError, "SSH to {} port {}: the SSH handshake failed: {} (is it an SSH server?)", host_,
             options_.port, last_error());
  verify_host_key(known.hosts, path, kinds_text(known_kinds));
}

void SshSession::verify_host_key(LIBSSH2_KNOWNHOSTS* known, const std::string& path, const std::string& known_kinds) {
  using Policy = SshOptions::HostKeyPolicy;
  size_t key_length = 0;
  int key_type = 0;
  const char* key = libssh2_session_hostkey(session_, &key_length, &key_type);
  DT_ENFORCE(key != nullptr, LaunchError, "SSH to {}: the server sent no host key", host_);
  const KeyKind* kind = key_kind(key_type);
  std::string type_name = kind ? kind->name : fmt::format("key type {}", key_type);
  // "SHA256:<base64, no padding>" as OpenSSH prints it.
  std::string fingerprint = "SHA256:?";
  if (const char* hash = libssh2_hostkey_hash(session_, LIBSSH2_HOSTKEY_HASH_SHA256))
    fingerprint = "SHA256:" + base64(reinterpret_cast<const unsigned char*>(hash), 32, false);
  std::string entry_name = known_hosts_name(host_, options_.port);

  if (options_.policy == Policy::OFF) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log_warn(
          "SSH host key checking is OFF: connections (first {}, {} {}) are open to man-in-the-middle "
          "attacks; use the strict or accept-new policy with a known_hosts file",
          host_, type_name, fingerprint);
    });
    return;
  }
  DT_ENFORCE(kind != nullptr, LaunchError, "SSH to {}: the server's host key type {} is not supported", host_,
             key_type);

  std::lock_guard lock(known_hosts_mutex());
  libssh2_knownhost* found = nullptr;
  int check = libssh2_knownhost_checkp(
      known, host_.c_str(), options_.port, key, key_length,
      LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | kind->knownhost_bit, &found);
  switch (check) {
    case LIBSSH2_KNOWNHOST_CHECK_MATCH: return;
    case LIBSSH2_KNOWNHOST_CHECK_MISMATCH:
      DT_THROW(SshRefusedError,
               "SSH to {}: HOST KEY MISMATCH. The server offers {} key {}, but known_hosts file {} holds a "
               "different {} key for {}. The host was reinstalled, or someone is intercepting the connection. "
               "If the change is expected, remove the old entry (ssh-keygen -R '{}' -f {}) and connect again",
               host_, type_name, fingerprint, path, type_name, entry_name, entry_name, path);
    case LIBSSH2_KNOWNHOST_CHECK_NOTFOUND: break;
    default:
      DT_THROW(LaunchError, "SSH to {}: cannot check the host key against known_hosts file {}: {}", host_, path,
               last_error());
  }
  if (options_.policy == Policy::STRICT) {
    std::string others =
        known_kinds.empty() ? std::string() : fmt::format(" (it holds only {} key(s) for this host)", known_kinds);
    DT_THROW(SshRefusedError,
             "SSH to {}: unknown host key: the server offers {} key {}, which is not in known_hosts file {}{}. "
             "Verify the fingerprint, then add it (ssh-keyscan -p {} -t {} {} >> {}) or use the accept-new host "
             "key policy",
             host_, type_name, fingerprint, path, others, options_.port, type_name, host_, path);
  }
  // ACCEPT_NEW: trust on first use, recorded like OpenSSH's StrictHostKeyChecking=accept-new.
  libssh2_knownhost* entry = nullptr;
  int added =
      libssh2_knownhost_addc(known, entry_name.c_str(), nullptr, key, key_length, nullptr, 0,
                             LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | kind->knownhost_bit, &entry);
  DT_ENFORCE(added == 0 && entry != nullptr, LaunchError, "SSH to {}: cannot record the new host key: {}", host_,
             last_error());
  known_hosts_append(known, entry, path);
  log_info("SSH: added {} host key {} of {} to {}", type_name, fingerprint, entry_name, path);
}

// One private key file (with its .pub beside it when readable); false and *error when
// the server refused it.
bool SshSession::auth_key_file(const std::string& file, std::string* error) {
  std::string pub = file + ".pub";
  bool have_pub = ::access(pub.c_str(), R_OK) == 0;
  int rc = libssh2_userauth_publickey_fromfile_ex(session_, user_.c_str(), static_cast<unsigned>(user_.size()),
                                                  have_pub ? pub.c_str() : nullptr, file.c_str(), nullptr);
  if (rc == 0) return true;
  if (rc == LIBSSH2_ERROR_TIMEOUT)
    DT_THROW(LaunchError, "SSH to {}: authentication timed out after {} ms", host_, options_.connect_timeout.count());
  *error = last_error();
  return false;
}

// cluster.ssh.identity_file, the only key tried when set: returns authenticated or throws.
void SshSession::auth_identity_file() {
  const std::string& file = options_.identity_file;
  // libssh2 reads the whole file, blocking: a FIFO, /dev/zero or a huge file would hang
  // it beyond every timeout, so type and size are checked first (a key is a few KiB).
  const std::string problem = input_file_problem(file, kIdentityFileMaxBytes);
  if (!problem.empty())
    DT_THROW(SshRefusedError, "SSH to {}: identity file {} {}: set cluster.ssh.identity_file to a private key file",
             host_, file, problem);
  std::string error;
  if (auth_key_file(file, &error)) return;
  DT_THROW(SshRefusedError,
           "SSH to {}: public-key authentication as {} with identity file {} failed: {}. Check that the file is "
           "an unencrypted private key (load encrypted keys into ssh-agent instead) and that its public key is in "
           "~{}/.ssh/authorized_keys on {}",
           host_, user_, file, error, user_, host_);
}

// ~/.ssh/id_ed25519, id_ecdsa, id_rsa as ssh tries them; each one tried is added to `tried`.
bool SshSession::auth_default_keys(std::vector<std::string>& tried) {
  for (const char* name : {"id_ed25519", "id_ecdsa", "id_rsa"}) {
    std::string file = home_dir() + "/.ssh/" + name;
    if (::access(file.c_str(), R_OK) != 0) continue;
    // Checked like an identity file given by name: libssh2 would block reading a FIFO.
    if (const std::string problem = input_file_problem(file, kIdentityFileMaxBytes); !problem.empty()) {
      tried.push_back(fmt::format("{} ({})", file, problem));
      continue;
    }
    std::string error;
    if (auth_key_file(file, &error)) return true;
    tried.push_back(fmt::format("{} ({})", file, error));
  }
  return false;
}

void SshSession::authenticate() {
  const char* methods = libssh2_userauth_list(session_, user_.c_str(), static_cast<unsigned>(user_.size()));
  if (!methods) {
    if (libssh2_userauth_authenticated(session_)) return;  // the server accepted "none"
    DT_THROW(LaunchError, "SSH to {}: cannot list authentication methods for user {}: {}", host_, user_, last_error());
  }
  DT_ENFORCE(std::strstr(methods, "publickey") != nullptr, SshRefusedError,
             "SSH to {}: the server offers only '{}' for user {}; dtrain needs public-key authentication", host_,
             methods, user_);

  if (!options_.identity_file.empty()) {
    auth_identity_file();
    return;
  }

  std::vector<std::string> tried;
  if (const char* sock = env_get("SSH_AUTH_SOCK"); sock && *sock) {
    LIBSSH2_AGENT* agent = libssh2_agent_init(session_);
    if (!agent) {
      tried.push_back("ssh-agent: cannot initialize");
    } else if (libssh2_agent_connect(agent) != 0) {
      tried.push_back(fmt::format("ssh-agent at {}: cannot connect", sock));
      libssh2_agent_free(agent);
    } else {
      bool ok = false;
      int keys = 0;
      if (libssh2_agent_list_identities(agent) == 0) {
        libssh2_agent_publickey* identity = nullptr;
        libssh2_agent_publickey* previous = nullptr;
        while (!ok && libssh2_agent_get_identity(agent, &identity, previous) == 0) {
          ++keys;
          if (libssh2_agent_userauth(agent, user_.c_str(), identity) == 0) ok = true;
          previous = identity;
        }
      }
      tried.push_back(fmt::format("ssh-agent at {} ({} key(s))", sock, keys));
      libssh2_agent_disconnect(agent);
      libssh2_agent_free(agent);
      if (ok) return;
    }
  } else {
    tried.push_back("ssh-agent (SSH_AUTH_SOCK is not set)");
  }
  if (auth_default_keys(tried)) return;
  std::string list;
  for (const auto& t : tried) list += (list.empty() ? "" : "; ") + t;
  DT_THROW(SshRefusedError,
           "SSH to {}: public-key authentication as {} failed; tried: {}. Set an identity file (ssh identity_file / "
           "-i) or add a key to ssh-agent, and put its public key in ~{}/.ssh/authorized_keys on {}",
           host_, user_, list, user_, host_);
}

}  // namespace dtrain::launch
