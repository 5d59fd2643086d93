// A Communicator decorator that knows whether this rank is waiting in a collective (on
// any thread, on this communicator or a group split from it) and tells an observer when
// that changes, so a step watchdog can tell a rank stuck in its own work from the peers
// that wait for it.
#pragma once

#include "comm/communicator.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace dtrain::comm {

class ActivityCommunicator : public Communicator {
 public:
  /// Called after in_collective() may have changed (from the thread that changed it);
  /// read in_collective() for the state rather than assuming one.
  using Observer = std::function<void()>;

  ActivityCommunicator(std::unique_ptr<Communicator> inner, Observer observer);

  /// True while any thread is inside a collective, barrier or synchronize of this rank
  /// (here, in a group split from here, or in the communicator this one was split from).
  bool in_collective() const { return w_->depth.load() > 0; }

  /// Seconds spent inside collectives so far (any thread; overlapping calls count once),
  /// the current stretch included: the resource monitor's "in_collective_frac" is its
  /// growth over a sample interval.
  double collective_seconds() const;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Backend backend() const override { return inner_->backend(); }
  bool on_device() const override { return inner_->on_device(); }
  int device() const override { return inner_->device(); }
  std::string device_name() const override { return inner_->device_name(); }
  void* collective_stream() const override { return inner_->collective_stream(); }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) override;
  void all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override;
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root) override;
  void barrier() override;
  void synchronize() override;
  void abort() override { inner_->abort(); }
  /// The split's own exchange is watched, and so is the group it returns: with this
  /// communicator's count, clock and observer, so a rank waiting in a group's collective is
  /// in_collective() and a stretch inside two groups at once counts once.
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  // What a communicator and the groups split from it share.
  struct Watch {
    Observer observer;
    std::atomic<int> depth{0};
    // The time accounting: taken only when the depth leaves or reaches 0 (once per
    // collective, next to a network round trip) and by the monitor's reads.
    std::mutex time_mu;
    int64_t busy_ns = 0;   // closed stretches
    int64_t since_ns = 0;  // start of the open stretch (depth > 0)
  };
  // A group's: watched with `watch` (the arguments in this order keep a nullptr observer
  // unambiguous).
  ActivityCommunicator(std::shared_ptr<Watch> watch, std::unique_ptr<Communicator> inner);

  template <typename F>
  void watched(F&& f);

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<Watch> w_;
};

}  // namespace dtrain::comm
