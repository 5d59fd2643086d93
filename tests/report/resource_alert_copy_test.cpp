// The ranks' resource alerts travel in their own files (issue 32 item 2): an alert record
// ({"kind": "resource_alert"}) becomes the same typed event the launcher appends to
// events.jsonl; the launcher's tail hands the alert records over apart from the samples
// and only once; `dtrain status` of a `dtrain run` job (no launcher to copy them) reads
// them from the ranks' files, once each beside those events.jsonl holds, while a
// launcher's run directory shows only events.jsonl's (the launcher copies each).
#include "report/event.h"
#include "report/resource_status.h"
#include "report/status.h"

#include "core/unix_time.h"
#include "resource_files.h"
#include "temp_dir.h"

#include <doctest/doctest.h>

#include <fstream>

using namespace dtrain::report;
using nlohmann::json;

namespace {

using dtrain::test::rank_file;

void append(const std::filesystem::path& p, const std::string& line) { dtrain::test::append_line(p, line); }

// A rank's alert record as lib/monitor writes it: the event with "kind" added.
json alert_record(int rank, int node, int64_t t, const std::string& alert) {
  Event e{.kind = EventKind::RESOURCE_ALERT,
          .round = 1,
          .time_ms = t,
          .node = node,
          .host = "n" + std::to_string(node),
          .why = alert + " because",
          .detail = {{"alert", alert}, {"rank", rank}}};
  json r = event_json(e);
  r["kind"] = kResourceAlertKind;
  return r;
}

json sample(int rank, int node, int64_t t) {
  return {{"kind", "resource"}, {"time_ms", t}, {"rank", rank}, {"node", node}, {"host", "n"}, {"round", 1}};
}

}  // namespace

TEST_CASE("resource_alert_event: a rank's alert record is the events.jsonl record without its kind") {
  const json rec = alert_record(3, 1, 1700000000123, "low_memory");
  const auto ev = resource_alert_event(rec);
  REQUIRE(ev.has_value());
  json copied = event_json(*ev);
  json want = rec;
  want.erase("kind");
  CHECK(copied == want);
  CHECK(copied["event"] == "resource_alert");
  CHECK(copied["rank"] == 3);
  CHECK(copied["node"] == 1);
  // Anything else is not one.
  CHECK_FALSE(resource_alert_event(sample(0, 0, 1)).has_value());
  CHECK_FALSE(resource_alert_event(want).has_value());  // an events.jsonl record: already copied
  CHECK_FALSE(resource_alert_event(json::array()).has_value());
}

TEST_CASE("ResourceTail: alert records apart from the samples, each once, complete lines only") {
  dtrain::test::TempDir d("alert-tail");
  append(rank_file(d, 0), alert_record(0, 0, 1, "gpu_memory").dump());  // before the tail: an earlier round's
  ResourceTail tail(d.path.string());
  ResourceCollector c;
  std::vector<json> alerts;
  CHECK_FALSE(tail.poll(c, &alerts));
  append(rank_file(d, 0), sample(0, 0, 10).dump());
  append(rank_file(d, 1), alert_record(1, 0, 11, "low_memory").dump());
  { std::ofstream(rank_file(d, 1), std::ios::app) << alert_record(1, 0, 12, "gpu_throttle").dump().substr(0, 20); }
  CHECK(tail.poll(c, &alerts));
  REQUIRE(alerts.size() == 1);  // the torn one waits for its newline
  CHECK(alerts[0]["alert"] == "low_memory");
  REQUIRE(c.nodes().size() == 1);
  CHECK(c.nodes()[0].ranks.size() == 1);  // the alert is no sample
  {
    const std::string whole = alert_record(1, 0, 12, "gpu_throttle").dump();
    std::ofstream(rank_file(d, 1), std::ios::app) << whole.substr(20) << "\n";
  }
  alerts.clear();
  CHECK(tail.poll(c, &alerts));
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0]["alert"] == "gpu_throttle");
  alerts.clear();
  CHECK_FALSE(tail.poll(c, &alerts));  // nothing twice
  CHECK(alerts.empty());
}

TEST_CASE("status: a dtrain run job's alerts come from the ranks' files; a launcher's from events.jsonl only") {
  const int64_t now = dtrain::unix_ms();
  SUBCASE("dtrain run") {
    dtrain::test::TempDir d("alert-external");
    append(d.path / "config.yaml", "training: {}");
    for (const Event& e : status_external_round_start(d.path.string(), 2, "torchrun"))
      append(d.path / "events.jsonl", event_json(e).dump());
    // One alert that an earlier launcher round copied, also still in the rank's file.
    json copied = alert_record(0, 0, now - 5000, "low_memory");
    append(rank_file(d, 0), copied.dump());
    copied.erase("kind");
    append(d.path / "events.jsonl", copied.dump());
    append(rank_file(d, 0), sample(0, 0, now - 4000).dump());
    append(rank_file(d, 1), alert_record(1, 1, now - 3000, "gpu_throttle").dump());
    const RunStatus st = status_read(d.path.string());
    REQUIRE(st.resource_alerts.size() == 2);  // the copied one once
    CHECK(st.resource_alerts[0].alert == "low_memory");
    CHECK(st.resource_alerts[1].alert == "gpu_throttle");
    CHECK(st.resource_alerts[1].rank == 1);
    const std::string out = status_format(st, now);
    CHECK(out.find("2 resource alert(s) in events.jsonl and the ranks' resources/rank<R>.jsonl") != std::string::npos);
    CHECK(out.find("gpu_throttle: gpu_throttle because") != std::string::npos);
  }
  SUBCASE("dtrain launch") {
    dtrain::test::TempDir d("alert-launcher");
    append(d.path / "config.yaml", "training: {}");
    append(d.path / "events.jsonl", json{{"time_ms", now - 9000}, {"event", "round_start"}, {"round", 0}}.dump());
    // Not copied yet by the launcher (or never, after a kill): status shows events.jsonl's.
    append(rank_file(d, 1), alert_record(1, 1, now - 3000, "gpu_throttle").dump());
    CHECK(status_read(d.path.string()).resource_alerts.empty());
  }
}
