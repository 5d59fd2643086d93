// The launch identity of a resource sample (issue 32 item 3): each record names its
// launch ("job_id"), so that after a `dtrain resume` that shrank the world, whose rounds
// count from 0 again, `dtrain status` shows only this launch's ranks, not the earlier
// launch's ranks of the same round number.
#include "monitor/sample.h"
#include "report/resource_status.h"

#include <doctest/doctest.h>

using namespace dtrain;
using nlohmann::json;

namespace {

json sample(const std::string& job, int rank, int round, int64_t t) {
  monitor::ResourceSample s;
  s.time_ms = t;
  s.cpu_pct = 50;
  return monitor::sample_json(s, {.rank = rank,
                                  .local_rank = rank,
                                  .node = rank / 2,
                                  .round = round,
                                  .host = "n" + std::to_string(rank / 2),
                                  .job_id = job});
}

std::vector<int> ranks_shown(const report::ResourceCollector& c) {
  std::vector<int> out;
  for (const auto& n : c.nodes())
    for (const auto& r : n.ranks) out.push_back(r.rank);
  return out;
}

}  // namespace

TEST_CASE("sample_json names the launch; a record without one leaves it out") {
  CHECK(sample("20261127-220000-ab12", 0, 0, 1)["job_id"] == "20261127-220000-ab12");
  CHECK_FALSE(sample("", 0, 0, 1).contains("job_id"));
}

TEST_CASE("a resumed launch of fewer ranks hides the earlier launch's ranks of the same round") {
  report::ResourceCollector c;
  // The first launch: 4 ranks, round 0.
  for (int r = 0; r < 4; ++r) c.add(sample("launch-a", r, 0, 1000 + r));
  CHECK(ranks_shown(c) == std::vector<int>{0, 1, 2, 3});
  // `dtrain resume` on 2 ranks: round 0 again, a new job id.
  for (int r = 0; r < 2; ++r) c.add(sample("launch-b", r, 0, 5000 + r));
  CHECK(ranks_shown(c) == std::vector<int>{0, 1});  // ranks 2 and 3 were launch-a's

  // Files of a version without job_id: the round alone, as before.
  report::ResourceCollector old;
  for (int r = 0; r < 4; ++r) old.add(sample("", r, 0, 1000 + r));
  for (int r = 0; r < 2; ++r) old.add(sample("", r, 1, 5000 + r));
  CHECK(ranks_shown(old) == std::vector<int>{0, 1});
}
