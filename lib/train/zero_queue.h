// The ZeRO engine's communication queue: collectives run in submission order, either
// inline (overlap_comm off) or on one communication thread that drives the
// Communicator while the caller keeps computing; a failure is rethrown at the next wait.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dtrain::train {

class ZeroCommQueue {
 public:
  /// threaded == false: submit() runs the task before returning.
  explicit ZeroCommQueue(bool threaded);
  /// Finishes the queued tasks (errors are dropped: the destructor cannot throw) and joins.
  ~ZeroCommQueue();
  ZeroCommQueue(const ZeroCommQueue&) = delete;
  ZeroCommQueue& operator=(const ZeroCommQueue&) = delete;

  /// Queues task; returns its ticket (1, 2, ...). After a task failed the later ones
  /// are skipped (the communicator is unusable) and wait() rethrows the failure.
  uint64_t submit(std::function<void()> task);
  /// Returns once task `ticket` (and every earlier one) has run. Bounded: every task
  /// is a collective with the backend's timeout.
  void wait(uint64_t ticket);
  void wait_all() { wait(submitted_); }
  bool threaded() const { return threaded_; }

  /// Communication time since the last reset: busy = time spent running collectives;
  /// exposed = time the caller could not compute because of them (inline collectives,
  /// or wait() blocking on the thread). busy - exposed ran overlapped with compute.
  struct Times {
    double busy_s = 0, exposed_s = 0;
  };
  Times times() const;
  void times_reset();

 private:
  void loop();

  bool threaded_;
  uint64_t submitted_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> tasks_;
  uint64_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
  std::atomic<int64_t> busy_ns_{0}, exposed_ns_{0};
};

}  // namespace dtrain::train
