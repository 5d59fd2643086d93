// CUDA execution engine (test-only), internal to the NCCL subset: TCP sockets with
// bounded, abortable waits, interface choice, unique ids and the bootstrap root that
// nccl.cpp's communicators register with.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cuda_emu::nccl {

using Clock = std::chrono::steady_clock;

constexpr uint32_t ID_TAG = 0x44544e31;    // marks an id made here ("DTN1")
constexpr uint32_t WIRE_TAG = 0x44544e57;  // first field of every bootstrap and data message
constexpr int POLL_SLICE_MS = 50;          // how late an abort or exit is noticed

// Set by the exit hook: every wait gives up so executors and roots can be joined.
extern std::atomic<bool> g_exiting;

// ----------------------------------------------------------------------------
// Errors and environment.
bool debug_warn();  // NCCL_DEBUG asks for warnings
// Records msg for ncclGetLastError (and prints it under NCCL_DEBUG); returns r.
ncclResult_t fail(ncclResult_t r, const std::string& msg);
std::string last_error();
std::chrono::milliseconds wait_limit();  // NCCL_EMU_TIMEOUT_MS, default 300000
uint64_t random64();
uint64_t process_token();  // random, fixed for the process

// ----------------------------------------------------------------------------
// Sockets.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Addr {
  uint32_t ip = 0;    // network order
  uint16_t port = 0;  // network order
  uint16_t pad = 0;
};

std::string addr_str(const Addr& a);

// A bound on waiting without progress, which also watches the abort flag.
class Waiter {
 public:
  Waiter(std::chrono::milliseconds limit, const std::atomic<bool>* abort) : limit_(limit), abort_(abort) {}
  void progress() { last_ = Clock::now(); }
  // ncclSuccess and the milliseconds to poll for next, or why to stop.
  ncclResult_t slice(int* ms, std::string* err) const {
    if (g_exiting.load()) return *err = "process is exiting", ncclSystemError;
    if (abort_ && abort_->load()) return *err = "communicator aborted", ncclSystemError;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(last_ + limit_ - Clock::now()).count();
    if (left <= 0)
      return *err = "no progress for " + std::to_string(limit_.count()) + " ms (NCCL_EMU_TIMEOUT_MS)", ncclSystemError;
    *ms = static_cast<int>(std::min<long long>(POLL_SLICE_MS, left));
    return ncclSuccess;
  }

 private:
  std::chrono::milliseconds limit_;
  const std::atomic<bool>* abort_;
  Clock::time_point last_ = Clock::now();
};

// A lost peer is a remote error; anything else the system's.
ncclResult_t sock_error(int err, const std::string& what, std::string* out);
// Moves exactly n bytes (small bootstrap messages).
ncclResult_t io_full(int fd, void* buf, size_t n, bool sending, Waiter& w, const std::string& what, std::string* err);
// retry_refused: the root of an NCCL_COMM_ID id may not listen yet.
ncclResult_t tcp_connect(const Addr& a, bool retry_refused, Waiter& w, Fd* out, std::string* err);
ncclResult_t tcp_listen(const Addr& want, Fd* out, Addr* bound, std::string* err);
ncclResult_t tcp_accept(int lfd, Waiter& w, Fd* out, std::string* err);
// The IPv4 address NCCL would use (NCCL_SOCKET_IFNAME, else not loopback/docker first).
ncclResult_t iface_pick(Addr* out, std::string* err);

// ----------------------------------------------------------------------------
// Ids and the bootstrap protocol.
struct IdBlob {
  uint32_t tag;
  uint32_t from_env;  // NCCL_COMM_ID: rank 0 starts the root during init
  Addr root;
  uint64_t magic;
};
static_assert(sizeof(IdBlob) <= sizeof(ncclUniqueId));

struct Hello {  // rank -> root
  uint32_t tag;
  int32_t rank, nranks, device;
  uint64_t magic, process;
  Addr listen;
};
struct RootReply {  // root -> rank, followed by nranks Addrs on success
  uint32_t tag;
  int32_t result;
  char detail[120];
};
struct PeerHello {  // higher rank -> lower rank on a mesh connection, echoed as the ack
  uint32_t tag;
  int32_t from, to, nranks;
  uint64_t magic;
};

// The id NCCL_COMM_ID (<host>:<port>) describes; the same in every process.
ncclResult_t id_parse_env(const char* env, IdBlob* id, std::string* err);
// Starts a root thread listening at `at` for the ranks of the id with `magic`.
ncclResult_t root_start(const Addr& at, uint64_t magic, Addr* bound, std::string* err);
// Makes process exit release blocked collectives and join the roots (call before use).
void exit_hook_install();

}  // namespace cuda_emu::nccl
