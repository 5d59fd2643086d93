// Bounded polling for test conditions that settle asynchronously (server-side
// bookkeeping of the rendezvous store): true as soon as pred() holds, false after timeout.
#pragma once

#include <chrono>
#include <thread>

namespace dtrain::rendezvous::test {

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace dtrain::rendezvous::test
