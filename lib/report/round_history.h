// The rounds of a run as events.jsonl records them: which were attempted, which started,
// and why each one after the first exists (a restart after a failure, a resize at a
// checkpoint, a new launch by `dtrain resume`). `dtrain status` and `dtrain plot` both
// count from this, so they agree.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::report {

/// Why a round exists.
enum class RoundCause {
  FIRST,    ///< the run directory's first recorded round
  RESTART,  ///< the round before it failed or could not start, and it was retried
  RESIZE,   ///< the round before it stopped at a checkpoint to take a host back ("resize" event)
  RESUME    ///< a round 0 after earlier rounds: a new launcher (`dtrain resume`) took the run over
};

/// "first", "restart", "resize", "resume".
const char* round_cause_name(RoundCause c);

/// One round: a "round_start" event (it ran) or a "round_not_started" event (no node ran:
/// too few hosts for elastic.min_nodes, or the preflight refused; its "failure" follows).
struct RoundRecord {
  int round = 0;  ///< the event's round number
  bool started = true;
  RoundCause cause = RoundCause::FIRST;
  int number = 0;        ///< 1-based count of its cause so far (the 2nd restart: 2); FIRST: 0
  int64_t time_ms = -1;  ///< the event's time_ms (-1: not recorded)
  std::string why;       ///< not started: the event's "why"
};

struct RoundHistory {
  std::vector<RoundRecord> rounds;  ///< in events.jsonl order
  int restarts = 0;                 ///< rounds with cause RESTART (started or not)
  int resizes = 0;
  int resumes = 0;
  int not_started = 0;
};

/// The rounds of `events` (events.jsonl records in file order). Each "round_start" and
/// "round_not_started" is one round; a "resize" event between two rounds makes the later
/// one a resize, a round numbered 0 after earlier rounds is a resume, any other round
/// after the first is a restart. Records without an "event" are ignored.
RoundHistory round_history(const std::vector<nlohmann::json>& events);

}  // namespace dtrain::report
