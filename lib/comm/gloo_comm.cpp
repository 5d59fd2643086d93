// Gloo backend: ring collectives on gloo's TCP transport (full mesh via the rendezvous
// store; small allreduces as one direct all-to-all exchange), bf16/fp16 reduced through
// fp32, every gloo failure turned into CommError, and abort() that fails blocked
// collectives at once.
#include "comm/gloo_comm.h"

#include "core/check.h"
#include "core/log.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <vector>

namespace dtrain::comm {

namespace {

// ---------------------------------------------------------------------------
// Element-wise reductions out = a (op) b; out may alias a or b. bf16/fp16 have no gloo type: their bit patterns are widened to fp32, reduced and
// rounded back to nearest even, so a SUM is rounded once per pairwise step of the
// algorithm (exact while partial sums stay representable), as NCCL does.

// The op is a template parameter so that each loop is branch-free and vectorizes (a
// per-element switch on the op kept the fp32 SUM scalar: a third of a 4 MiB allreduce).
template <ReduceOp OP>
inline float reduce_pair(float x, float y) {
  if constexpr (OP == ReduceOp::MAX) return (x != x || x > y) ? x : y;  // NaN propagates
  return x + y;                                                         // SUM; AVG divides later
}

template <ReduceOp OP, float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_half(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Store(reduce_pair<OP>(Load(x[i]), Load(y[i])));
}

// fp32 in explicit 4-wide vectors: the build's -O2 does not vectorize a loop of unknown
// length whose output may alias an input, and the scalar loop cost a third of a 4 MiB
// allreduce. Each block is loaded before it is stored, so out may alias a or b.
template <ReduceOp OP>
void reduce_f32(void* out, const void* a, const void* b, size_t n) {
  using V = float __attribute__((vector_size(16)));
  auto* o = static_cast<char*>(out);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    V vx, vy, r;
    std::memcpy(&vx, x + i * 4, sizeof(V));
    std::memcpy(&vy, y + i * 4, sizeof(V));
    if constexpr (OP == ReduceOp::MAX) r = (vx != vx || vx > vy) ? vx : vy;
    else r = vx + vy;
    std::memcpy(o + i * 4, &r, sizeof(V));
  }
  for (; i < n; ++i) {
    float fx, fy;
    std::memcpy(&fx, x + i * 4, 4);
    std::memcpy(&fy, y + i * 4, 4);
    fx = reduce_pair<OP>(fx, fy);
    std::memcpy(o + i * 4, &fx, 4);
  }
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <ReduceOp OP>
ReduceFn reduce_function_for(DType dtype) {
  switch (dtype) {
    case DType::F32: return &reduce_f32<OP>;
    case DType::BF16: return &reduce_half<OP, bf16_to_f32, f32_to_bf16>;
    case DType::F16: return &reduce_half<OP, f16_to_f32, f32_to_f16>;
  }
  DT_THROW(InternalError, "unknown dtype {}", static_cast<int>(dtype));
}

ReduceFn reduce_function(DType dtype, ReduceOp op) {
  return op == ReduceOp::MAX ? reduce_function_for<ReduceOp::MAX>(dtype) : reduce_function_for<ReduceOp::SUM>(dtype);
}

// AVG = SUM, then one division by the rank count in fp32 and one rounding to the
// dtype. For bf16/fp16 the sum was already rounded per step, so the average can differ
// from the exact mean by those roundings plus one final rounding.
void divide_in_place(void* data, size_t count, DType dtype, int n) {
  const float d = static_cast<float>(n);
  if (dtype == DType::F32) {
    auto* p = static_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) p[i] /= d;
    return;
  }
  for (size_t i = 0; i < count; ++i) dtype_store(data, i, dtype, dtype_load(data, i, dtype) / d);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) break;
    auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string("cpu") : "cpu " + line.substr(start);
  }
  return "cpu";
}

// ---------------------------------------------------------------------------
// Why the collectives below are ring algorithms written on gloo's transport instead of
// gloo::allreduce & co: abort() must wake a collective blocked on another thread.
// gloo's option-style collectives wait on UnboundBuffers they create internally, and the
// only hook that fails those waits (tcp::Pair::signalExceptionExternal) lives in
// gloo/transport/tcp/pair.h, which needs gloo/common/memory.h, a header the Debian
// package does not ship. Writing the rings on UnboundBuffers we create lets abort()
// call UnboundBuffer::abortWaitSend/abortWaitRecv on exactly the buffers in use. The
// rings are the textbook bandwidth-optimal ones (reduce-scatter 1x, allreduce 2x the
// buffer per rank) and give a true reduce-scatter, not allreduce + slice.

constexpr uint64_t kSlotPrefix = uint64_t{0xd7} << 56;  // apart from gloo's own prefixes
constexpr size_t kBroadcastSegment = 512 * 1024;        // pipeline step of the broadcast ring
constexpr size_t kRingPiece = 8 * 1024 * 1024;          // bytes of a chunk the reduce-scatter ring moves at a time
// Allreduces whose (n-1) x bytes stay under this go direct: every rank sends its whole
// buffer to every other rank and reduces the n contributions itself. That is one
// network step instead of the ring's 2(n-1) dependent ones, and each of those costs a
// wakeup of gloo's transport thread plus one of ours: for small buffers the ring is all
// latency (milliseconds on a busy machine), the direct exchange one round of it.
// (256 KiB was measured slower than the ring at 3 ranks x 128 KiB over veth.)
constexpr size_t kDirectMaxTraffic = 128 * 1024;

// Balanced split of `count` elements into n chunks: chunk c is [bound(c), bound(c+1)).
inline size_t chunk_bound(size_t count, int n, int c) {
  return static_cast<size_t>((static_cast<unsigned __int128>(count) * c) / n);
}

// A prefix store that keeps its inner store alive (gloo's PrefixStore holds a reference):
// a split group's keys live under their own prefix in the store the world met through.
class OwningPrefixStore final : public gloo::rendezvous::PrefixStore {
 public:
  OwningPrefixStore(const std::string& prefix, std::shared_ptr<gloo::rendezvous::Store> inner)
      : PrefixStore(prefix, *inner), inner_(std::move(inner)) {}

 private:
  std::shared_ptr<gloo::rendezvous::Store> inner_;
};

class GlooCommunicator final : public Communicator {
 public:
  /// device == nullptr: bind a TCP device from opts (a split group shares its parent's).
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size, const GlooOptions& opts,
                   std::shared_ptr<gloo::transport::Device> device = nullptr);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::GLOO; }
  bool on_device() const override { return false; }
  std::string device_name() const override { return cpu_model_; }

  uint64_t bytes_sent() const override { return sent_.load(); }
  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override;
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) override;
  void barrier() override;
  void abort() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  using UnboundBuffer = gloo::transport::UnboundBuffer;

  // An UnboundBuffer registered for abort() for as long as the collective uses it.
  class OpBuffer {
   public:
    OpBuffer(GlooCommunicator& comm, void* ptr, size_t bytes);
    ~OpBuffer();
    OpBuffer(const OpBuffer&) = delete;
    OpBuffer& operator=(const OpBuffer&) = delete;
    UnboundBuffer* operator->() { return buf_.get(); }
    // Every send goes through here, so bytes_sent() counts what this rank put on the wire.
    void send(int dst, uint64_t slot, size_t offset, size_t bytes) {
      comm_.sent_ += bytes;
      buf_->send(dst, slot, offset, bytes);
    }

   private:
    GlooCommunicator& comm_;
    std::unique_ptr<UnboundBuffer> buf_;
  };

  // Runs one collective: refuses when aborted or broken, gives it a fresh slot, and
  // turns every gloo exception into CommError (marking the communicator broken).
  void run(const char* what, const std::function<void(uint64_t slot)>& body);
  // Wait for one send/recv on b; a false return from gloo means abort() woke us.
  void wait_send(OpBuffer& b);
  void wait_recv(OpBuffer& b);
  // Ring reduce-scatter of src (bounds[n] elements split by `bounds`): on return `mine`
  // (chunk rank_'s length; it may be that chunk of src) holds chunk rank_ reduced over all
  // ranks (no AVG division). src is only read; the partial sums in transit use
  // 2 x kRingPiece bytes of scratch.
  void ring_reduce_scatter(const void* src, void* mine, const std::vector<size_t>& bounds, DType dtype, ReduceOp op,
                           uint64_t slot);
  // In-place ring all-gather: chunk r of data (split by bounds) is rank r's on entry.
  void ring_all_gather(void* data, size_t bytes_per_elem, const std::vector<size_t>& bounds, uint64_t slot);
  // Allreduce for small buffers: all-to-all exchange, then every rank reduces the
  // contributions in rank order (so every rank computes bit-identical results).
  void direct_allreduce(const void* src, void* dst, size_t count, DType dtype, ReduceOp op, uint64_t slot);

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<gloo::rendezvous::Store> store_;  // for the groups split from this one
  const GlooOptions opts_;
  int splits_ = 0;  // split() calls so far: each group's prefix in the store
  std::string cpu_model_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 0;
  std::vector<char> scratch_;   // ring_reduce_scatter's two pieces in transit
  std::vector<char> gathered_;  // direct_allreduce: every rank's contribution, rank order

  std::mutex abort_mutex_;  // guards aborted_ transitions and active_
  std::atomic<bool> aborted_{false};
  std::vector<UnboundBuffer*> active_;  // buffers of the running collective
  std::string broken_;                  // first failure; touched only by the collective thread
  std::atomic<uint64_t> sent_{0};       // bytes_sent()
};

GlooCommunicator::OpBuffer::OpBuffer(GlooCommunicator& comm, void* ptr, size_t bytes)
    : comm_(comm), buf_(comm.context_->createUnboundBuffer(ptr, bytes)) {
  std::lock_guard<std::mutex> lock(comm_.abort_mutex_);
  comm_.active_.push_back(buf_.get());
  // Registered before the check, under the lock abort() takes: either abort() sees this
  // buffer or we see the flag.
  if (comm_.aborted_.load()) {
    buf_->abortWaitSend();
    buf_->abortWaitRecv();
  }
}

GlooCommunicator::OpBuffer::~OpBuffer() {
  std::lock_guard<std::mutex> lock(comm_.abort_mutex_);
  std::erase(comm_.active_, buf_.get());
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                                   const GlooOptions& opts, std::shared_ptr<gloo::transport::Device> device)
    : rank_(rank), size_(size), timeout_(opts.timeout), store_(store), opts_(opts), cpu_model_(cpu_model_name()),
      device_(std::move(device)) {
  DT_ENFORCE(store != nullptr, UsageError, "comm_create_gloo needs a rendezvous store");
  DT_ENFORCE_GT(size, 0, UsageError, "world size must be positive");
  DT_ENFORCE(rank >= 0 && rank < size, UsageError, "rank {} out of range for world size {}", rank, size);
  DT_ENFORCE(opts.interface.empty() || opts.address.empty(), UsageError,
             "set either the Gloo interface ('{}') or the address ('{}'), not both", opts.interface, opts.address);
  DT_ENFORCE_GT(opts.timeout.count(), 0, UsageError, "Gloo timeout must be positive (milliseconds)");

  // gloo writes to its sockets with writev(2), which raises SIGPIPE when a peer has
  // closed its end: a dead peer must surface as CommError, not kill this process (the
  // Python hosts gloo usually runs in ignore SIGPIPE for the same reason). A handler
  // the program installed itself is left alone.
  struct sigaction old_action {};
  if (::sigaction(SIGPIPE, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);

  gloo::transport::tcp::attr attr;
  attr.iface = opts.interface;
  attr.hostname = opts.address;
  const std::string where = !opts.interface.empty() ? "interface '" + opts.interface + "'"
                            : !opts.address.empty() ? "address '" + opts.address + "'"
                                                    : std::string("this host's name");
  try {
    if (device_ == nullptr) device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    DT_THROW(CommError,
             "Gloo cannot bind a TCP device on {}: {}; check the interface name (ip -br addr) or "
             "the address (it must belong to this host)",
             where, e.what());
  }
  try {
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(opts.timeout);
    context_->connectFullMesh(*store, device_);
  } catch (const std::exception& e) {
    DT_THROW(CommError,
             "Gloo rank {} of {} could not connect the full mesh within {} ms via {}: {}; check that "
             "every rank started and that the hosts reach each other over TCP",
             rank, size, opts.timeout.count(), where, e.what());
  }
  // No rank returns before every rank has connected: connectFullMesh can return on one
  // rank while a peer is still reading that rank's side of their handshake, and a rank
  // that then closed its communicator (a job or test with nothing to exchange) failed the
  // peer with "Connection closed by peer" (seen on a loaded 2-core machine in
  // train_memory_plan_test). torch.distributed's init_process_group ends with a barrier
  // for the same reason. Its byte is not the caller's traffic (bytes_sent starts at 0).
  barrier();
  sent_.store(0);
  log_debug("gloo: rank {} of {} connected on {}", rank, size, device_->str());
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::run(const char* what, const std::function<void(uint64_t)>& body) {
  if (aborted_.load()) DT_THROW(CommError, "Gloo {} on rank {}: communicator was aborted", what, rank_);
  if (!broken_.empty())
    DT_THROW(CommError, "Gloo {} on rank {}: communicator unusable after an earlier failure: {}", what, rank_, broken_);
  const uint64_t slot = kSlotPrefix | next_tag_++;
  std::string error;
  try {
    body(slot);
    return;
  } catch (const CommError& e) {  // wait_* after abort()
    error = e.what();
  } catch (const gloo::Exception& e) {  // IoException: peer lost, timeout, socket closed
    error = e.what();
  } catch (const gloo::EnforceNotMet& e) {  // e.g. ranks disagree on a collective's size
    error = e.what();
  }
  broken_ = error;
  if (aborted_.load()) DT_THROW(CommError, "Gloo {} on rank {} aborted: {}", what, rank_, error);
  DT_THROW(CommError,
           "Gloo {} on rank {} failed (timeout {} ms): {}; a peer rank probably died or stopped "
           "calling the same collectives",
           what, rank_, timeout_.count(), error);
}

void GlooCommunicator::wait_send(OpBuffer& b) {
  if (!b->waitSend(timeout_)) DT_THROW(CommError, "send interrupted by abort()");
}

void GlooCommunicator::wait_recv(OpBuffer& b) {
  if (!b->waitRecv(timeout_)) DT_THROW(CommError, "receive interrupted by abort()");
}

// Step s sends chunk (r-s-1) to the right neighbour and receives chunk (r-s-2) from the
// left one, reducing it with our own contribution; the chunk received last (s = n-2) is
// chunk r, whose reduction goes to mine. Step 0 sends our raw chunk from src and every
// later step the chunk reduced one step before. The partial sums in transit live in two
// scratch pieces (received into one and reduced in place while the other is sent), not
// in a buffer the size of src: the ring runs over the chunks kRingPiece bytes at a time,
// each piece a ring of its own over the same elements of every chunk, so a 1.5 GiB
// gradient bucket costs 2 x 8 MiB of scratch instead of its own size again (issue 50: the
// whole bucket's working copy and a chunk-sized receive buffer stayed resident, 1.1 GiB
// of a 2-rank ZeRO-3 job's 4.1 GiB peak). The sums are the same operations in the same
// order as a ring over whole chunks.
void GlooCommunicator::ring_reduce_scatter(const void* src, void* mine, const std::vector<size_t>& bounds, DType dtype,
                                           ReduceOp op, uint64_t slot) {
  const int n = size_;
  const size_t es = dtype_size(dtype);
  size_t max_chunk = 0;
  for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, bounds[c + 1] - bounds[c]);
  if (max_chunk == 0) return;
  const size_t piece = std::min(max_chunk, std::max<size_t>(1, kRingPiece / es));
  scratch_.resize(2 * piece * es);
  // gloo wants a non-const pointer; the src buffer is only ever sent from.
  OpBuffer raw(*this, const_cast<void*>(src), bounds[n] * es);
  OpBuffer pp(*this, scratch_.data(), scratch_.size());
  const auto reduce = reduce_function(dtype, op);
  const int right = (rank_ + 1) % n, left = (rank_ + n - 1) % n;
  // Chunk c's elements [lo, hi) of the piece starting `at` elements into every chunk.
  auto part = [&](int c, size_t at) {
    const size_t len = bounds[c + 1] - bounds[c];
    return std::pair<size_t, size_t>{bounds[c] + std::min(at, len), bounds[c] + std::min(at + piece, len)};
  };
  for (size_t at = 0; at < max_chunk; at += piece) {
    for (int s = 0; s < n - 1; ++s) {
      const int sc = ((rank_ - s - 1) % n + n) % n;
      const int rc = ((rank_ - s - 2) % n + n) % n;
      const auto [s_lo, s_hi] = part(sc, at);
      const auto [r_lo, r_hi] = part(rc, at);
      const size_t s_len = s_hi - s_lo, r_len = r_hi - r_lo;
      // Received into scratch half s % 2; step s-1's reduction (half (s-1) % 2) is sent.
      const size_t in_off = static_cast<size_t>(s % 2) * piece * es, out_off = piece * es - in_off;
      // Empty parts (short chunks, count < n) are skipped on both sides, which agree on
      // the bounds. The receive is posted first so the left neighbour never waits for it.
      if (r_len > 0) pp->recv(left, slot, in_off, r_len * es);
      if (s_len > 0) {
        if (s == 0) raw.send(right, slot, s_lo * es, s_len * es);
        else pp.send(right, slot, out_off, s_len * es);
      }
      if (r_len > 0) {
        wait_recv(pp);
        char* in = scratch_.data() + in_off;
        // The last step's chunk is this rank's: its reduction goes straight to mine.
        char* dst = s == n - 2 ? static_cast<char*>(mine) + (r_lo - bounds[rank_]) * es : in;
        reduce(dst, static_cast<const char*>(src) + r_lo * es, in, r_len);
      }
      if (s_len > 0) wait_send(s == 0 ? raw : pp);
    }
  }
}

// Step s sends chunk (r-s) right and receives chunk (r-s-1) from the left into place.
void GlooCommunicator::ring_all_gather(void* data, size_t es, const std::vector<size_t>& bounds, uint64_t slot) {
  const int n = size_;
  OpBuffer buf(*this, data, bounds[n] * es);
  const int right = (rank_ + 1) % n, left = (rank_ + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int sc = ((rank_ - s) % n + n) % n;
    const int rc = ((rank_ - s - 1) % n + n) % n;
    const size_t s_len = bounds[sc + 1] - bounds[sc], r_len = bounds[rc + 1] - bounds[rc];
    if (r_len > 0) buf->recv(left, slot, bounds[rc] * es, r_len * es);
    if (s_len > 0) buf.send(right, slot, bounds[sc] * es, s_len * es);
    if (r_len > 0) wait_recv(buf);
    if (s_len > 0) wait_send(buf);
  }
}

void GlooCommunicator::direct_allreduce(const void* src, void* data, size_t count, DType dtype, ReduceOp op,
                                        uint64_t slot) {
  const int n = size_;
  const size_t bytes = count * dtype_size(dtype);
  gathered_.resize(bytes * n);
  std::memcpy(gathered_.data() + rank_ * bytes, src, bytes);
  OpBuffer all(*this, gathered_.data(), gathered_.size());
  for (int p = 0; p < n; ++p)
    if (p != rank_) all->recv(p, slot, p * bytes, bytes);
  // Start with the next rank so that not every rank sends to rank 0 first.
  for (int k = 1; k < n; ++k) all.send((rank_ + k) % n, slot, rank_ * bytes, bytes);
  for (int k = 1; k < n; ++k) wait_recv(all);
  for (int k = 1; k < n; ++k) wait_send(all);
  const auto reduce = reduce_function(dtype, op);
  std::memcpy(data, gathered_.data(), bytes);
  for (int p = 1; p < n; ++p) reduce(data, data, gathered_.data() + p * bytes, count);
  if (op == ReduceOp::AVG) divide_in_place(data, count, dtype, n);
}

void GlooCommunicator::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  run("allreduce", [&](uint64_t slot) {
    if (count == 0) return;
    if (size_ == 1) {
      if (send != recv) std::memmove(recv, send, count * dtype_size(dtype));
      return;
    }
    if (count * dtype_size(dtype) * (size_ - 1) <= kDirectMaxTraffic) {
      direct_allreduce(send, recv, count, dtype, op, slot);
      return;
    }
    std::vector<size_t> bounds(size_ + 1);
    for (int c = 0; c <= size_; ++c) bounds[c] = chunk_bound(count, size_, c);
    char* mine = static_cast<char*>(recv) + bounds[rank_] * dtype_size(dtype);
    ring_reduce_scatter(send, mine, bounds, dtype, op, slot);
    if (op == ReduceOp::AVG) divide_in_place(mine, bounds[rank_ + 1] - bounds[rank_], dtype, size_);
    ring_all_gather(recv, dtype_size(dtype), bounds, slot);
  });
}

void GlooCommunicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
  run("reduce_scatter", [&](uint64_t slot) {
    if (recv_count == 0) return;
    const size_t es = dtype_size(dtype);
    const size_t slice = recv_count * es;
    const char* mine = static_cast<const char*>(send) + rank_ * slice;
    if (size_ == 1) {
      if (mine != recv) std::memmove(recv, mine, slice);
      return;
    }
    // Only this rank's slice is written (recv may be that slice of send: each element
    // is read before it is written, by the last step of the ring).
    std::vector<size_t> bounds(size_ + 1);
    for (int c = 0; c <= size_; ++c) bounds[c] = recv_count * c;
    ring_reduce_scatter(send, recv, bounds, dtype, op, slot);
    if (op == ReduceOp::AVG) divide_in_place(recv, recv_count, dtype, size_);
  });
}

void GlooCommunicator::all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
  run("all_gather", [&](uint64_t slot) {
    if (send_count == 0) return;
    const size_t es = dtype_size(dtype);
    char* mine = static_cast<char*>(recv) + rank_ * send_count * es;
    if (send != mine) std::memmove(mine, send, send_count * es);
    if (size_ == 1) return;
    std::vector<size_t> bounds(size_ + 1);
    for (int c = 0; c <= size_; ++c) bounds[c] = send_count * c;
    ring_all_gather(recv, es, bounds, slot);
  });
}

// A pipelined chain root -> root+1 -> ... -> root-1 in segments, so every link carries
// the buffer once (bus bandwidth ~ link bandwidth, as NCCL's ring broadcast).
void GlooCommunicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root) {
  DT_ENFORCE(root >= 0 && root < size_, UsageError, "broadcast root {} out of range for world size {}", root, size_);
  run("broadcast", [&](uint64_t slot) {
    if (count == 0) return;
    const size_t bytes = count * dtype_size(dtype);
    if (rank_ == root && send != recv) std::memmove(recv, send, bytes);
    if (size_ == 1) return;
    const int pos = (rank_ - root + size_) % size_;
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    const bool forwards = pos < size_ - 1;
    OpBuffer buf(*this, recv, bytes);
    size_t sends = 0;
    for (size_t off = 0; off < bytes; off += kBroadcastSegment) {
      const size_t len = std::min(kBroadcastSegment, bytes - off);
      if (pos > 0) {
        buf->recv(left, slot, off, len);
        wait_recv(buf);
      }
      if (forwards) {
        buf.send(right, slot, off, len);
        ++sends;
      }
    }
    for (size_t i = 0; i < sends; ++i) wait_send(buf);
  });
}

// Everyone reports to rank 0, which then releases everyone: 2(n-1) one-byte messages.
void GlooCommunicator::barrier() {
  run("barrier", [&](uint64_t slot) {
    if (size_ == 1) return;
    std::vector<char> tokens(size_, 0);
    OpBuffer buf(*this, tokens.data(), tokens.size());
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) buf->recv(r, slot, r, 1);
      for (int r = 1; r < size_; ++r) wait_recv(buf);
      for (int r = 1; r < size_; ++r) buf.send(r, slot, 0, 1);
      for (int r = 1; r < size_; ++r) wait_send(buf);
    } else {
      buf.send(0, slot, rank_, 1);
      buf->recv(0, slot, 0, 1);
      wait_send(buf);
      wait_recv(buf);
    }
  });
}

void GlooCommunicator::abort() {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_.exchange(true)) return;
    for (UnboundBuffer* b : active_) {
      b->abortWaitSend();
      b->abortWaitRecv();
    }
  }
  // Closing the sockets makes the peers' pending operations fail at once with
  // "connection closed" instead of waiting out their timeout.
  try {
    context_->closeConnections();
  } catch (const std::exception& e) {
    log_warn("gloo: rank {} abort could not close every connection: {}", rank_, e.what());
  }
  log_debug("gloo: rank {} aborted", rank_);
}

// Every rank's (color, key) over this communicator, then a new Gloo context for this
// rank's group: the same TCP device, its own mesh met under a prefix of the store that
// names this split and the color, so groups never read each other's keys.
std::unique_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size_));
  all_gather(mine, all.data(), 2, DType::F32);  // an all-gather copies the bits
  std::vector<std::pair<int, int>> color_key;
  for (int r = 0; r < size_; ++r)
    color_key.emplace_back(all[2 * static_cast<size_t>(r)], all[2 * static_cast<size_t>(r) + 1]);
  const int n = splits_++;
  const SplitPlace place = split_place(color_key, rank_);
  if (place.size == 0) return nullptr;
  auto store = std::make_shared<OwningPrefixStore>(fmt::format("split{}/color{}", n, color), store_);
  return std::make_unique<GlooCommunicator>(std::move(store), place.rank, place.size, opts_, device_);
}
}  // namespace

std::unique_ptr<Communicator> comm_create_gloo(std::shared_ptr<gloo::rendezvous::Store> store, int rank, int size,
                                               const GlooOptions& opts) {
  return std::make_unique<GlooCommunicator>(std::move(store), rank, size, opts);
}

}  // namespace dtrain::comm
