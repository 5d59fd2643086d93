// The ZeRO engine's communication over its data-parallel group: collectives in submission
// order, inline or on a communication thread (ZeroCommQueue), and with a stream-ordered
// communicator (NCCL) on its stream after the compute work issued before them, joined back
// with events; the 16-bit gradient wire; the meter of transient device memory that the
// buckets and gathers report to.
#pragma once

#include "comm/groups.h"
#include "core/dtype.h"
#include "device/device.h"
#include "train/zero_queue.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace dtrain::train {

/// Transient device memory (gradient buckets, stage-2/3 working buffers, gathers): bytes
/// now and at peak, from the compute and the communication thread.
class ZeroWorkMeter {
 public:
  void add(ptrdiff_t bytes);
  size_t peak() const;

 private:
  mutable std::mutex mu_;
  size_t bytes_ = 0, peak_ = 0;
};

class ZeroCollectives {
 public:
  explicit ZeroCollectives(device::Device& dev) : dev_(dev) {}

  /// Takes the data-parallel group of `groups` (none, or one rank without
  /// single_rank_comm: a single rank, every collective a no-op): UsageError unless its
  /// buffers live where the model's do. Starts the queue: a thread for overlap_comm on a
  /// communicator that blocks (a stream-ordered one overlaps by itself).
  void attach(const comm::ProcessGroups& groups, bool model_on_host, bool single_rank_comm, bool overlap_comm);
  /// The group, nullptr for a single rank.
  comm::Communicator* comm() const { return comm_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool stream_ordered() const { return stream_ != nullptr; }
  void* stream() const { return stream_; }
  bool threaded() const { return queue_->threaded(); }

  /// Runs f on the communication side (in order; on the communicator's stream when it has
  /// one); returns its ticket.
  uint64_t submit(std::function<void()> f);
  void wait(uint64_t ticket) { queue_->wait(ticket); }
  void wait_all() { queue_->wait_all(); }
  /// The compute stream waits for what was issued on the communicator's stream since the
  /// last join (nothing to do without a stream).
  void join();
  /// Finishes the queued tasks and joins the thread (the engine's teardown, first).
  void stop() { queue_.reset(); }
  /// Seconds spent in collectives and exposed to the caller since the last call.
  ZeroCommQueue::Times times_take();

  // The collectives, called from submitted tasks only (one thread drives the communicator).
  void allreduce(void* buf, size_t n, DType t, comm::ReduceOp op);
  /// In place: W segments of `shard` at buf, this rank's reduced (AVG) in its own segment.
  void reduce_scatter(void* buf, size_t shard, DType t);
  /// In place: this rank's segment of buf to every rank.
  void all_gather(void* buf, size_t shard, DType t);
  /// The gradient average of n fp32 values at buf: an allreduce, or (scatter) a
  /// reduce-scatter of W segments of n / W leaving this rank's segment reduced; on the
  /// 16-bit wire when wire_set chose one.
  void grad_reduce(float* buf, size_t n, bool scatter);
  /// The gradient wire (F32: uncompressed) and, with a group, its staging buffer for
  /// collectives of up to `elems` elements (counted on `work`).
  void wire_set(DType wire, size_t elems, ZeroWorkMeter& work);

 private:
  void on_comm(const std::function<void()>& f);

  device::Device& dev_;
  comm::Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  void* stream_ = nullptr;  // the communicator's CUDA stream: collectives are stream-ordered
  bool unjoined_ = false;   // work issued on stream_ since the last join
  std::unique_ptr<device::Device::Event> ev_compute_, ev_comm_;
  std::unique_ptr<ZeroCommQueue> queue_;
  DType wire_t_ = DType::F32;
  // The 16-bit wire's staging buffer (the largest bucket), used by one collective at a
  // time: they run in order on the communication thread or stream.
  device::DeviceBuffer wire_;
};

}  // namespace dtrain::train
