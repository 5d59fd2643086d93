// The round's watch step: observations in, one verdict out.
#include "launch/round.h"

#include "core/error.h"
#include "launch/culprit.h"

namespace dtrain::launch {

int agent_exit_code(const ExitStatus& st) {
  if (st.connection_lost) return static_cast<int>(Exit::LAUNCH);
  const int code = st.exited ? st.code : 128 + st.signal;
  return code == 0 ? static_cast<int>(Exit::LAUNCH) : code;
}

RoundVerdict round_watch(const RoundObservation& obs, const RoundWatchLimits& limits) {
  RoundVerdict v;
  if (obs.interrupted != 0) {
    v.kind = RoundVerdict::Kind::INTERRUPTED;
    v.signal = obs.interrupted;
    return v;
  }
  const int n = static_cast<int>(obs.nodes.size());
  std::vector<FailureSeen> failed;
  int succeeded = 0;
  for (int k = 0; k < n; ++k) {
    const NodeObservation& o = obs.nodes[static_cast<size_t>(k)];
    if (!o.exit) continue;
    if (o.exit->success()) ++succeeded;
    else failed.push_back({k, agent_exit_code(*o.exit), o.exit_seen_at});
  }
  if (!failed.empty()) {
    const std::optional<size_t> c = culprit_pick(failed, obs.now, limits.culprit_window);
    if (!c) return v;  // peers' communication errors so far: look a little longer for the cause
    const int k = failed[*c].who;
    v.kind = RoundVerdict::Kind::AGENT_EXIT;
    v.node = k;
    v.exit = *obs.nodes[static_cast<size_t>(k)].exit;
    v.exit_code = failed[*c].exit_code;
    return v;
  }
  if (succeeded == n) {
    v.kind = RoundVerdict::Kind::SUCCEEDED;
    return v;
  }
  for (int k = 0; k < n; ++k) {
    const NodeObservation& o = obs.nodes[static_cast<size_t>(k)];
    if (o.exit) continue;
    if (!o.last_beat) {
      if (obs.now - obs.started > limits.first_beat_grace) {
        v.kind = RoundVerdict::Kind::NO_FIRST_BEAT;
        v.node = k;
        return v;
      }
    } else if (obs.now - *o.last_beat > limits.heartbeat_timeout) {
      v.kind = RoundVerdict::Kind::MISSED_BEATS;
      v.node = k;
      v.silent_s = std::chrono::duration<double>(obs.now - *o.last_beat).count();
      return v;
    }
  }
  if (obs.rank_hang) {
    v.kind = RoundVerdict::Kind::RANK_HUNG;
    v.node = obs.rank_hang->node;
    v.hang = obs.rank_hang;
  }
  return v;
}

}  // namespace dtrain::launch
