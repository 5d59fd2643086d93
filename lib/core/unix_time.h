// Unix time in milliseconds: the clock of events.jsonl, metrics.jsonl, nodes.json and the
// heartbeats' values, so records written by the launcher, the agents and the ranks line up.
#pragma once

#include <chrono>
#include <cstdint>

namespace dtrain {

inline int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace dtrain
