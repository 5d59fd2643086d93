// One events.jsonl record, typed: the launcher (lib/launch/supervisor), `dtrain run`'s
// rank 0 and `dtrain status` build the run's record through this one struct, and the
// readers take a failure's node and cause from here, older run directories included.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain::report {

enum class EventKind {
  ROUND_START,          ///< a round's nodes were started
  ROUND_NOT_STARTED,    ///< no node ran (too few hosts for elastic.min_nodes, the preflight refused)
  MEMBERSHIP,           ///< an elastic job's hosts for the round, each change with its cause
  STRAGGLER,            ///< a rank flagged slower than the median rank
  STRAGGLER_RECOVERED,  ///< ...and no longer
  FAILURE,              ///< how a round failed (or was interrupted) and whether a retry follows
  RESIZE,               ///< a round stopped at a checkpoint to take a host back
  FINISHED,             ///< the job succeeded
  RESOURCE_ALERT        ///< a rank's resource monitor saw low node memory, a full or throttled GPU
};

/// "round_start", "round_not_started", "membership", "straggler", "straggler_recovered",
/// "failure", "resize", "finished", "resource_alert": the record's "event".
const char* event_kind_name(EventKind k);

struct Event {
  EventKind kind = EventKind::FAILURE;
  int round = 0;
  int64_t time_ms = 0;  ///< unix ms; 0 = when it is written (event_json)
  /// The node concerned. A failure always records it: null when no node is to blame (no
  /// node started, the launcher was interrupted, `dtrain run`).
  std::optional<int> node = std::nullopt;
  std::optional<std::string> host = std::nullopt;
  std::optional<std::string> why = std::nullopt;
  std::optional<int> exit_code = std::nullopt;
  std::optional<bool> retry = std::nullopt;  ///< failure: another round follows
  bool interrupted = false;                  ///< failure: a signal stopped the launcher (SIGINT, SIGTERM, SIGHUP)
  std::optional<int> world_size = std::nullopt;
  /// The kind's own fields (membership's hosts and changes, a straggler's figures, a hung
  /// rank's identity and silence, a resize's step, dtrain run's started_by and pid).
  nlohmann::json detail = nlohmann::json::object();
};

/// The record as written: {"event", "round", "time_ms", ...}; a failure's "node" is null
/// when it has none; "interrupted": true only when set.
nlohmann::json event_json(const Event& e);

/// A failure record's node: nullopt when null or absent, and for the -1 (no node) and -2
/// (interrupted) that run directories written before the typed record hold.
std::optional<int> event_node(const nlohmann::json& record);

/// A failure record of an interrupted launcher: "interrupted": true, or an older run
/// directory's "node": -2.
bool event_interrupted(const nlohmann::json& record);

}  // namespace dtrain::report
