// The trainer's publishing path driven with step outcomes that carry named metrics (as a
// preference step's will): each averaged over its print interval, then on the human line,
// in the launcher's record line (read back exactly), in metrics.jsonl and as TensorBoard
// scalars (checked against metrics.jsonl by the independent reader); an SFT step's empty
// list leaves every output as it was.
#include "train/progress_publish.h"

#include "core/error.h"
#include "core/unix_time.h"
#include "tensorboard/event_writer.h"
#include "temp_dir.h"
#include "tensorboard/tfevents_reader.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;
using dtrain::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Step s's outcome: a loss and lr of its own and, with metrics, DPO-like figures; step 2
// has no logps/chosen and step 4's nll_loss is NaN.
StepOutcome outcome(int s, bool with_metrics) {
  StepOutcome o;
  o.loss = 1.0 / s;
  o.lr = 1e-4f * static_cast<float>(s);
  o.grad_norm = 0.5 * s;
  o.applied = s != 2;
  if (!with_metrics) return o;
  o.metrics = {{"rewards/chosen", 0.1 * s}, {"rewards/rejected", -0.05 * s * s}};
  if (s != 2) o.metrics.push_back({"logps/chosen", -10.0 - s});
  o.metrics.push_back({"rewards/accuracies", s % 2 ? 1.0 : 0.0});
  o.metrics.push_back({"nll_loss", s == 4 ? kNan : 2.0 / s});
  return o;
}

// The interval's means, each over the steps that carried the name, in first-seen order.
report::NamedMetrics expected_means(const std::vector<StepOutcome>& steps) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, int>> sums;
  for (const StepOutcome& o : steps)
    for (const auto& [name, v] : o.metrics) {
      if (!sums.count(name)) order.push_back(name);
      sums[name].first += v;
      sums[name].second += 1;
    }
  report::NamedMetrics out;
  for (const auto& n : order) out.emplace_back(n, sums[n].first / sums[n].second);
  return out;
}

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) s.append(buf, n);
  return s;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t nl; (nl = s.find('\n', at)) != std::string::npos; at = nl + 1) out.push_back(s.substr(at, nl - at));
  return out;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

struct Published {
  std::vector<report::ProgressRecord> records;  // as handed to progress_publish
  std::string out;                              // what went to the progress stream
};

// Steps 1..5 printed every 3 steps (at 3 and 5), as the trainer's loop does: every step's
// outcome into the means, a record at each print step.
Published run_steps(const fs::path& dir, bool with_metrics, bool records, bool several_ranks) {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  MetricsWriter metrics((dir / "metrics.jsonl").string(), false);
  tensorboard::EventWriter tb((dir / "tb").string());
  const ProgressSinks sinks{.out = out, .records = records, .metrics = &metrics, .tb = &tb};
  MetricMeans means;
  Published p;
  std::vector<StepOutcome> interval;
  for (int s = 1; s <= 5; ++s) {
    const StepOutcome o = outcome(s, with_metrics);
    means.add(o.metrics);
    interval.push_back(o);
    if (s % 3 != 0 && s != 5) continue;
    report::ProgressRecord rec;
    rec.step = s;
    rec.total_steps = 5;
    rec.tokens_per_s = 1000.0 * s;
    rec.step_time_s = 0.25;
    progress_record_outcome(rec, o);
    rec.metrics = means.take();
    if (several_ranks) {
      rec.comm_bytes_per_step = 1e5 * s;
      rec.comm_s_per_step = 0.01 * s;
      rec.times = {{10.0, 11.0 * s}, {5.0, 4.0}};
    }
    REQUIRE(rec.metrics.size() == expected_means(interval).size());
    for (size_t i = 0; i < rec.metrics.size(); ++i) {
      CHECK(rec.metrics[i].first == expected_means(interval)[i].first);
      CHECK(same(rec.metrics[i].second, expected_means(interval)[i].second));
    }
    progress_publish(rec, {{"tokens", 64 * s}}, unix_ms() + s, sinks);
    p.records.push_back(rec);
    interval.clear();
  }
  p.out = read_all(out);
  std::fclose(out);
  return p;
}

}  // namespace

TEST_CASE("named metrics: averaged per print interval over the steps that carried them, in first-seen order") {
  MetricMeans m;
  m.add({{"b", 1.0}, {"a", 2.0}});
  m.add({{"a", 4.0}});
  m.add({{"c", 5.0}, {"b", 3.0}});
  const report::NamedMetrics got = m.take();
  REQUIRE(got.size() == 3);
  CHECK(got[0] == std::pair<std::string, double>{"b", 2.0});
  CHECK(got[1] == std::pair<std::string, double>{"a", 3.0});
  CHECK(got[2] == std::pair<std::string, double>{"c", 5.0});
  CHECK(m.take().empty());  // a new interval
  m.add({});
  CHECK(m.take().empty());
  CHECK_THROWS_AS(m.add({{"acc", 1.0}, {"acc", 1.0}}), InternalError);
  CHECK_THROWS_AS(m.add({{"has space", 1.0}}), InternalError);
  CHECK_THROWS_AS(m.add({{"", 1.0}}), InternalError);
}

TEST_CASE("named metrics reach the human line, metrics.jsonl and TensorBoard") {
  TempDir tmp("publish");
  const Published p = run_steps(tmp.path, true, false, false);
  REQUIRE(p.records.size() == 2);

  // The human line: the record's line, each metric "| name value" in order.
  const auto lines = lines_of(p.out);
  REQUIRE(lines.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const report::ProgressRecord& r = p.records[i];
    CHECK(lines[i] == report::progress_line(r));
    size_t at = 0;
    for (const auto& [name, v] : r.metrics) {
      char want[96];
      std::snprintf(want, sizeof want, " | %s %.4f", name.c_str(), v);
      const size_t found = lines[i].find(want, at);
      CHECK_MESSAGE(found != std::string::npos, lines[i] << " lacks" << want);
      at = found == std::string::npos ? at : found;
    }
  }
  CHECK(lines[0].find("| skipped (fp16 overflow)") == std::string::npos);  // step 3 applied (step 2 did not)

  // metrics.jsonl: the fixed fields, the loop's own, then the means under their names.
  const auto rows = metrics_read((tmp.path / "metrics.jsonl").string());
  REQUIRE(rows.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const auto& row = rows[i];
    const report::ProgressRecord& r = p.records[i];
    CHECK(row["step"] == r.step);
    CHECK(row["loss"].get<double>() == r.loss);  // the interval's last step's
    CHECK(row["tokens"] == 64 * r.step);
    std::vector<std::string> names;
    for (const auto& [name, v] : r.metrics) {
      names.push_back(name);
      if (std::isfinite(v)) CHECK(row[name].get<double>() == v);
      else CHECK(row[name].is_null());
    }
    CHECK(row["extra_metrics"].get<std::vector<std::string>>() == names);
    const report::NamedMetrics back = report::metrics_record_get(row);
    REQUIRE(back.size() == r.metrics.size());
    for (size_t k = 0; k < back.size(); ++k) CHECK(same(back[k].second, r.metrics[k].second));
  }
  // Step 4's NaN makes its interval's nll_loss NaN; step 2 had no logps/chosen.
  CHECK(rows[1]["nll_loss"].is_null());
  CHECK(rows[0]["logps/chosen"].get<double>() == doctest::Approx((-11.0 - 13.0) / 2));

  // TensorBoard: train/<name> beside train/loss, every value and time as metrics.jsonl's.
  const auto v = dtrain::test::tfevents_read((tmp.path / "tb").string(), (tmp.path / "metrics.jsonl").string());
  INFO(v.output);
  REQUIRE(v.code == 0);
  for (const char* tag : {"train/loss", "train/rewards/chosen", "train/rewards/rejected", "train/logps/chosen",
                          "train/rewards/accuracies", "train/nll_loss"})
    CHECK_MESSAGE((dtrain::test::tfevents_steps(v, tag) == std::vector<int64_t>{3, 5}), tag);
  CHECK(v.result["metrics_checked"] == 2 * (4 + 5));
}

TEST_CASE("the launcher's record line carries the interval's metrics exactly, with the per-rank times") {
  TempDir tmp("publish-records");
  const Published p = run_steps(tmp.path, true, true, true);
  const auto lines = lines_of(p.out);
  REQUIRE(lines.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const report::ProgressRecord& r = p.records[i];
    std::string error;
    const auto back = report::progress_record_parse(lines[i], &error);
    REQUIRE_MESSAGE(back.has_value(), error << ": " << lines[i]);
    CHECK(back->step == r.step);
    CHECK(back->loss == r.loss);
    CHECK(back->lr == r.lr);
    CHECK(back->skipped == r.skipped);
    CHECK(back->times.compute_ms == r.times.compute_ms);
    CHECK(back->comm_bytes_per_step == r.comm_bytes_per_step);
    REQUIRE(back->metrics.size() == r.metrics.size());
    for (size_t k = 0; k < r.metrics.size(); ++k) {
      CHECK(back->metrics[k].first == r.metrics[k].first);
      CHECK(same(back->metrics[k].second, r.metrics[k].second));
    }
    // The human line the launcher writes into the rank's log from it is the one rank 0
    // would have printed itself.
    CHECK(report::progress_line(*back) == report::progress_line(r));
  }
  const auto rows = metrics_read((tmp.path / "metrics.jsonl").string());
  REQUIRE(rows.size() == 2);
  CHECK(rows[1]["rank_compute_ms"] == nlohmann::json::array({10.0, 55.0}));
  CHECK(rows[1]["comm_bytes_sent"] == 5e5);
}

TEST_CASE("an SFT step's empty list: the line, metrics.jsonl and TensorBoard hold what they held before") {
  TempDir tmp("publish-sft");
  for (bool several : {false, true}) {
    CAPTURE(several);
    const Published p = run_steps(tmp.path, false, false, several);
    for (const auto& line : lines_of(p.out)) CHECK(line.find("rewards") == std::string::npos);
    const auto lines = lines_of(p.out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == report::progress_line(p.records[0]));
    const auto rows = metrics_read((tmp.path / "metrics.jsonl").string());
    REQUIRE(rows.size() == 2);
    std::set<std::string> keys;
    for (const auto& [k, v] : rows[0].items()) keys.insert(k);
    std::set<std::string> want{"step",         "loss",      "lr",      "grad_norm", "loss_scale",
                               "tokens_per_s", "step_time", "time_ms", "tokens"};
    if (several) want.insert({"rank_compute_ms", "rank_comm_ms", "comm_bytes_sent", "comm_seconds"});
    CHECK(keys == want);
    const auto v = dtrain::test::tfevents_read((tmp.path / "tb").string(), (tmp.path / "metrics.jsonl").string());
    INFO(v.output);
    REQUIRE(v.code == 0);
    CHECK(v.result["scalars"].size() == (several ? 6u : 4u));
    fs::remove_all(tmp.path / "tb");
  }
}
