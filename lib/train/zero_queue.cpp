// ZeroCommQueue: FIFO of collectives on an optional communication thread.
#include "train/zero_queue.h"

namespace dtrain::train {

ZeroCommQueue::ZeroCommQueue(bool threaded) : threaded_(threaded) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

ZeroCommQueue::~ZeroCommQueue() {
  if (!threaded_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t ZeroCommQueue::submit(std::function<void()> task) {
  const uint64_t ticket = ++submitted_;
  if (!threaded_) {
    if (!error_) {
      try {
        task();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    done_ = ticket;
    if (error_) std::rethrow_exception(error_);
    return ticket;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.emplace_back(ticket, std::move(task));
  }
  cv_.notify_all();
  return ticket;
}

void ZeroCommQueue::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= ticket; });
  if (error_) std::rethrow_exception(error_);
}

void ZeroCommQueue::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_ with nothing left
    auto [ticket, task] = std::move(tasks_.front());
    tasks_.pop_front();
    const bool skip = error_ != nullptr;
    lk.unlock();
    std::exception_ptr err;
    if (!skip) {
      try {
        task();
      } catch (...) {
        err = std::current_exception();
      }
    }
    lk.lock();
    if (err && !error_) error_ = err;
    done_ = ticket;
    cv_.notify_all();
  }
}

}  // namespace dtrain::train
