// The one collective-communication interface every rank uses (trainer, ZeRO engine,
// bench): allreduce, reduce_scatter, all_gather, broadcast, barrier, abort and split into
// groups over fp32/bf16/fp16 buffers. Backends: Gloo (host memory, TCP) and NCCL (CUDA memory).
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::comm {

enum class ReduceOp { SUM, AVG, MAX };
enum class Backend { GLOO, NCCL };

/// "sum", "avg", "max" (nccl-tests spelling).
const char* reduce_op_name(ReduceOp op);
/// Accepts sum/avg/max (any case; "mean" for avg). Returns false when unknown.
bool reduce_op_parse(std::string_view s, ReduceOp* out);
/// "gloo" or "nccl".
const char* backend_name(Backend b);
/// Accepts gloo/nccl (any case). Returns false when unknown.
bool backend_parse(std::string_view s, Backend* out);

/// A communicator over `size()` ranks. Every rank must call the same collectives in
/// the same order with the same counts, dtype, op and root. One thread drives the
/// collectives; only abort() may be called from another thread.
///
/// Failures (peer lost, timeout, abort) throw CommError; once a collective has
/// failed the communicator is unusable and must be destroyed.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  /// True when buffers are CUDA device pointers (NCCL); false for host memory (Gloo).
  virtual bool on_device() const = 0;
  /// CUDA device ordinal the buffers live on, -1 for host memory.
  virtual int device() const { return -1; }
  /// What the buffers live on, for logs and the bench header ("cpu <model>", GPU name).
  virtual std::string device_name() const = 0;
  /// The cudaStream_t collectives are enqueued on (NCCL), so callers can order their own
  /// work against it with events; nullptr when collectives complete before returning (Gloo).
  virtual void* collective_stream() const { return nullptr; }

  /// Bytes this rank has sent to its peers so far (all collectives; cumulative): Gloo
  /// counts every send it posts; NCCL, whose transport is not observable, counts what its
  /// ring algorithms send ((n-1)/n of the buffer per reduce-scatter or all-gather pass).
  /// 0 from a communicator that does not count (test doubles).
  virtual uint64_t bytes_sent() const { return 0; }

  /// Reduce `count` elements across ranks; every rank gets the result in recv.
  /// In-place when send == recv.
  virtual void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  /// send holds size()*recv_count elements; recv gets this rank's reduced slice
  /// (elements [rank*recv_count, (rank+1)*recv_count)). In-place when
  /// recv == send + rank*recv_count (in elements), as in NCCL.
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) = 0;
  /// recv gets size()*send_count elements, rank r's contribution at r*send_count.
  /// In-place when send == recv + rank*send_count (in elements), as in NCCL.
  virtual void all_gather(const void* send, void* recv, size_t send_count, DType dtype) = 0;
  /// allreduce of a few values in HOST memory (counts, flags, norms), complete on return:
  /// Gloo reduces them in place; NCCL stages them through device memory and waits.
  virtual void allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) {
    allreduce(data, data, count, dtype, op);
  }
  /// all_gather of a few values in HOST memory (recv: size() * send_count), complete on
  /// return, staged through device memory on NCCL.
  virtual void all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) {
    all_gather(send, recv, send_count, dtype);
  }
  /// Copy root's send (count elements) to every rank's recv. In-place when send == recv;
  /// send is read on root only.
  virtual void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) = 0;
  /// Returns once every rank has entered the barrier (and, on NCCL, all work enqueued
  /// before it has completed).
  virtual void barrier() = 0;
  /// Wait until every collective issued so far has completed, so its results can be
  /// read. NCCL collectives are asynchronous (stream-ordered); Gloo collectives are
  /// complete when they return and this does nothing. Bounded by the backend timeout.
  virtual void synchronize() {}

  /// Called from another thread during teardown: makes any in-flight and every future
  /// collective fail fast with CommError instead of hanging. Idempotent.
  virtual void abort() = 0;

  /// Splits the ranks into groups (MPI_Comm_split, ncclCommSplit): every rank calls it
  /// at the same point of this communicator's sequence of collectives with its color and
  /// key; the ranks of one color form a new communicator, ranked by key (ties by their rank
  /// here). A negative color joins no group and gets nullptr. The group's collectives run
  /// among its members only, apart from this communicator's (which stays usable), and may
  /// run at the same time as the other groups'. The group lives on the same device; the
  /// caller destroys it before this communicator. Device backends first wait for the
  /// collectives issued here (none may be in flight during a split) and give the group a
  /// stream of its own. Gloo, NCCL (2.18 or newer) and the device-local communicator
  /// implement it; the default throws CommError naming the backend.
  virtual std::unique_ptr<Communicator> split(int color, int key);
};

/// Where a rank lands in a split: its rank and the group's size (-1 and 0 for a negative
/// color). color_key holds every rank's (color, key), in rank order.
struct SplitPlace {
  int rank = -1, size = 0;
};
SplitPlace split_place(const std::vector<std::pair<int, int>>& color_key, int rank);

/// Sums a few host doubles over the ranks in place (fp32 on the wire: counts stay exact
/// below 2^24). Nothing to do without a communicator or with one rank.
inline void allreduce_sum_host(Communicator* comm, std::vector<double>& v) {
  if (comm == nullptr || comm->size() <= 1 || v.empty()) return;
  std::vector<float> f(v.begin(), v.end());
  comm->allreduce_host(f.data(), f.size(), DType::F32, ReduceOp::SUM);
  for (size_t i = 0; i < v.size(); ++i) v[i] = f[i];
}

}  // namespace dtrain::comm
