// Round history: one pass over events.jsonl's records classifying every round by what
// ended the round before it.
#include "report/round_history.h"

namespace dtrain::report {

const char* round_cause_name(RoundCause c) {
  switch (c) {
    case RoundCause::FIRST: return "first";
    case RoundCause::RESTART: return "restart";
    case RoundCause::RESIZE: return "resize";
    case RoundCause::RESUME: return "resume";
  }
  return "?";
}

RoundHistory round_history(const std::vector<nlohmann::json>& events) {
  RoundHistory h;
  bool resized = false;  // a "resize" event since the last round record
  for (const nlohmann::json& e : events) {
    if (!e.is_object()) continue;
    auto ev = e.find("event");
    if (ev == e.end() || !ev->is_string()) continue;
    const std::string name = ev->get<std::string>();
    if (name == "resize") {
      resized = true;
      continue;
    }
    if (name != "round_start" && name != "round_not_started") continue;
    RoundRecord r;
    auto num = e.find("round");
    r.round = num != e.end() && num->is_number_integer() ? num->get<int>() : static_cast<int>(h.rounds.size());
    r.started = name == "round_start";
    auto t = e.find("time_ms");
    if (t != e.end() && t->is_number_integer()) r.time_ms = t->get<int64_t>();
    auto why = e.find("why");
    if (why != e.end() && why->is_string()) r.why = why->get<std::string>();
    if (h.rounds.empty()) {
      r.cause = RoundCause::FIRST;
    } else if (r.round == 0) {
      r.cause = RoundCause::RESUME;
      r.number = ++h.resumes;
    } else if (resized) {
      r.cause = RoundCause::RESIZE;
      r.number = ++h.resizes;
    } else {
      r.cause = RoundCause::RESTART;
      r.number = ++h.restarts;
    }
    if (!r.started) ++h.not_started;
    resized = false;
    h.rounds.push_back(std::move(r));
  }
  return h;
}

}  // namespace dtrain::report
