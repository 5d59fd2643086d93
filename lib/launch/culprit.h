// Which failure to blame. When one process of a job dies, its peers fail too, with
// communication errors, at nearly the same moment, and may be seen first: the rule looks
// a little longer (kCulpritWindow) for a failure that is not such a consequence. The
// launcher applies it to its nodes' agents, an agent to its local ranks, `dtrain run`'s
// rank 0 to the ranks' failure reports.
#pragma once

#include <chrono>
#include <optional>
#include <vector>

namespace dtrain::launch {

inline constexpr std::chrono::milliseconds kCulpritWindow{1000};

/// A process seen failing: who (node, local rank, rank), its exit code, when first seen.
struct FailureSeen {
  int who = 0;
  int exit_code = 0;
  std::chrono::steady_clock::time_point seen_at{};
};

/// The index in `seen` of the failure to blame at `now`: the earliest seen (then the
/// lowest who) whose exit code is not Exit::COMM; when all are COMM, the earliest once
/// `window` has passed since it was seen. nullopt: none yet (seen empty, or all COMM and
/// the window still open: look again).
std::optional<size_t> culprit_pick(const std::vector<FailureSeen>& seen, std::chrono::steady_clock::time_point now,
                                   std::chrono::milliseconds window = kCulpritWindow);

}  // namespace dtrain::launch
