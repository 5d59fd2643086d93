// NCCL backend: unique-id exchange through the rendezvous store, a non-blocking
// communicator with a watchdog thread that aborts it on async errors or abort(), bounded
// polling waits instead of cudaStreamSynchronize, and groups split off by ncclCommSplit.
// CPU-only builds compile only the factory, which reports that CUDA is missing.
#include "comm/nccl_comm.h"

#include "core/check.h"

#ifndef DTRAIN_HAVE_CUDA

namespace dtrain::comm {

std::unique_ptr<Communicator> comm_create_nccl(gloo::rendezvous::Store&, int, int, int, const NcclOptions&) {
  DT_THROW(DeviceError,
           "the NCCL backend was requested but dtrain was built without CUDA; use the gloo backend "
           "or rebuild with -DDTRAIN_CUDA=ON");
}

}  // namespace dtrain::comm

#else  // DTRAIN_HAVE_CUDA

#include "comm/device_staging.h"

#include "core/cuda_check.h"
#include "core/log.h"
#include "kernels/device.cuh"

#include <gloo/common/error.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtrain::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUniqueIdKey = "nccl_unique_id";
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
constexpr auto kPollPause = std::chrono::microseconds(50);

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
  }
  DT_THROW(InternalError, "unknown dtype {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::AVG: return ncclAvg;
    case ReduceOp::MAX: return ncclMax;
  }
  DT_THROW(InternalError, "unknown reduce op {}", static_cast<int>(op));
}

// ---------------------------------------------------------------------------

// The stream controls of an NCCL communicator (dynamic_cast from Communicator).
class NcclCommunicator : public Communicator {
 public:
  // The stream collectives are enqueued on (the communicator's own non-blocking stream
  // unless set_stream() chose another).
  virtual cudaStream_t stream() const = 0;
  // Enqueue later collectives on `stream` (not owned; must outlive its use here);
  // nullptr restores the communicator's own stream.
  virtual void set_stream(cudaStream_t stream) = 0;
};

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(gloo::rendezvous::Store& store, int rank, int size, int device, const NcclOptions& opts);
  // Takes over `comm` (ncclCommSplit's result, on `device`): waits until it is ready, then
  // reads its rank and size.
  NcclComm(ncclComm_t comm, int device, std::chrono::milliseconds timeout);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::NCCL; }
  bool on_device() const override { return true; }
  int device() const override { return device_; }
  std::string device_name() const override { return kernels::device_describe(device_); }
  void* collective_stream() const override { return stream_; }
  cudaStream_t stream() const override { return stream_; }
  void set_stream(cudaStream_t stream) override { stream_ = stream != nullptr ? stream : own_stream_; }

  uint64_t bytes_sent() const override { return sent_.load(); }
  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) override;
  void all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override;
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) override;
  void barrier() override;
  void synchronize() override;
  void abort() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  // What a ring pass sends of `elems` elements: (n-1)/n of them (bytes_sent()).
  void count_ring(size_t elems, DType t) {
    sent_ += elems * dtype_size(t) * static_cast<uint64_t>(size_ - 1) / static_cast<uint64_t>(size_);
  }
  std::atomic<uint64_t> sent_{0};
  // Calls `call(comm)` under the lock (NCCL calls on a non-blocking communicator return
  // at once), then waits until NCCL has finished enqueuing (ncclInProgress).
  template <typename F>
  void enqueue(const char* what, F call);
  // Polls ncclCommGetAsyncError until the communicator is no longer ncclInProgress,
  // bounded by the timeout and the abort flag.
  void wait_ready(const char* what);
  // Aborts the NCCL communicator once (any thread); later operations throw CommError.
  void abort_with(const std::string& reason);
  [[noreturn]] void throw_failed(const char* what);
  void watchdog_loop();
  // The stream and the barrier scratch, the watchdog, then a bounded wait for comm_ to be
  // ready (`what`); on failure aborts comm_ (`failure`), releases everything and rethrows.
  void start(const char* what, const char* failure);
  void release_cuda() noexcept;  // the stream and scratch this object allocated

  int rank_, size_;  // set once: by the constructor, or (split) once the communicator is ready
  const int device_;
  const std::chrono::milliseconds timeout_;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_buf_ = nullptr;  // one float allreduced by barrier()

  std::mutex mu_;              // guards comm_ and failure_: NCCL calls vs. abort
  ncclComm_t comm_ = nullptr;  // nullptr once aborted or destroyed
  // ncclCommSplit's newcomm: a non-blocking split writes it once the split has completed,
  // so it lives as long as this communicator rather than on split()'s stack.
  ncclComm_t split_out_ = nullptr;
  std::string failure_;
  std::atomic<bool> failed_{false};

  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  std::thread watchdog_;
};

NcclComm::NcclComm(gloo::rendezvous::Store& store, int rank, int size, int device, const NcclOptions& opts)
    : rank_(rank), size_(size), device_(device), timeout_(opts.timeout) {
  DT_ENFORCE_GT(size, 0, UsageError, "world size must be positive");
  DT_ENFORCE(rank >= 0 && rank < size, UsageError, "rank {} out of range for world size {}", rank, size);
  DT_ENFORCE_GT(opts.timeout.count(), 0, UsageError, "NCCL timeout must be positive (milliseconds)");
  const int visible = kernels::device_count();
  DT_ENFORCE(device >= 0 && device < visible, UsageError,
             "rank {} asks for CUDA device {} but {} device(s) are visible (check CUDA_VISIBLE_DEVICES "
             "and the local rank)",
             rank, device, visible);
  DT_CUDA_CHECK(cudaSetDevice(device));

  // Unique id: rank 0 creates it, everybody else reads it from the store.
  ncclUniqueId id;
  try {
    if (rank == 0) {
      DT_NCCL_CHECK(ncclGetUniqueId(&id));
      const char* p = reinterpret_cast<const char*>(&id);
      store.set(kUniqueIdKey, std::vector<char>(p, p + sizeof id));
    } else {
      store.wait({kUniqueIdKey}, opts.timeout);
      const auto bytes = store.get(kUniqueIdKey);
      DT_ENFORCE_EQ(bytes.size(), sizeof id, CommError, "store key '{}' holds no NCCL unique id", kUniqueIdKey);
      std::memcpy(&id, bytes.data(), sizeof id);
    }
  } catch (const gloo::Exception& e) {
    DT_THROW(CommError, "rank {}: no NCCL unique id from rank 0 within {} ms: {}", rank, opts.timeout.count(),
             e.what());
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return at once, so the watchdog can always abort
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      DT_THROW(CommError, "ncclCommInitRankConfig (rank {} of {}, device {}) failed: {}", rank, size, device,
               ncclGetErrorString(r));
    }
  }
  start("init", "initialisation failed");
  log_debug("nccl: rank {} of {} ready on device {}", rank, size, device);
}

NcclComm::NcclComm(ncclComm_t comm, int device, std::chrono::milliseconds timeout)
    : rank_(-1), size_(0), device_(device), timeout_(timeout), comm_(comm) {
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    ncclCommAbort(comm_);
    DT_CUDA_CHECK(e);
  }
  start("split", "the split group did not become ready");
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = ncclCommUserRank(comm_, &rank_);
    if (r == ncclSuccess) r = ncclCommCount(comm_, &size_);
  }
  // Not expected of a ready communicator; the destructor (not run when a constructor
  // throws) would otherwise release these.
  if (r != ncclSuccess) {
    abort_with(std::string("its rank and size are unreadable: ") + ncclGetErrorString(r));
    {
      std::lock_guard<std::mutex> wd(wd_mu_);
      wd_stop_ = true;
    }
    wd_cv_.notify_all();
    watchdog_.join();
    release_cuda();
    DT_THROW(CommError, "NCCL split group on device {}: its rank and size are unreadable: {}", device,
             ncclGetErrorString(r));
  }
  log_debug("nccl: split group rank {} of {} ready on device {}", rank_, size_, device);
}

void NcclComm::start(const char* what, const char* failure) {
  cudaError_t e = cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&barrier_buf_, sizeof(float));
  if (e != cudaSuccess) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    release_cuda();
    DT_CUDA_CHECK(e);
  }
  stream_ = own_stream_;
  watchdog_ = std::thread([this] { watchdog_loop(); });
  try {
    wait_ready(what);
  } catch (...) {
    abort_with(failure);
    {
      std::lock_guard<std::mutex> lock(wd_mu_);
      wd_stop_ = true;
    }
    wd_cv_.notify_all();
    watchdog_.join();
    release_cuda();
    throw;
  }
}

NcclComm::~NcclComm() {
  {
    std::lock_guard<std::mutex> lock(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  cudaSetDevice(device_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ != nullptr) {
      // Orderly: finalize (flushes outstanding work) then destroy; abort when that fails
      // or does not finish within the timeout. Destructors cannot report errors.
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + timeout_;
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollPause);
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
      }
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
  }
  release_cuda();
}

void NcclComm::release_cuda() noexcept {
  if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
  if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
  barrier_buf_ = nullptr;
  own_stream_ = nullptr;
}

void NcclComm::throw_failed(const char* what) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = failure_;
  }
  DT_THROW(CommError, "NCCL {} on rank {}: communicator aborted ({})", what, rank_, reason);
}

void NcclComm::abort_with(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = reason;
  failed_ = true;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    log_warn("nccl: rank {} aborted its communicator: {}", rank_, reason);
  }
}

void NcclComm::abort() {
  abort_with("abort() called");
  wd_cv_.notify_all();
}

void NcclComm::watchdog_loop() {
  std::unique_lock<std::mutex> wd(wd_mu_);
  while (!wd_stop_) {
    wd_cv_.wait_for(wd, kWatchdogPeriod);
    if (wd_stop_ || failed_.load()) continue;
    ncclResult_t state = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_ == nullptr) continue;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    }
    if (state != ncclSuccess && state != ncclInProgress)
      abort_with(std::string("asynchronous NCCL error: ") + ncclGetErrorString(state) +
                 " (a peer rank probably died or its network failed)");
  }
}

void NcclComm::wait_ready(const char* what) {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    if (failed_.load()) throw_failed(what);
    ncclResult_t state = ncclInProgress;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_ == nullptr) {
        failed_ = true;
        if (failure_.empty()) failure_ = "communicator gone";
      } else if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
        state = ncclInternalError;
      }
    }
    if (failed_.load()) throw_failed(what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort_with(std::string(what) + ": " + ncclGetErrorString(state));
      throw_failed(what);
    }
    if (Clock::now() >= deadline) {
      abort_with(std::string(what) + " did not complete within " + std::to_string(timeout_.count()) + " ms");
      throw_failed(what);
    }
    std::this_thread::sleep_for(kPollPause);
  }
}

template <typename F>
void NcclComm::enqueue(const char* what, F call) {
  if (failed_.load()) throw_failed(what);
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) {
      failed_ = true;
    } else {
      r = call(comm_);
    }
  }
  if (failed_.load()) throw_failed(what);
  if (r == ncclInProgress) {
    wait_ready(what);
    return;
  }
  if (r != ncclSuccess) {
    const std::string detail = ncclGetErrorString(r);
    // Invalid arguments leave the communicator usable; anything else is fatal.
    if (r == ncclInvalidArgument || r == ncclInvalidUsage)
      DT_THROW(CommError, "NCCL {} on rank {} rejected its arguments: {}", what, rank_, detail);
    abort_with(std::string(what) + ": " + detail);
    throw_failed(what);
  }
}

void NcclComm::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  cudaStream_t s = stream_;
  enqueue("allreduce",
          [&](ncclComm_t c) { return ncclAllReduce(send, recv, count, nccl_dtype(dtype), nccl_op(op), c, s); });
  count_ring(2 * count, dtype);  // reduce-scatter + all-gather
}

// Host values go through stream-ordered device scratch on the communicator's stream and
// come back once the stream has finished (bounded like synchronize()).
void NcclComm::allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) {
  staged_allreduce_host(*this, device_, stream_, data, count, dtype, op);
}

void NcclComm::all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) {
  staged_all_gather_host(*this, device_, stream_, send, recv, send_count, dtype);
}

void NcclComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
  cudaStream_t s = stream_;
  enqueue("reduce_scatter", [&](ncclComm_t c) {
    return ncclReduceScatter(send, recv, recv_count, nccl_dtype(dtype), nccl_op(op), c, s);
  });
  count_ring(recv_count * static_cast<size_t>(size_), dtype);
}

void NcclComm::all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
  cudaStream_t s = stream_;
  enqueue("all_gather", [&](ncclComm_t c) { return ncclAllGather(send, recv, send_count, nccl_dtype(dtype), c, s); });
  count_ring(send_count * static_cast<size_t>(size_), dtype);
}

void NcclComm::broadcast(const void* send, void* recv, size_t count, DType dtype, int root) {
  DT_ENFORCE(root >= 0 && root < size_, UsageError, "broadcast root {} out of range for world size {}", root, size_);
  cudaStream_t s = stream_;
  enqueue("broadcast", [&](ncclComm_t c) { return ncclBroadcast(send, recv, count, nccl_dtype(dtype), root, c, s); });
  count_ring(count, dtype);  // a chain: every rank but the last forwards it, (n-1)/n of it per rank on average
}

// NCCL has no barrier: a one-element allreduce that every rank must join, then a wait
// for it (and everything enqueued before it) to finish.
void NcclComm::barrier() {
  cudaStream_t s = stream_;
  enqueue("barrier",
          [&](ncclComm_t c) { return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, c, s); });
  synchronize();
}

void NcclComm::synchronize() {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    if (failed_.load()) throw_failed("synchronize");
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) {
      if (failed_.load()) throw_failed("synchronize");  // the watchdog may have aborted meanwhile
      return;
    }
    if (e != cudaErrorNotReady) {
      abort_with(std::string("CUDA error while waiting for collectives: ") + cudaGetErrorString(e));
      DT_CUDA_CHECK(e);
    }
    if (Clock::now() >= deadline) {
      abort_with("collectives did not complete within " + std::to_string(timeout_.count()) +
                 " ms (a peer rank is probably stuck or gone)");
      throw_failed("synchronize");
    }
    std::this_thread::sleep_for(kPollPause);
  }
}

// ncclCommSplit (NCCL 2.18+), collective over this communicator: nothing of ours may be
// outstanding (NCCL: a split with operations in flight may deadlock), so the stream is
// drained first. Non-blocking as every call here: the split is complete once this
// communicator is ready again, and only then does NCCL write split_out_. The group has a
// stream and a watchdog of its own, on this communicator's device.
std::unique_ptr<Communicator> NcclComm::split(int color, int key) {
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
  (void)color, (void)key;
  DT_THROW(CommError,
           "NCCL split on rank {}: ncclCommSplit needs NCCL 2.18 or newer, but dtrain was built against NCCL {}.{}.{}; "
           "rebuild against a newer NCCL or use the gloo backend",
           rank_, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#else
  synchronize();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const int nccl_color = color < 0 ? NCCL_SPLIT_NOCOLOR : color;
  split_out_ = nullptr;
  enqueue("split", [&](ncclComm_t c) { return ncclCommSplit(c, nccl_color, key, &split_out_, &config); });
  ncclComm_t group = std::exchange(split_out_, nullptr);
  if (group == nullptr) {
    if (color < 0) return nullptr;
    DT_THROW(CommError, "NCCL split on rank {}: ncclCommSplit completed without a communicator for color {}", rank_,
             color);
  }
  if (color < 0) {  // NCCL documents NULL for NCCL_SPLIT_NOCOLOR
    ncclCommAbort(group);
    DT_THROW(CommError, "NCCL split on rank {}: ncclCommSplit gave a communicator to a rank of no color", rank_);
  }
  return std::make_unique<NcclComm>(group, device_, timeout_);
#endif
}

}  // namespace

std::unique_ptr<Communicator> comm_create_nccl(gloo::rendezvous::Store& store, int rank, int size, int device,
                                               const NcclOptions& opts) {
  return std::make_unique<NcclComm>(store, rank, size, device, opts);
}

}  // namespace dtrain::comm

#endif  // DTRAIN_HAVE_CUDA
