// CUDA execution engine (test-only): NCCL over TCP. ncclGetUniqueId starts a bootstrap
// root that trades the ranks' listen addresses; the ranks then connect a full mesh and
// run each collective as direct exchanges plus a fixed-order (rank 0..n-1) reduction,
// inside the stream-ordered op that the runtime's device executor runs. ncclCommSplit
// trades colors and keys over the parent's mesh and connects each new group as an init.
#include <nccl.h>

#include "engine.h"
#include "nccl_net.h"
#include "nccl_reduce.h"

#include <cuda_emu_trace.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace cuda_emu::nccl;

namespace {

constexpr unsigned CONFIG_MAGIC = 0xcafebeef;

// ----------------------------------------------------------------------------
// Communicator state, shared by the handle, the init thread and queued collectives
// (which may outlive the handle after an abort: they then do nothing).
struct Comm {
  int rank = 0, nranks = 0, device = 0;
  uint64_t magic = 0;
  std::chrono::milliseconds limit{};
  bool blocking = true;
  std::atomic<bool> aborted{false};

  std::mutex mu;  // everything below; never held while waiting on the network
  std::condition_variable cv;
  ncclResult_t init_result = ncclInProgress;
  ncclResult_t async_error = ncclSuccess;
  std::string detail;    // why the communicator failed
  std::vector<int> fds;  // peer sockets by rank (-1: self); set once init succeeded
  int inflight = 0;      // collectives using fds now
  int pending = 0;       // enqueued, not finished
  bool finalizing = false;
  bool splitting = false;             // a ncclCommSplit of this communicator has not finished
  std::shared_ptr<Comm> split_child;  // ... and the communicator it is connecting, aborted with this one
  uint64_t next_seq = 0;

  std::mutex io_mu;  // one collective at a time on the sockets

  void error_set(ncclResult_t r, const std::string& why) {  // mu held
    if (async_error != ncclSuccess || aborted.load()) return;
    async_error = r;
    detail = why;
    // The byte streams are out of step now; closing our ends tells the peers at once.
    for (int fd : fds)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    fail(r, "rank " + std::to_string(rank) + ": " + why);
  }
  ~Comm() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Comm> c;
  std::thread init_thread;
  std::thread split_thread;  // a non-blocking ncclCommSplit of this communicator
};

namespace {

// Registers with the root, then connects the mesh: rank i dials every lower rank and
// accepts every higher one, so rank 0 only accepts and no two ranks wait on each other.
ncclResult_t comm_connect(Comm& c, const IdBlob& id, std::string* err) {
  Waiter w(c.limit, &c.aborted);
  Addr me;
  Fd lfd;
  if (ncclResult_t r = iface_pick(&me, err)) return r;
  if (ncclResult_t r = tcp_listen(me, &lfd, &me, err)) return r;
  if (id.from_env && c.rank == 0) {
    Addr bound;
    if (ncclResult_t r = root_start(id.root, id.magic, &bound, err)) return *err = "NCCL_COMM_ID root: " + *err, r;
  }
  std::vector<Addr> table(c.nranks);
  {
    Fd root;
    if (ncclResult_t r = tcp_connect(id.root, id.from_env != 0, w, &root, err))
      return *err = "bootstrap root: " + *err, r;
    Hello h{WIRE_TAG, c.rank, c.nranks, c.device, id.magic, process_token(), me};
    if (ncclResult_t r = io_full(root.get(), &h, sizeof h, true, w, "bootstrap register", err)) return r;
    RootReply rep{};
    if (ncclResult_t r = io_full(root.get(), &rep, sizeof rep, false, w, "bootstrap reply", err)) return r;
    if (rep.tag != WIRE_TAG) return *err = "bootstrap root sent garbage", ncclSystemError;
    if (rep.result != ncclSuccess) {
      rep.detail[sizeof rep.detail - 1] = 0;
      *err = std::string("bootstrap: ") + rep.detail;
      return static_cast<ncclResult_t>(rep.result);
    }
    if (ncclResult_t r =
            io_full(root.get(), table.data(), table.size() * sizeof(Addr), false, w, "bootstrap table", err))
      return r;
  }
  std::vector<Fd> peers(c.nranks);
  for (int j = 0; j < c.rank; ++j) {
    const std::string what = "handshake with rank " + std::to_string(j);
    if (ncclResult_t r = tcp_connect(table[j], false, w, &peers[j], err)) return *err = what + ": " + *err, r;
    PeerHello h{WIRE_TAG, c.rank, j, c.nranks, id.magic}, ack{};
    if (ncclResult_t r = io_full(peers[j].get(), &h, sizeof h, true, w, what, err)) return r;
    if (ncclResult_t r = io_full(peers[j].get(), &ack, sizeof ack, false, w, what, err)) return r;
    if (ack.tag != WIRE_TAG || ack.magic != id.magic || ack.from != j || ack.to != c.rank || ack.nranks != c.nranks)
      return *err = what + ": unexpected reply", ncclInvalidUsage;
  }
  for (int left = c.nranks - 1 - c.rank; left > 0;) {
    Fd fd;
    if (ncclResult_t r = tcp_accept(lfd.get(), w, &fd, err)) return r;
    PeerHello h{};
    std::string e2;
    if (io_full(fd.get(), &h, sizeof h, false, w, "handshake", &e2) != ncclSuccess) continue;
    if (h.tag != WIRE_TAG || h.magic != id.magic) continue;  // a stray connection
    if (h.to != c.rank || h.nranks != c.nranks || h.from <= c.rank || h.from >= c.nranks || peers[h.from].get() >= 0)
      return *err = "handshake: rank " + std::to_string(h.from) + " is not a peer this rank expects", ncclInvalidUsage;
    PeerHello ack{WIRE_TAG, c.rank, h.from, c.nranks, id.magic};
    if (ncclResult_t r = io_full(fd.get(), &ack, sizeof ack, true, w, "handshake ack", err)) return r;
    peers[h.from] = std::move(fd);
    --left;
  }
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.aborted.load()) return *err = "communicator aborted", ncclSystemError;
  c.fds.assign(c.nranks, -1);
  for (int j = 0; j < c.nranks; ++j) c.fds[j] = peers[j].release();
  return ncclSuccess;
}

void comm_init_run(const std::shared_ptr<Comm>& c, IdBlob id) {
  std::string err;
  const ncclResult_t r = comm_connect(*c, id, &err);
  std::lock_guard<std::mutex> lock(c->mu);
  c->init_result = r;
  if (r != ncclSuccess) {
    c->detail = err;
    if (!c->aborted.load()) fail(r, "rank " + std::to_string(c->rank) + " init: " + err);
  }
  c->cv.notify_all();
}

// Ends the handle: stops the init thread, unblocks and waits out a running collective,
// closes the sockets. Queued collectives keep the state alive and then do nothing.
void comm_teardown(ncclComm_t comm) {
  Comm& c = *comm->c;
  c.aborted.store(true);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.split_child) c.split_child->aborted.store(true);
  }
  if (comm->init_thread.joinable()) comm->init_thread.join();
  if (comm->split_thread.joinable()) comm->split_thread.join();
  {
    std::unique_lock<std::mutex> lock(c.mu);
    for (int fd : c.fds)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    c.cv.wait_for(lock, c.limit, [&] { return c.inflight == 0; });
    if (c.inflight == 0) {
      for (int& fd : c.fds)
        if (fd >= 0) ::close(std::exchange(fd, -1));
    }
    c.cv.notify_all();
  }
  delete comm;
}

// ----------------------------------------------------------------------------
// Collective execution (on the executor thread).
// SPLIT: ncclCommSplit's trade over the parent's mesh, numbered as the collectives are.
enum Kind : uint32_t { ALLREDUCE = 1, REDUCE_SCATTER, ALL_GATHER, BROADCAST, REDUCE, SPLIT };
const char* kind_name(uint32_t k) {
  static const char* names[] = {"?", "AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce", "CommSplit"};
  return k <= SPLIT ? names[k] : "?";
}

struct Coll {
  Kind kind;
  const char* send;
  char* recv;
  size_t count;  // the caller's count argument
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
  uint64_t seq;
  bool snapshot;  // buffers overlap other than in NCCL's in-place form
};

// Every message starts with this; the receiver checks it against its own call, so a
// rank running a different collective is reported instead of mixing data.
struct MsgHeader {
  uint32_t tag, kind;
  uint64_t seq;
  uint32_t phase, dtype, op;
  int32_t root;
  uint64_t count, bytes;
};

struct Transfer {  // one phase with one peer
  const char* out = nullptr;
  size_t out_len = 0;
  bool sending = false;
  char* in = nullptr;
  size_t in_len = 0;
  bool receiving = false;
  MsgHeader out_hdr{}, in_hdr{};
  size_t out_done = 0, in_done = 0;  // header bytes included
};

std::string header_str(const MsgHeader& h) {
  return std::string(kind_name(h.kind)) + " #" + std::to_string(h.seq) + " (phase " + std::to_string(h.phase) +
         ", dtype " + std::to_string(h.dtype) + ", op " + std::to_string(h.op) + ", root " + std::to_string(h.root) +
         ", count " + std::to_string(h.count) + ", " + std::to_string(h.bytes) + " bytes)";
}

// Moves every transfer of a phase at once, so no pair of ranks waits on each other.
ncclResult_t exchange(Comm& c, const std::vector<int>& fds, std::vector<Transfer>& t, const MsgHeader& base,
                      std::string* err) {
  constexpr size_t H = sizeof(MsgHeader);
  for (auto& x : t) {
    x.out_hdr = base;
    x.out_hdr.bytes = x.out_len;
  }
  Waiter w(c.limit, &c.aborted);
  std::vector<pollfd> pfds;
  std::vector<int> who;
  for (;;) {
    pfds.clear();
    who.clear();
    for (int j = 0; j < static_cast<int>(t.size()); ++j) {
      const Transfer& x = t[j];
      const short ev = static_cast<short>((x.sending && x.out_done < H + x.out_len ? POLLOUT : 0) |
                                          (x.receiving && x.in_done < H + x.in_len ? POLLIN : 0));
      if (ev) pfds.push_back({fds[j], ev, 0}), who.push_back(j);
    }
    if (pfds.empty()) return ncclSuccess;
    int ms = 0;
    if (ncclResult_t r = w.slice(&ms, err)) return r;
    if (::poll(pfds.data(), pfds.size(), ms) < 0 && errno != EINTR) return sock_error(errno, "poll", err);
    for (size_t p = 0; p < pfds.size(); ++p) {
      if (!pfds[p].revents) continue;
      const int j = who[p];
      Transfer& x = t[j];
      const std::string peer = "rank " + std::to_string(j);
      while (x.sending && x.out_done < H + x.out_len) {
        const char* src =
            x.out_done < H ? reinterpret_cast<const char*>(&x.out_hdr) + x.out_done : x.out + (x.out_done - H);
        const size_t len = x.out_done < H ? H - x.out_done : x.out_len - (x.out_done - H);
        const ssize_t k = ::send(fds[j], src, len, MSG_NOSIGNAL);
        if (k > 0) {
          x.out_done += static_cast<size_t>(k);
          w.progress();
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          break;
        } else if (k < 0 && errno != EINTR) {
          return sock_error(errno, "send to " + peer, err);
        }
      }
      while (x.receiving && x.in_done < H + x.in_len) {
        char* dst = x.in_done < H ? reinterpret_cast<char*>(&x.in_hdr) + x.in_done : x.in + (x.in_done - H);
        const size_t len = x.in_done < H ? H - x.in_done : x.in_len - (x.in_done - H);
        const ssize_t k = ::recv(fds[j], dst, len, 0);
        if (k > 0) {
          const bool header_now = x.in_done < H && x.in_done + static_cast<size_t>(k) >= H;
          x.in_done += static_cast<size_t>(k);
          w.progress();
          if (header_now) {
            MsgHeader want = base;
            want.bytes = x.in_len;
            if (std::memcmp(&want, &x.in_hdr, H) != 0) {
              *err = peer + " sent " + header_str(x.in_hdr) + " while this rank runs " + header_str(want);
              return ncclInvalidUsage;
            }
          }
        } else if (k == 0) {
          *err = peer + " closed the connection (process exited or aborted its communicator)";
          return ncclRemoteError;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          break;
        } else if (errno != EINTR) {
          return sock_error(errno, "recv from " + peer, err);
        }
      }
    }
  }
}

ncclResult_t coll_exec(Comm& c, const std::vector<int>& fds, const Coll& k, std::string* err) {
  const int n = c.nranks, me = c.rank;
  const size_t es = dtype_size(k.dt);
  std::vector<char> copy;
  const char* src = k.send;
  char* dst = k.recv;
  if (k.snapshot) {
    const size_t send_elems = k.kind == REDUCE_SCATTER ? k.count * n : k.count;
    copy.assign(src, src + send_elems * es);
    src = copy.data();
  }
  MsgHeader base{WIRE_TAG, k.kind,  k.seq, 0, static_cast<uint32_t>(k.dt), static_cast<uint32_t>(k.op),
                 k.root,   k.count, 0};
  std::vector<Transfer> t(n);
  auto run_phase = [&](uint32_t phase) {
    base.phase = phase;
    ncclResult_t r = exchange(c, fds, t, base, err);
    t.assign(n, Transfer{});
    return r;
  };
  std::vector<std::vector<char>> stage(n);  // what each peer contributes to our part
  auto inputs = [&](const char* own) {
    std::vector<const void*> in(n);
    for (int j = 0; j < n; ++j) in[j] = j == me ? static_cast<const void*>(own) : stage[j].data();
    return in;
  };
  switch (k.kind) {
    case ALLREDUCE: {
      // Reduce-scatter then all-gather over n balanced chunks: chunk j is reduced by
      // rank j alone, so every rank ends with the same bits.
      auto lo = [&](int j) { return k.count * static_cast<size_t>(j) / static_cast<size_t>(n); };
      auto len = [&](int j) { return lo(j + 1) - lo(j); };
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        stage[j].resize(len(me) * es);
        t[j] = Transfer{src + lo(j) * es, len(j) * es, true, stage[j].data(), len(me) * es, true};
      }
      if (ncclResult_t r = run_phase(0)) return r;
      reduce(k.dt, k.op, dst + lo(me) * es, inputs(src + lo(me) * es), len(me));
      for (int j = 0; j < n; ++j)
        if (j != me) t[j] = Transfer{dst + lo(me) * es, len(me) * es, true, dst + lo(j) * es, len(j) * es, true};
      return run_phase(1);
    }
    case REDUCE_SCATTER: {
      const size_t bytes = k.count * es;
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        stage[j].resize(bytes);
        t[j] = Transfer{src + j * bytes, bytes, true, stage[j].data(), bytes, true};
      }
      if (ncclResult_t r = run_phase(0)) return r;
      reduce(k.dt, k.op, dst, inputs(src + me * bytes), k.count);
      return ncclSuccess;
    }
    case ALL_GATHER: {
      const size_t bytes = k.count * es;
      for (int j = 0; j < n; ++j)
        if (j != me) t[j] = Transfer{src, bytes, true, dst + j * bytes, bytes, true};
      if (ncclResult_t r = run_phase(0)) return r;
      if (dst + me * bytes != src) std::memmove(dst + me * bytes, src, bytes);
      return ncclSuccess;
    }
    case BROADCAST: {
      const size_t bytes = k.count * es;
      if (me == k.root) {
        for (int j = 0; j < n; ++j)
          if (j != me) t[j] = Transfer{src, bytes, true, nullptr, 0, false};
      } else {
        t[k.root] = Transfer{nullptr, 0, false, dst, bytes, true};
      }
      if (ncclResult_t r = run_phase(0)) return r;
      if (me == k.root && dst != src) std::memmove(dst, src, bytes);
      return ncclSuccess;
    }
    case REDUCE: {
      const size_t bytes = k.count * es;
      if (me != k.root) {
        t[k.root] = Transfer{src, bytes, true, nullptr, 0, false};
        return run_phase(0);
      }
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        stage[j].resize(bytes);
        t[j] = Transfer{nullptr, 0, false, stage[j].data(), bytes, true};
      }
      if (ncclResult_t r = run_phase(0)) return r;
      reduce(k.dt, k.op, dst, inputs(src), k.count);
      return ncclSuccess;
    }
    case SPLIT: break;  // not a stream-ordered collective (split_trade)
  }
  *err = "unknown collective";
  return ncclInternalError;
}

void coll_run(Comm& c, const Coll& k) {
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    // A failed or aborted communicator skips its queued work, leaving outputs untouched.
    if (c.aborted.load() || c.async_error != ncclSuccess || g_exiting.load()) return;
    ++c.inflight;
    fds = c.fds;
  }
  std::string err;
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> io(c.io_mu);
    r = coll_exec(c, fds, k, &err);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  --c.inflight;
  if (r != ncclSuccess) c.error_set(r, std::string(kind_name(k.kind)) + " #" + std::to_string(k.seq) + ": " + err);
  c.cv.notify_all();
}

// Counts an enqueued collective until it ran, or until the runtime dropped it unrun.
struct Ticket {
  std::shared_ptr<Comm> c;
  bool done = false;
  void finish() {
    if (std::exchange(done, true)) return;
    std::lock_guard<std::mutex> lock(c->mu);
    --c->pending;
    c->cv.notify_all();
  }
  ~Ticket() { finish(); }
};

bool overlaps(const char* a, size_t an, const char* b, size_t bn) { return an && bn && a < b + bn && b < a + an; }

// Call-time checks (nothing is enqueued on a bad call), then the stream-ordered op.
ncclResult_t coll_submit(const char* name, ncclComm_t comm, Coll k, cudaStream_t stream) {
  if (!comm) return fail(ncclInvalidArgument, std::string(name) + ": comm is NULL");
  auto c = comm->c;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->init_result == ncclInProgress)
      return fail(ncclInvalidUsage, std::string(name) + ": communicator still initialising");
    if (c->init_result != ncclSuccess) return c->init_result;
    if (c->finalizing) return fail(ncclInvalidUsage, std::string(name) + ": communicator finalized");
    if (c->splitting)
      return fail(ncclInvalidUsage, std::string(name) + ": a ncclCommSplit of this communicator is still in progress");
    if (c->async_error != ncclSuccess) return c->async_error;
  }
  const std::string where = std::string(name) + " (rank " + std::to_string(c->rank) + ")";
  if (k.dt < 0 || k.dt >= ncclNumTypes) return fail(ncclInvalidArgument, where + ": invalid datatype");
  const bool reducing = k.kind == ALLREDUCE || k.kind == REDUCE_SCATTER || k.kind == REDUCE;
  if (!reducing) k.op = ncclSum;
  if (k.op < 0 || k.op >= ncclNumOps) return fail(ncclInvalidArgument, where + ": invalid reduction op");
  const bool rooted = k.kind == BROADCAST || k.kind == REDUCE;
  if (!rooted) k.root = -1;
  if (rooted && (k.root < 0 || k.root >= c->nranks))
    return fail(ncclInvalidArgument, where + ": root " + std::to_string(k.root) + " out of range");
  const int sdev = cuda_emu::stream_device(stream);
  if (sdev != c->device)
    return fail(ncclInvalidArgument, where + ": stream is " +
                                         (sdev < 0 ? std::string("invalid") : "on device " + std::to_string(sdev)) +
                                         ", the communicator on device " + std::to_string(c->device));
  if (k.count == 0) return ncclSuccess;
  const size_t es = dtype_size(k.dt), n = static_cast<size_t>(c->nranks);
  if (k.count > (SIZE_MAX / 2) / es / n) return fail(ncclInvalidArgument, where + ": count too large");
  size_t send_elems = k.count, recv_elems = k.count;
  if (k.kind == REDUCE_SCATTER) send_elems *= n;
  if (k.kind == ALL_GATHER) recv_elems *= n;
  const bool is_root = k.root == c->rank;
  const bool uses_send = !rooted || k.kind == REDUCE || is_root;
  const bool uses_recv = !(k.kind == REDUCE && !is_root);
  auto device_range = [&](const void* p, size_t bytes, const char* which) {
    auto a = cuda_emu::alloc_find(p, bytes);
    if (p && a && !a->pinned_host && a->device == c->device) return ncclSuccess;
    return fail(ncclInvalidArgument, where + ": " + which + " " + std::to_string(reinterpret_cast<uintptr_t>(p)) +
                                         " (+" + std::to_string(bytes) + " bytes) is not device memory of device " +
                                         std::to_string(c->device));
  };
  if (uses_send)
    if (ncclResult_t r = device_range(k.send, send_elems * es, "sendbuff")) return r;
  if (uses_recv)
    if (ncclResult_t r = device_range(k.recv, recv_elems * es, "recvbuff")) return r;
  if (uses_send && uses_recv && overlaps(k.send, send_elems * es, k.recv, recv_elems * es)) {
    const size_t me = static_cast<size_t>(c->rank);
    const bool in_place = k.kind == ALL_GATHER       ? k.send == k.recv + me * k.count * es
                          : k.kind == REDUCE_SCATTER ? k.send + me * k.count * es == k.recv
                                                     : k.send == k.recv;
    k.snapshot = !in_place;
  }
  // Each run is a collective of its own: its sequence number is taken when it is issued
  // (now, or at every launch of a graph that captured it).
  auto issue = [c, k]() mutable -> std::function<void()> {
    auto ticket = std::make_shared<Ticket>();
    ticket->c = c;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      k.seq = c->next_seq++;
      ++c->pending;
    }
    return [ticket, k] {
      coll_run(*ticket->c, k);
      ticket->finish();
    };
  };
  const cudaError_t e = cuda_emu::enqueue_replayable(stream, name, issue, /*eager=*/true);
  if (e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureImplicit)
    return fail(ncclInvalidUsage, where + ": " + cudaGetErrorString(e));  // nothing issued, no number spent
  if (e != cudaSuccess) {
    // The sequence number is spent: peers would wait for this collective forever.
    std::lock_guard<std::mutex> lock(c->mu);
    c->error_set(ncclUnhandledCudaError, where + ": enqueue failed: " + cudaGetErrorString(e));
    return ncclUnhandledCudaError;
  }
  cuda_emu::trace_collective(name, k.count, k.dt, c->rank, c->device);
  return ncclSuccess;
}

thread_local int t_group_depth = 0;

// ----------------------------------------------------------------------------
// Split. Phase 0: every rank sends its (color, key) to every other over the parent's mesh,
// as a message of kind SPLIT with the parent's next sequence number, so a rank that runs a
// collective there instead fails both sides. Phase 1: each new communicator's rank 0 starts
// a bootstrap root and sends its id to the other members. The members then connect as
// ncclCommInitRank's ranks do, and only then is the split complete.
struct SplitJob {
  std::shared_ptr<Comm> parent;
  ncclComm* child = nullptr;  // the new handle; nullptr for NCCL_SPLIT_NOCOLOR
  int color = 0, key = 0;
  uint64_t seq = 0;
  ncclComm_t* newcomm = nullptr;
};

ncclResult_t split_trade(Comm& p, const std::vector<int>& fds, const SplitJob& j, int* rank, int* nranks, IdBlob* id,
                         std::string* err) {
  const int n = p.nranks, me = p.rank;
  std::vector<int32_t> ck(2 * static_cast<size_t>(n));
  ck[2 * me] = j.color;
  ck[2 * me + 1] = j.key;
  MsgHeader base{WIRE_TAG, SPLIT, j.seq, 0, 0, 0, -1, 2, 0};
  std::vector<Transfer> t(n);
  for (int q = 0; q < n; ++q)
    if (q != me)
      t[q] = Transfer{reinterpret_cast<const char*>(&ck[2 * me]), 2 * sizeof(int32_t), true,
                      reinterpret_cast<char*>(&ck[2 * q]),        2 * sizeof(int32_t), true};
  if (ncclResult_t r = exchange(p, fds, t, base, err)) return r;
  // The members of this rank's color by (key, parent rank): their order is the new ranks.
  std::vector<std::pair<int, int>> members;
  if (j.color != NCCL_SPLIT_NOCOLOR)
    for (int q = 0; q < n; ++q)
      if (ck[2 * q] == j.color) members.emplace_back(ck[2 * q + 1], q);
  std::sort(members.begin(), members.end());
  *nranks = static_cast<int>(members.size());
  for (int i = 0; i < *nranks; ++i)
    if (members[i].second == me) *rank = i;
  const int leader = members.empty() ? -1 : members[0].second;
  base.phase = 1;
  base.count = sizeof(IdBlob);
  t.assign(n, Transfer{});
  if (leader == me) {
    Addr at;
    *id = IdBlob{ID_TAG, 0, {}, random64()};
    if (ncclResult_t r = iface_pick(&at, err)) return r;
    if (ncclResult_t r = root_start(at, id->magic, &id->root, err)) return *err = "bootstrap root: " + *err, r;
    for (const auto& m : members)
      if (m.second != me)
        t[m.second] = Transfer{reinterpret_cast<const char*>(id), sizeof *id, true, nullptr, 0, false};
  } else if (leader >= 0) {
    t[leader] = Transfer{nullptr, 0, false, reinterpret_cast<char*>(id), sizeof *id, true};
  }
  return exchange(p, fds, t, base, err);
}

// The whole split, on the caller's thread (blocking) or the parent handle's split thread.
// Success writes *newcomm; failure fails the parent (the split is one of its collectives)
// and tears the new communicator down.
ncclResult_t split_run(const SplitJob& j) {
  Comm& p = *j.parent;
  std::string err;
  ncclResult_t r = ncclSuccess;
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.aborted.load() || g_exiting.load()) {
      r = ncclSystemError, err = "communicator aborted";
    } else if (p.async_error != ncclSuccess) {
      r = p.async_error, err = p.detail;
    } else {
      ++p.inflight;
      fds = p.fds;
    }
  }
  int rank = -1, nranks = 0;
  IdBlob id{};
  if (r == ncclSuccess) {
    {
      std::lock_guard<std::mutex> io(p.io_mu);
      r = split_trade(p, fds, j, &rank, &nranks, &id, &err);
    }
    std::lock_guard<std::mutex> lock(p.mu);
    --p.inflight;
    p.cv.notify_all();
  }
  if (r == ncclSuccess && j.child) {
    Comm& c = *j.child->c;
    c.rank = rank;
    c.nranks = nranks;
    c.magic = id.magic;
    r = comm_connect(c, id, &err);
    if (r != ncclSuccess)
      err = "new communicator (rank " + std::to_string(rank) + " of " + std::to_string(nranks) + "): " + err;
    std::lock_guard<std::mutex> lock(c.mu);
    c.init_result = r;
    if (r != ncclSuccess) c.detail = err;
    c.cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.split_child.reset();
    if (r != ncclSuccess) p.error_set(r, std::string(kind_name(SPLIT)) + " #" + std::to_string(j.seq) + ": " + err);
    else if (j.child) *j.newcomm = j.child;
    p.splitting = false;
    p.cv.notify_all();
  }
  if (r != ncclSuccess && j.child) comm_teardown(j.child);
  return r;
}

}  // namespace

// ----------------------------------------------------------------------------
// API: library and communicators.
ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string out;
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->c->mu);
    if (!comm->c->detail.empty()) return (out = comm->c->detail).c_str();
  }
  return (out = last_error()).c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (!unique_id) return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
  exit_hook_install();
  std::memset(unique_id, 0, sizeof *unique_id);
  IdBlob id{};
  std::string err;
  if (const char* env = std::getenv("NCCL_COMM_ID"); env && *env) {
    if (ncclResult_t r = id_parse_env(env, &id, &err)) return fail(r, err);
  } else {
    Addr at;
    if (ncclResult_t r = iface_pick(&at, &err)) return fail(r, "ncclGetUniqueId: " + err);
    id.tag = ID_TAG;
    id.magic = random64();
    if (ncclResult_t r = root_start(at, id.magic, &id.root, &err)) return fail(r, "ncclGetUniqueId: " + err);
  }
  std::memcpy(unique_id->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1) return fail(ncclInvalidArgument, "ncclCommInitRank: nranks " + std::to_string(nranks) + " < 1");
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " out of range for nranks " +
                                         std::to_string(nranks));
  IdBlob id;
  std::memcpy(&id, comm_id.internal, sizeof id);
  if (id.tag != ID_TAG)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
  bool blocking = true;
  if (config) {
    if (config->magic != CONFIG_MAGIC || config->size < offsetof(ncclConfig_t, netName))
      return fail(ncclInvalidArgument, "ncclCommInitRankConfig: config not set up with NCCL_CONFIG_INITIALIZER");
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
      return fail(ncclInvalidArgument, "ncclCommInitRankConfig: blocking must be 0 or 1");
    blocking = config->blocking != 0;
  }
  exit_hook_install();
  const int dev = cuda_emu::device_current();
  if (dev < 0 || dev >= cuda_emu::device_count())
    return fail(ncclUnhandledCudaError, "ncclCommInitRank: no valid current CUDA device");
  auto c = std::make_shared<Comm>();
  c->rank = rank;
  c->nranks = nranks;
  c->device = dev;
  c->magic = id.magic;
  c->limit = wait_limit();
  c->blocking = blocking;
  auto* h = new ncclComm{c, {}, {}};
  if (!blocking) {
    h->init_thread = std::thread(comm_init_run, c, id);
    *comm = h;
    return ncclInProgress;
  }
  comm_init_run(c, id);
  if (c->init_result != ncclSuccess) {
    const ncclResult_t r = c->init_result;
    comm_teardown(h);
    return r;
  }
  *comm = h;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, nullptr);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: bad arguments");
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id)) return r;
  int saved = 0;
  cudaGetDevice(&saved);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t result = ncclSuccess;
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  for (int i = 0; i < ndev && result == ncclSuccess; ++i) {
    if (cudaSetDevice(devlist ? devlist[i] : i) != cudaSuccess) {
      result = fail(ncclInvalidArgument, "ncclCommInitAll: invalid device");
      break;
    }
    const ncclResult_t r = ncclCommInitRankConfig(&comms[i], ndev, id, i, &cfg);
    if (r != ncclInProgress) result = r;
  }
  cudaSetDevice(saved);
  for (int i = 0; i < ndev && result == ncclSuccess; ++i) {
    ncclResult_t s = ncclInProgress;
    while (s == ncclInProgress) {
      ncclCommGetAsyncError(comms[i], &s);
      if (s == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    result = s;
  }
  if (result != ncclSuccess)
    for (int i = 0; i < ndev; ++i)
      if (comms[i]) ncclCommAbort(std::exchange(comms[i], nullptr));
  return result;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommSplit: comm is NULL");
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = nullptr;
  const std::shared_ptr<Comm> p = comm->c;
  const std::string where = "ncclCommSplit (rank " + std::to_string(p->rank) + ")";
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument,
                where + ": color " + std::to_string(color) + " is neither non-negative nor NCCL_SPLIT_NOCOLOR");
  bool blocking = p->blocking;  // the new communicator's; no config: the parent's
  if (config) {
    if (config->magic != CONFIG_MAGIC || config->size < offsetof(ncclConfig_t, netName))
      return fail(ncclInvalidArgument, where + ": config not set up with NCCL_CONFIG_INITIALIZER");
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
      return fail(ncclInvalidArgument, where + ": blocking must be 0 or 1");
    if (config->size >= offsetof(ncclConfig_t, splitShare) + sizeof(int) &&
        config->splitShare != NCCL_CONFIG_UNDEF_INT && config->splitShare != 0 && config->splitShare != 1)
      return fail(ncclInvalidArgument, where + ": splitShare must be 0 or 1");
    blocking = config->blocking != 0;  // undefined (INT_MIN): NCCL's default, blocking
  }
  if (t_group_depth > 0)
    return fail(ncclInvalidUsage, where + ": inside ncclGroupStart/ncclGroupEnd, which this subset does not support");
  auto parent_ready = [&]() -> ncclResult_t {  // p->mu held
    if (p->init_result == ncclInProgress) return fail(ncclInvalidUsage, where + ": communicator still initialising");
    if (p->init_result != ncclSuccess) return p->init_result;
    if (p->finalizing) return fail(ncclInvalidUsage, where + ": communicator finalized");
    if (p->async_error != ncclSuccess) return p->async_error;
    if (p->splitting)
      return fail(ncclInvalidUsage, where +
                                        ": the previous split of this communicator has not finished "
                                        "(ncclCommGetAsyncError reports ncclInProgress until it has)");
    if (p->pending > 0)
      return fail(ncclInvalidUsage, where + ": " + std::to_string(p->pending) +
                                        " collective(s) of this communicator still outstanding; NCCL allows none "
                                        "during a split (it may deadlock): synchronize their streams first");
    return ncclSuccess;
  };
  {
    std::lock_guard<std::mutex> lock(p->mu);
    if (ncclResult_t r = parent_ready()) return r;
  }
  if (comm->split_thread.joinable()) comm->split_thread.join();  // the previous split, finished
  SplitJob j{p, nullptr, color, key, 0, newcomm};
  if (color != NCCL_SPLIT_NOCOLOR) {
    auto c = std::make_shared<Comm>();
    c->device = p->device;  // the new communicator shares its parent's device
    c->limit = p->limit;
    c->blocking = blocking;
    j.child = new ncclComm{c, {}, {}};
  }
  {
    std::lock_guard<std::mutex> lock(p->mu);
    if (ncclResult_t r = parent_ready()) {
      delete j.child;
      return r;
    }
    p->splitting = true;
    p->split_child = j.child ? j.child->c : nullptr;
    j.seq = p->next_seq++;
  }
  // The call itself blocks as the parent does (NCCL launches the split as a job of the
  // parent's), whatever config says of the new communicator.
  if (p->blocking) return split_run(j);
  comm->split_thread = std::thread([j] { split_run(j); });
  return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  Comm& c = *comm->c;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.init_result != ncclSuccess) *async_error = c.init_result;  // includes ncclInProgress
  else if (c.async_error != ncclSuccess) *async_error = c.async_error;
  else *async_error = c.splitting || (c.finalizing && c.pending > 0) ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

// Flushes: waits (blocking comm) or lets ncclCommGetAsyncError report (non-blocking)
// until every collective enqueued on the communicator has run.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  Comm& c = *comm->c;
  std::unique_lock<std::mutex> lock(c.mu);
  if (c.init_result != ncclSuccess) return fail(ncclInvalidUsage, "ncclCommFinalize: communicator not initialised");
  if (c.finalizing) return fail(ncclInvalidUsage, "ncclCommFinalize: called twice");
  if (c.splitting) return fail(ncclInvalidUsage, "ncclCommFinalize: a ncclCommSplit is still in progress");
  c.finalizing = true;
  if (!c.blocking) return ncclInProgress;
  c.cv.wait_for(lock, c.limit, [&] { return c.pending == 0 || c.async_error != ncclSuccess; });
  if (c.async_error != ncclSuccess) return c.async_error;
  return c.pending == 0 ? ncclSuccess : fail(ncclSystemError, "ncclCommFinalize: collectives did not finish in time");
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  Comm& c = *comm->c;
  {
    std::unique_lock<std::mutex> lock(c.mu);
    if (c.init_result == ncclSuccess)
      c.cv.wait_for(lock, c.limit, [&] { return c.pending == 0 || c.async_error != ncclSuccess; });
  }
  comm_teardown(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm_teardown(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: NULL argument");
  *count = comm->c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
  *device = comm->c->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
  *rank = comm->c->rank;
  return ncclSuccess;
}

// ----------------------------------------------------------------------------
// API: collectives and groups.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return coll_submit("ncclAllReduce", comm,
                     Coll{ALLREDUCE, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff), count, datatype,
                          op, -1, 0, false},
                     stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return coll_submit("ncclReduceScatter", comm,
                     Coll{REDUCE_SCATTER, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff), recvcount,
                          datatype, op, -1, 0, false},
                     stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return coll_submit("ncclAllGather", comm,
                     Coll{ALL_GATHER, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff), sendcount,
                          datatype, ncclSum, -1, 0, false},
                     stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return coll_submit("ncclBroadcast", comm,
                     Coll{BROADCAST, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff), count, datatype,
                          ncclSum, root, 0, false},
                     stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return coll_submit("ncclReduce", comm,
                     Coll{REDUCE, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff), count, datatype, op,
                          root, 0, false},
                     stream);
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  --t_group_depth;
  return ncclSuccess;
}
