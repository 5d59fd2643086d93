// A thread-safe collector of a spawned process's output lines for the spawner tests,
// with a bounded wait for stdout lines.
#pragma once

#include "launch/spawner.h"

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtrain::test {

struct Lines {
  std::mutex mu;
  std::vector<std::pair<launch::Stream, std::string>> all;
  launch::LineCallback callback() {
    return [this](launch::Stream s, std::string_view line) {
      std::lock_guard lock(mu);
      all.emplace_back(s, std::string(line));
    };
  }
  std::vector<std::string> of(launch::Stream s) {
    std::lock_guard lock(mu);
    std::vector<std::string> out;
    for (auto& [stream, line] : all)
      if (stream == s) out.push_back(line);
    return out;
  }
  // Waits (bounded) until `count` stdout lines arrived.
  bool wait_stdout(std::size_t count, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (of(launch::Stream::STDOUT).size() < count) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
};

}  // namespace dtrain::test
