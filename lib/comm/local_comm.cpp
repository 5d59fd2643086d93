// Device-local backend: a LocalGroup (the ranks' events, the collective in progress, a
// bounded meeting point on the host) and one LocalComm per rank. One collective on rank
// r's stream s_r:
//
//   record entry_r -- meet -- wait entry_q (q != r) -- copies / rank_reduce -- record done_r
//   -- meet -- wait done_q (q != r) -- [copy out of scratch]
//
// The entry waits put the reads of every peer's buffers after the work that peer issued
// before the collective (NCCL's kernel cannot pass a peer whose stream has not reached the
// collective); the exit waits keep r from writing, after the collective, a buffer a peer
// still reads (NCCL's kernel ends when its buffers are no longer needed). The host meets
// twice because a stream can wait only on an event record that exists already.
//
// A split meets twice on the host as well: the ranks post their (color, key), each new
// group's rank 0 makes the group, and its members take it from there.
#include "comm/local_comm.h"

#include "core/check.h"

#ifndef DTRAIN_HAVE_CUDA

namespace dtrain::comm {

std::shared_ptr<LocalGroup> local_group_create(int, int, const LocalOptions&) {
  DT_THROW(DeviceError, "the device-local communicator needs CUDA, but dtrain was built without it");
}

std::unique_ptr<Communicator> comm_create_local(std::shared_ptr<LocalGroup>, int) {
  DT_THROW(DeviceError, "the device-local communicator needs CUDA, but dtrain was built without it");
}

void local_group_inject(LocalGroup&, LocalFault) {}

void local_group_delay(LocalGroup&, int) {}

}  // namespace dtrain::comm

#else  // DTRAIN_HAVE_CUDA

#include "comm/device_staging.h"

#include "core/cuda_check.h"
#include "core/log.h"
#include "kernels/collective.cuh"
#include "kernels/device.cuh"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollPause = std::chrono::microseconds(50);

}  // namespace

// The group (a named class of the header) holds a Call per rank: named, not anonymous.
namespace local_detail {

enum class Kind { ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, BARRIER, SPLIT };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::ALLREDUCE: return "allreduce";
    case Kind::REDUCE_SCATTER: return "reduce_scatter";
    case Kind::ALL_GATHER: return "all_gather";
    case Kind::BROADCAST: return "broadcast";
    case Kind::BARRIER: return "barrier";
    case Kind::SPLIT: return "split";
  }
  return "?";
}

// One rank's arguments of a collective: `count` is the caller's count (allreduce and
// broadcast: elements; reduce_scatter: recv_count; all_gather: send_count).
struct Call {
  Kind kind = Kind::BARRIER;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::SUM;
  int root = 0;
  int color = 0, key = 0;  // SPLIT

  bool reduces() const { return kind == Kind::ALLREDUCE || kind == Kind::REDUCE_SCATTER; }
  bool matches(const Call& o) const {
    if (kind != o.kind) return false;
    if (kind == Kind::BARRIER || kind == Kind::SPLIT) return true;
    return count == o.count && dtype == o.dtype && (!reduces() || op == o.op) &&
           (kind != Kind::BROADCAST || root == o.root);
  }
  std::string describe() const {
    if (kind == Kind::BARRIER || kind == Kind::SPLIT) return kind_name(kind);
    std::string s = fmt::format("{} of {} {}", kind_name(kind), count, dtype_name(dtype));
    if (reduces()) s += fmt::format(" ({})", reduce_op_name(op));
    if (kind == Kind::BROADCAST) s += fmt::format(" (root {})", root);
    return s;
  }
};

}  // namespace local_detail

namespace {

using namespace local_detail;

kernels::RankReduceOp rank_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return kernels::RankReduceOp::SUM;
    case ReduceOp::AVG: return kernels::RankReduceOp::AVG;
    case ReduceOp::MAX: return kernels::RankReduceOp::MAX;
  }
  DT_THROW(InternalError, "unknown reduce op {}", static_cast<int>(op));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

// ---------------------------------------------------------------------------

class LocalGroup {
 public:
  struct Slot {
    using Call = local_detail::Call;
    cudaEvent_t entry = nullptr;  // recorded on the rank's stream as it enters a collective
    cudaEvent_t done = nullptr;   // ... once its reads of the peers' buffers are issued
    Call call;                    // written by its rank before a meeting, read by all after it
    bool joined = false, left = false;
    std::shared_ptr<LocalGroup> made;  // split: the group this rank made as its rank 0
  };

  LocalGroup(int size, int device, const LocalOptions& opts)
      : size(size), device(device), timeout(opts.timeout), slots(static_cast<size_t>(size)),
        here_(static_cast<size_t>(size), 0) {}
  // The events live as long as the group: a peer may still wait on one after its rank's
  // communicator is gone.
  ~LocalGroup() {
    for (auto& s : slots) {
      if (s.entry != nullptr) (void)cudaEventDestroy(s.entry);
      if (s.done != nullptr) (void)cudaEventDestroy(s.done);
    }
  }
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  const int size, device;
  const std::chrono::milliseconds timeout;
  std::atomic<LocalFault> fault{LocalFault::NONE};
  std::atomic<int> delay_us{0};  // local_group_delay
  std::vector<Slot> slots;

  // Registers rank's events (created on its thread); a rank joins once.
  void join(int rank, cudaEvent_t entry, cudaEvent_t done) {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots[static_cast<size_t>(rank)];
    if (s.joined) {
      (void)cudaEventDestroy(entry);
      (void)cudaEventDestroy(done);
      DT_THROW(UsageError, "device-local group: rank {} already has a communicator", rank);
    }
    s.entry = entry;
    s.done = done;
    s.joined = true;
  }

  void leave(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    slots[static_cast<size_t>(rank)].left = true;
    cv_.notify_all();
  }

  // Returns once every rank has arrived at this meeting; throws CommError (naming the
  // ranks that did not arrive) after the timeout, or at once when the group has failed.
  void meet(int rank, uint64_t seq, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failure_.empty()) DT_THROW(CommError, "device-local {} #{} on rank {}: {}", what, seq, rank, failure_);
    here_[static_cast<size_t>(rank)] = 1;
    if (++arrived_ == size) {
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), 0);
      ++gen_;
      cv_.notify_all();
      return;
    }
    const uint64_t gen = gen_;
    auto gone = [&] {
      for (int q = 0; q < size; ++q)
        if (slots[static_cast<size_t>(q)].left && !here_[static_cast<size_t>(q)]) return q;
      return -1;
    };
    cv_.wait_until(lock, Clock::now() + timeout, [&] { return gen_ != gen || !failure_.empty() || gone() >= 0; });
    if (gen_ != gen) return;
    if (failure_.empty()) {
      if (const int q = gone(); q >= 0) {
        failure_ = fmt::format("rank {} left the group (its communicator was destroyed) while rank {} waited in {} #{}",
                               q, rank, what, seq);
      } else {
        std::string missing;
        for (int q = 0; q < size; ++q)
          if (!here_[static_cast<size_t>(q)]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        failure_ = fmt::format(
            "rank {} waited {} ms in {} #{} for rank(s) {}, which did not arrive (stuck, failed or "
            "never started)",
            rank, timeout.count(), what, seq, missing);
      }
      failed_ = true;
      cv_.notify_all();
    }
    DT_THROW(CommError, "device-local {} #{} on rank {}: {}", what, seq, rank, failure_);
  }

  // Fails the group once (the first reason sticks): every meeting in progress and every
  // later one throws CommError.
  void fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = reason;
    failed_ = true;
    cv_.notify_all();
  }
  bool failed() const { return failed_.load(); }
  std::string failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t gen_ = 0;
  int arrived_ = 0;
  std::vector<char> here_;  // who has arrived at the current meeting
  std::string failure_;
  std::atomic<bool> failed_{false};
};

namespace {

// ---------------------------------------------------------------------------

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalGroup> group, int rank);
  ~LocalComm() override;
  LocalComm(const LocalComm&) = delete;
  LocalComm& operator=(const LocalComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  Backend backend() const override { return Backend::NCCL; }
  bool on_device() const override { return true; }
  int device() const override { return g_->device; }
  std::string device_name() const override {
    return kernels::device_describe(g_->device) + fmt::format(" (device-local, {} ranks)", g_->size);
  }
  void* collective_stream() const override { return stream_; }
  uint64_t bytes_sent() const override { return sent_.load(); }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    run({Kind::ALLREDUCE, send, recv, count, dtype, op, 0});
    count_ring(2 * count, dtype);
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override {
    run({Kind::REDUCE_SCATTER, send, recv, recv_count, dtype, op, 0});
    count_ring(recv_count * static_cast<size_t>(g_->size), dtype);
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    run({Kind::ALL_GATHER, send, recv, send_count, dtype, ReduceOp::SUM, 0});
    count_ring(send_count * static_cast<size_t>(g_->size), dtype);
  }
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) override {
    DT_ENFORCE(root >= 0 && root < g_->size, UsageError, "broadcast root {} out of range for world size {}", root,
               g_->size);
    run({Kind::BROADCAST, send, recv, count, dtype, ReduceOp::SUM, root});
    count_ring(count, dtype);
  }
  void allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) override;
  void all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) override;
  // Every rank's earlier work has completed once every rank has arrived.
  void barrier() override {
    synchronize();
    run({Kind::BARRIER, nullptr, nullptr, 0, DType::F32, ReduceOp::SUM, 0});
  }
  void synchronize() override;
  void abort() override { g_->fail(fmt::format("rank {} called abort()", rank_)); }
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  // The same figures as NCCL's ring (NcclComm), so the bench reads alike.
  void count_ring(size_t elems, DType t) {
    sent_ += elems * dtype_size(t) * static_cast<uint64_t>(g_->size - 1) / static_cast<uint64_t>(g_->size);
  }
  void run(const Call& c);
  // The copies and the reduction of c on stream_, between the entry and exit waits. Returns
  // the scratch the result went to when writing recv at once could change what a peer
  // still reads (in-place allreduce, overlaps outside NCCL's in-place forms), else nullptr.
  void* issue(const Call& c, size_t* out_bytes);

  std::shared_ptr<LocalGroup> g_;
  const int rank_;
  cudaStream_t stream_ = nullptr;
  uint64_t seq_ = 0;  // collectives issued (for messages)
  std::atomic<uint64_t> sent_{0};
};

LocalComm::LocalComm(std::shared_ptr<LocalGroup> group, int rank) : g_(std::move(group)), rank_(rank) {
  DT_ENFORCE(g_ != nullptr, UsageError, "device-local communicator without a group");
  DT_ENFORCE(rank >= 0 && rank < g_->size, UsageError, "rank {} out of range for a device-local group of {}", rank,
             g_->size);
  DT_CUDA_CHECK(cudaSetDevice(g_->device));
  cudaEvent_t entry = nullptr, done = nullptr;
  DT_CUDA_CHECK(cudaEventCreateWithFlags(&entry, cudaEventDisableTiming));
  if (const cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming); e != cudaSuccess) {
    (void)cudaEventDestroy(entry);
    DT_CUDA_CHECK(e);
  }
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
    (void)cudaEventDestroy(entry);
    (void)cudaEventDestroy(done);
    DT_CUDA_CHECK(e);
  }
  try {
    g_->join(rank, entry, done);  // the group owns the events from here, even when it throws
  } catch (...) {
    (void)cudaStreamDestroy(stream_);
    throw;
  }
  log_debug("local comm: rank {} of {} ready on device {}", rank, g_->size, g_->device);
}

LocalComm::~LocalComm() {
  (void)cudaSetDevice(g_->device);
  // The peers' reads of this rank's buffers are ordered before the end of its stream
  // (the exit waits): after this, the caller may free them.
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  g_->leave(rank_);
}

void LocalComm::run(const Call& c) {
  const char* what = kind_name(c.kind);
  ++seq_;
  if (g_->failed()) DT_THROW(CommError, "device-local {} #{} on rank {}: {}", what, seq_, rank_, g_->failure());
  DT_CUDA_CHECK(cudaSetDevice(g_->device));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  DT_ENFORCE(capture == cudaStreamCaptureStatusNone, UsageError,
             "device-local {} on rank {}: its stream is capturing a CUDA graph, which this communicator cannot join "
             "(its ranks meet on the host for every collective)",
             what, rank_);
  auto& slots = g_->slots;
  LocalGroup::Slot& mine = slots[static_cast<size_t>(rank_)];
  const int W = g_->size, next = (rank_ + 1) % W;
  const LocalFault fault = g_->fault.load();
  try {
    if (const int us = g_->delay_us.load(); us > 0) kernels::stream_delay(1000LL * us * (rank_ + 1) / W, stream_);
    mine.call = c;
    DT_CUDA_CHECK(cudaEventRecord(mine.entry, stream_));
    g_->meet(rank_, seq_, what);
    for (int q = 0; q < W; ++q)
      if (!slots[static_cast<size_t>(q)].call.matches(c))
        DT_THROW(CommError, "device-local collective #{}: rank {} called {} but rank {} called {}", seq_, rank_,
                 c.describe(), q, slots[static_cast<size_t>(q)].call.describe());
    for (int q = 0; q < W; ++q)
      if (q != rank_ && !(fault == LocalFault::SKIP_ENTRY_WAIT && q == next))
        DT_CUDA_CHECK(cudaStreamWaitEvent(stream_, slots[static_cast<size_t>(q)].entry, 0));
    size_t out_bytes = 0;
    void* scratch = issue(c, &out_bytes);
    DT_CUDA_CHECK(cudaEventRecord(mine.done, stream_));
    g_->meet(rank_, seq_, what);
    for (int q = 0; q < W; ++q)
      if (q != rank_) DT_CUDA_CHECK(cudaStreamWaitEvent(stream_, slots[static_cast<size_t>(q)].done, 0));
    if (scratch != nullptr) {
      DT_CUDA_CHECK(cudaMemcpyAsync(c.recv, scratch, out_bytes, cudaMemcpyDeviceToDevice, stream_));
      DT_CUDA_CHECK(cudaFreeAsync(scratch, stream_));
    }
  } catch (const std::exception& e) {
    // The peers would otherwise wait for this rank at the next meeting until the timeout.
    g_->fail(fmt::format("rank {} failed in {} #{}: {}", rank_, what, seq_, e.what()));
    throw;
  }
}

void* LocalComm::issue(const Call& c, size_t* out_bytes) {
  const auto& slots = g_->slots;
  const int W = g_->size;
  const size_t es = dtype_size(c.dtype);
  auto send_of = [&](int q) { return static_cast<const char*>(slots[static_cast<size_t>(q)].call.send); };
  // What the peers read of this rank's buffers, and what this rank writes.
  const void* read_lo = nullptr;
  size_t read_bytes = 0, write_bytes = 0;
  bool in_place = false;  // NCCL's in-place form: writing recv never touches what peers read
  switch (c.kind) {
    case Kind::ALLREDUCE: read_lo = c.send, read_bytes = write_bytes = c.count * es; break;
    case Kind::REDUCE_SCATTER:
      read_lo = c.send, read_bytes = c.count * es * static_cast<size_t>(W), write_bytes = c.count * es;
      in_place = c.recv == send_of(rank_) + static_cast<size_t>(rank_) * c.count * es;
      break;
    case Kind::ALL_GATHER:
      read_lo = c.send, read_bytes = c.count * es, write_bytes = c.count * es * static_cast<size_t>(W);
      in_place = c.send == static_cast<const char*>(c.recv) + static_cast<size_t>(rank_) * c.count * es;
      break;
    case Kind::BROADCAST:
      if (rank_ == c.root) read_lo = c.send, read_bytes = c.count * es;
      write_bytes = c.count * es;
      in_place = c.send == c.recv;
      break;
    case Kind::BARRIER:
    case Kind::SPLIT: return nullptr;
  }
  *out_bytes = write_bytes;
  if (write_bytes == 0) return nullptr;
  void* scratch = nullptr;
  if (!in_place && overlaps(c.recv, write_bytes, read_lo, read_bytes))
    DT_CUDA_CHECK(cudaMallocAsync(&scratch, write_bytes, stream_));
  char* out = static_cast<char*>(scratch != nullptr ? scratch : c.recv);
  const void* inputs[kernels::RANK_REDUCE_MAX_INPUTS];
  switch (c.kind) {
    case Kind::ALLREDUCE:
    case Kind::REDUCE_SCATTER: {
      const size_t at = c.kind == Kind::REDUCE_SCATTER ? static_cast<size_t>(rank_) * c.count * es : 0;
      for (int q = 0; q < W; ++q) inputs[q] = send_of(q) + at;
      kernels::rank_reduce(out, inputs, W, c.count, c.dtype, rank_op(c.op), stream_);
      break;
    }
    case Kind::ALL_GATHER:
      for (int q = 0; q < W; ++q) {
        char* dst = out + static_cast<size_t>(q) * c.count * es;
        if (dst != send_of(q))
          DT_CUDA_CHECK(cudaMemcpyAsync(dst, send_of(q), c.count * es, cudaMemcpyDeviceToDevice, stream_));
      }
      break;
    case Kind::BROADCAST:
      if (out != send_of(c.root))
        DT_CUDA_CHECK(cudaMemcpyAsync(out, send_of(c.root), write_bytes, cudaMemcpyDeviceToDevice, stream_));
      break;
    case Kind::BARRIER:
    case Kind::SPLIT: break;
  }
  return scratch;
}

// Every rank's earlier work on its stream first completes (as NCCL asks of a split), so the
// group's collectives, on new streams, cannot overtake it. Then three meetings: the ranks'
// (color, key) (and a check that every rank splits), each group's rank 0 makes the group
// (same device, timeout and test switches as this one), its members take it. Each member
// then makes its communicator, a stream and events of its own, on its own thread.
std::unique_ptr<Communicator> LocalComm::split(int color, int key) {
  const char* what = kind_name(Kind::SPLIT);
  synchronize();
  ++seq_;
  auto& slots = g_->slots;
  LocalGroup::Slot& mine = slots[static_cast<size_t>(rank_)];
  const int W = g_->size;
  try {
    Call c;
    c.kind = Kind::SPLIT;
    c.color = color < 0 ? -1 : color;
    c.key = key;
    mine.call = c;
    g_->meet(rank_, seq_, what);
    std::vector<std::pair<int, int> > color_key;
    for (int q = 0; q < W; ++q) {
      const Call& o = slots[static_cast<size_t>(q)].call;
      if (!o.matches(c))
        DT_THROW(CommError, "device-local collective #{}: rank {} called {} but rank {} called {}", seq_, rank_,
                 c.describe(), q, o.describe());
      color_key.emplace_back(o.color, o.key);
    }
    const SplitPlace place = split_place(color_key, rank_);
    if (place.rank == 0) {
      auto made = std::make_shared<LocalGroup>(place.size, g_->device, LocalOptions{g_->timeout});
      made->fault.store(g_->fault.load());
      made->delay_us.store(g_->delay_us.load());
      mine.made = std::move(made);
    }
    g_->meet(rank_, seq_, what);
    std::shared_ptr<LocalGroup> group;
    for (int q = 0; q < W && place.size > 0; ++q)
      if (color_key[static_cast<size_t>(q)].first == c.color && split_place(color_key, q).rank == 0)
        group = slots[static_cast<size_t>(q)].made;
    g_->meet(rank_, seq_, what);  // every member holds its group: the makers let go
    mine.made.reset();
    if (group == nullptr) return nullptr;
    return std::make_unique<LocalComm>(std::move(group), place.rank);
  } catch (const std::exception& e) {
    g_->fail(fmt::format("rank {} failed in {} #{}: {}", rank_, what, seq_, e.what()));
    throw;
  }
}

// Host values go through stream-ordered device scratch on the rank's stream and come back
// once the stream has finished (bounded like synchronize()), as on NCCL.
void LocalComm::allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) {
  staged_allreduce_host(*this, g_->device, stream_, data, count, dtype, op);
}

void LocalComm::all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) {
  staged_all_gather_host(*this, g_->device, stream_, send, recv, send_count, dtype);
}

void LocalComm::synchronize() {
  const auto deadline = Clock::now() + g_->timeout;
  for (;;) {
    if (g_->failed()) DT_THROW(CommError, "device-local synchronize on rank {}: {}", rank_, g_->failure());
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      g_->fail(fmt::format("rank {}: CUDA error while waiting for collectives: {}", rank_, cudaGetErrorString(e)));
      DT_CUDA_CHECK(e);
    }
    if (Clock::now() >= deadline) {
      g_->fail(fmt::format("rank {}: collectives did not complete within {} ms", rank_, g_->timeout.count()));
      DT_THROW(CommError, "device-local synchronize on rank {}: {}", rank_, g_->failure());
    }
    std::this_thread::sleep_for(kPollPause);
  }
}

}  // namespace

// ---------------------------------------------------------------------------

std::shared_ptr<LocalGroup> local_group_create(int size, int device, const LocalOptions& opts) {
  DT_ENFORCE(size >= 1 && size <= kernels::RANK_REDUCE_MAX_INPUTS, UsageError,
             "a device-local group has 1 to {} ranks, not {}", kernels::RANK_REDUCE_MAX_INPUTS, size);
  DT_ENFORCE_GT(opts.timeout.count(), 0, UsageError, "device-local timeout must be positive (milliseconds)");
  const int visible = kernels::device_count();
  DT_ENFORCE(device >= 0 && device < visible, UsageError,
             "a device-local group on CUDA device {}, but {} device(s) are visible", device, visible);
  return std::make_shared<LocalGroup>(size, device, opts);
}

std::unique_ptr<Communicator> comm_create_local(std::shared_ptr<LocalGroup> group, int rank) {
  return std::make_unique<LocalComm>(std::move(group), rank);
}

void local_group_inject(LocalGroup& group, LocalFault fault) { group.fault.store(fault); }

void local_group_delay(LocalGroup& group, int microseconds) {
  DT_ENFORCE(microseconds >= 0 && microseconds <= kernels::STREAM_DELAY_MAX_NS / 1000, UsageError,
             "device-local delay {} us out of range [0, {}]", microseconds, kernels::STREAM_DELAY_MAX_NS / 1000);
  group.delay_us.store(microseconds);
}

}  // namespace dtrain::comm

#endif  // DTRAIN_HAVE_CUDA
