// ActivityCommunicator: forwards every call, counting the threads inside collectives (of
// this communicator and of the groups split from it, in one count).
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
    : ActivityCommunicator(std::make_shared<Watch>(), std::move(inner)) {
  w_->observer = std::move(observer);
}

ActivityCommunicator::ActivityCommunicator(std::shared_ptr<Watch> watch, std::unique_ptr<Communicator> inner)
    : inner_(std::move(inner)), w_(std::move(watch)) {}

template <typename F>
void ActivityCommunicator::watched(F&& f) {
  // Leaves the count right when the collective throws (a lost peer, abort).
  struct Depth {
    Watch& w;
    explicit Depth(Watch& w_) : w(w_) {
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(w.time_mu);
        if ((first = w.depth.fetch_add(1) == 0)) w.since_ns = steady_ns();
      }
      if (first && w.observer) w.observer();
    }
    ~Depth() {
      bool last = false;
      {
        std::lock_guard<std::mutex> lock(w.time_mu);
        if ((last = w.depth.fetch_sub(1) == 1)) w.busy_ns += steady_ns() - w.since_ns;
      }
      if (last && w.observer) w.observer();
    }
  } depth(*w_);
  f();
}

double ActivityCommunicator::collective_seconds() const {
  std::lock_guard<std::mutex> lock(w_->time_mu);
  const int64_t ns = w_->busy_ns + (w_->depth.load() > 0 ? steady_ns() - w_->since_ns : 0);
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
  if (group == nullptr) return nullptr;
  return std::unique_ptr<Communicator>(new ActivityCommunicator(w_, std::move(group)));
}

}  // namespace dtrain::comm
