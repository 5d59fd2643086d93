// events.jsonl records: the typed event to JSON, and the failure fields read back from
// records of any version.
#include "report/event.h"

#include "core/unix_time.h"

namespace dtrain::report {

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::ROUND_START: return "round_start";
    case EventKind::ROUND_NOT_STARTED: return "round_not_started";
    case EventKind::MEMBERSHIP: return "membership";
    case EventKind::STRAGGLER: return "straggler";
    case EventKind::STRAGGLER_RECOVERED: return "straggler_recovered";
    case EventKind::FAILURE: return "failure";
    case EventKind::RESIZE: return "resize";
    case EventKind::FINISHED: return "finished";
    case EventKind::RESOURCE_ALERT: return "resource_alert";
  }
  return "?";
}

nlohmann::json event_json(const Event& e) {
  nlohmann::json j = e.detail.is_object() ? e.detail : nlohmann::json::object();
  j["time_ms"] = e.time_ms != 0 ? e.time_ms : unix_ms();
  j["event"] = event_kind_name(e.kind);
  j["round"] = e.round;
  if (e.node) j["node"] = *e.node;
  else if (e.kind == EventKind::FAILURE) j["node"] = nullptr;
  if (e.host) j["host"] = *e.host;
  if (e.why) j["why"] = *e.why;
  if (e.exit_code) j["exit_code"] = *e.exit_code;
  if (e.retry) j["retry"] = *e.retry;
  if (e.interrupted) j["interrupted"] = true;
  if (e.world_size) j["world_size"] = *e.world_size;
  return j;
}

std::optional<int> event_node(const nlohmann::json& record) {
  auto it = record.find("node");
  if (it == record.end() || !it->is_number_integer()) return std::nullopt;
  const int node = it->get<int>();
  return node >= 0 ? std::optional<int>(node) : std::nullopt;
}

bool event_interrupted(const nlohmann::json& record) {
  auto it = record.find("interrupted");
  if (it != record.end() && it->is_boolean()) return it->get<bool>();
  auto n = record.find("node");
  return n != record.end() && n->is_number_integer() && n->get<int>() == -2;
}

}  // namespace dtrain::report
