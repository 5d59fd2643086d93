// The culprit rule: a process's own error before the communication errors it causes.
#include "launch/culprit.h"

#include "core/error.h"

namespace dtrain::launch {

std::optional<size_t> culprit_pick(const std::vector<FailureSeen>& seen, std::chrono::steady_clock::time_point now,
                                   std::chrono::milliseconds window) {
  std::optional<size_t> first, own;
  auto before = [&](size_t a, size_t b) {
    return seen[a].seen_at != seen[b].seen_at ? seen[a].seen_at < seen[b].seen_at : seen[a].who < seen[b].who;
  };
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!first || before(i, *first)) first = i;
    if (seen[i].exit_code != static_cast<int>(Exit::COMM) && (!own || before(i, *own))) own = i;
  }
  if (own) return own;
  if (first && now - seen[*first].seen_at >= window) return first;
  return std::nullopt;
}

}  // namespace dtrain::launch
