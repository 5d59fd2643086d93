// ZeroCommQueue: FIFO of collectives on an optional communication thread.
#include "train/zero_queue.h"

namespace dtrain::train {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ZeroCommQueue::Times ZeroCommQueue::times() const { return {busy_ns_.load() * 1e-9, exposed_ns_.load() * 1e-9}; }

void ZeroCommQueue::times_reset() {
  busy_ns_ = 0;
  exposed_ns_ = 0;
}

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
      const int64_t t0 = now_ns();
      try {
        task();
      } catch (...) {
        error_ = std::current_exception();
      }
      const int64_t dt = now_ns() - t0;
      busy_ns_ += dt;
      exposed_ns_ += dt;  // inline: the caller computed nothing meanwhile
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
  if (done_ < ticket) {
    const int64_t t0 = now_ns();
    cv_.wait(lk, [&] { return done_ >= ticket; });
    exposed_ns_ += now_ns() - t0;
  }
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
      const int64_t t0 = now_ns();
      try {
        task();
      } catch (...) {
        err = std::current_exception();
      }
      busy_ns_ += now_ns() - t0;
    }
    lk.lock();
    if (err && !error_) error_ = err;
    done_ = ticket;
    cv_.notify_all();
  }
}

}  // namespace dtrain::train
