// ActivityCommunicator: forwards every call, counting the threads inside collectives.
#include "comm/activity.h"

#include <chrono>
#include <utility>

namespace dtrain::comm {

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ActivityCommunicator::ActivityCommunicator(std::unique_ptr<Communicator> inner, Observer observer)
    : inner_(std::move(inner)), observer_(std::move(observer)) {}

template <typename F>
void ActivityCommunicator::watched(F&& f) {
  // Leaves the count right when the collective throws (a lost peer, abort).
  struct Depth {
    ActivityCommunicator& c;
    explicit Depth(ActivityCommunicator& c_) : c(c_) {
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(c.time_mu_);
        if ((first = c.depth_.fetch_add(1) == 0)) c.since_ns_ = steady_ns();
      }
      if (first && c.observer_) c.observer_();
    }
    ~Depth() {
      bool last = false;
      {
        std::lock_guard<std::mutex> lock(c.time_mu_);
        if ((last = c.depth_.fetch_sub(1) == 1)) c.busy_ns_ += steady_ns() - c.since_ns_;
      }
      if (last && c.observer_) c.observer_();
    }
  } depth(*this);
  f();
}

double ActivityCommunicator::collective_seconds() const {
  std::lock_guard<std::mutex> lock(time_mu_);
  const int64_t ns = busy_ns_ + (depth_.load() > 0 ? steady_ns() - since_ns_ : 0);
  return static_cast<double>(ns) / 1e9;
}

void ActivityCommunicator::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  watched([&] { inner_->allreduce(send, recv, count, dtype, op); });
}

void ActivityCommunicator::allreduce_host(void* data, size_t count, DType dtype, ReduceOp op) {
  watched([&] { inner_->allreduce_host(data, count, dtype, op); });
}

void ActivityCommunicator::all_gather_host(const void* send, void* recv, size_t send_count, DType dtype) {
  watched([&] { inner_->all_gather_host(send, recv, send_count, dtype); });
}

void ActivityCommunicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
  watched([&] { inner_->reduce_scatter(send, recv, recv_count, dtype, op); });
}

void ActivityCommunicator::all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
  watched([&] { inner_->all_gather(send, recv, send_count, dtype); });
}

void ActivityCommunicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root) {
  watched([&] { inner_->broadcast(send, recv, count, dtype, root); });
}

void ActivityCommunicator::barrier() {
  watched([&] { inner_->barrier(); });
}

void ActivityCommunicator::synchronize() {
  watched([&] { inner_->synchronize(); });
}

std::unique_ptr<Communicator> ActivityCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> group;
  watched([&] { group = inner_->split(color, key); });
  return group;
}

}  // namespace dtrain::comm
