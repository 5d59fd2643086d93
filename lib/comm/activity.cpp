// ActivityCommunicator: forwards every call, counting the threads inside collectives.
#include "comm/activity.h"

#include <utility>

namespace dtrain::comm {

ActivityCommunicator::ActivityCommunicator(std::unique_ptr<Communicator> inner, Observer observer)
    : inner_(std::move(inner)), observer_(std::move(observer)) {}

template <typename F>
void ActivityCommunicator::watched(F&& f) {
  // Leaves the count right when the collective throws (a lost peer, abort).
  struct Depth {
    ActivityCommunicator& c;
    explicit Depth(ActivityCommunicator& c_) : c(c_) {
      if (c.depth_.fetch_add(1) == 0 && c.observer_) c.observer_();
    }
    ~Depth() {
      if (c.depth_.fetch_sub(1) == 1 && c.observer_) c.observer_();
    }
  } depth(*this);
  f();
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

}  // namespace dtrain::comm
