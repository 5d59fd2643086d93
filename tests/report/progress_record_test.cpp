// The progress record: its line round-trips exactly (non-finite numbers, per-rank times,
// named metrics in their order), other lines are not records, a damaged record says
// why; the human line is the trainer's line of before records, plus the named metrics;
// the live view's short names; the named metrics' keys in metrics.jsonl, read back.
#include "report/progress_record.h"

#include "core/error.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

using namespace dtrain::report;

namespace {

// The trainer's printf of its progress line before the record existed (lib/train/trainer.cpp
// at 9b79468), so a record's human line can be held to it.
std::string line_before_records(const ProgressRecord& r) {
  char comm_part[96] = "";
  if (r.comm_bytes_per_step >= 0)
    std::snprintf(comm_part, sizeof comm_part, " | sent %.3f MB/step | comm %.1f ms/step", r.comm_bytes_per_step / 1e6,
                  1e3 * r.comm_s_per_step);
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "step %lld/%lld | loss %.4f | lr %.1e | grad_norm %.3f | loss_scale %.0f | tokens/s %.0f | %.2f s/step%s%s",
      static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
      static_cast<double>(static_cast<float>(r.lr)), r.grad_norm, r.loss_scale, r.tokens_per_s, r.step_time_s,
      comm_part, r.skipped ? " | skipped (fp16 overflow)" : "");
  return buf;
}

ProgressRecord sample() {
  ProgressRecord r;
  r.step = 40;
  r.total_steps = 200;
  r.loss = 2.3141592653589793;
  r.lr = static_cast<float>(3e-4);
  r.grad_norm = 0.8123;
  r.loss_scale = 65536;
  r.tokens_per_s = 18234.25;
  r.step_time_s = 0.45;
  return r;
}

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

std::string parse_error(const std::string& line) {
  std::string error;
  CHECK_FALSE(progress_record_parse(line, &error).has_value());
  return error;
}

}  // namespace

TEST_CASE("progress record: the line round-trips exactly, named metrics in their order") {
  ProgressRecord r = sample();
  r.loss = kNan;
  r.grad_norm = kInf;
  r.skipped = true;
  r.comm_bytes_per_step = 18187627.5;
  r.comm_s_per_step = 0.8124;
  r.times = {{12.5, 13.0 / 3.0, 40.25}, {30.0, 29.75, 1.0 / 7.0}};
  // Not in name order: the order is the step's.
  r.metrics = {{"rewards/chosen", 0.1 + 0.2},
               {"rewards/rejected", -0.5},
               {"rewards/accuracies", 2.0 / 3.0},
               {"logps/chosen", -kInf},
               {"nll_loss", kNan}};
  const std::string line = progress_record_line(r);
  CHECK(line.rfind(kProgressRecordPrefix, 0) == 0);
  CHECK(line.find('\n') == std::string::npos);
  std::string error = "stale";
  auto back = progress_record_parse(line, &error);
  REQUIRE_MESSAGE(back.has_value(), error);
  CHECK(error.empty());
  CHECK(back->step == r.step);
  CHECK(back->total_steps == r.total_steps);
  CHECK(std::isnan(back->loss));
  CHECK(back->lr == r.lr);
  CHECK(back->grad_norm == kInf);
  CHECK(back->loss_scale == r.loss_scale);
  CHECK(back->tokens_per_s == r.tokens_per_s);
  CHECK(back->step_time_s == r.step_time_s);
  CHECK(back->skipped);
  CHECK(back->comm_bytes_per_step == r.comm_bytes_per_step);
  CHECK(back->comm_s_per_step == r.comm_s_per_step);
  CHECK(back->times.compute_ms == r.times.compute_ms);
  CHECK(back->times.comm_ms == r.times.comm_ms);
  REQUIRE(back->metrics.size() == r.metrics.size());
  for (size_t i = 0; i < r.metrics.size(); ++i) {
    CAPTURE(i);
    CHECK(back->metrics[i].first == r.metrics[i].first);
    CHECK(same(back->metrics[i].second, r.metrics[i].second));
  }

  // One rank: no communication figures, no per-rank times, no metrics.
  const ProgressRecord one = sample();
  auto b1 = progress_record_parse(progress_record_line(one), &error);
  REQUIRE(b1.has_value());
  CHECK(b1->comm_bytes_per_step < 0);
  CHECK(b1->comm_s_per_step < 0);
  CHECK(b1->times.compute_ms.empty());
  CHECK(b1->metrics.empty());
  CHECK_FALSE(b1->skipped);
}

TEST_CASE("progress record: other lines are not records; a damaged record says what is wrong") {
  std::string error = "stale";
  for (const char* other : {"", "train: gpt2 124M params", "step 4/10 | loss 2.0 | lr 1.0e-03",
                            "eval step 40 | eval_loss 2.1 | eval_ppl 8.1", "rank_times compute_ms 1,2 comm_ms 3,4",
                            " dtrain-progress {}", "dtrain-progres {}"}) {
    CAPTURE(other);
    CHECK_FALSE(progress_record_parse(other, &error).has_value());
    CHECK(error.empty());
  }
  const std::string p(kProgressRecordPrefix);
  CHECK(parse_error(p + "{\"v\":1,\"step\":4") == "it is not one JSON object");  // cut short
  CHECK(parse_error(p + "[1,2]") == "it is not one JSON object");
  CHECK(parse_error(p + R"({"v":2,"step":4,"total_steps":10,"loss":2})").find("its version is 2") != std::string::npos);
  CHECK(parse_error(p + R"({"step":4,"total_steps":10,"loss":2})").find("its version is missing") != std::string::npos);
  CHECK(parse_error(p + R"({"v":1,"total_steps":10,"loss":2})") == "it has no \"step\"");
  CHECK(parse_error(p + R"({"v":1,"step":4,"total_steps":10})") == "it has no \"loss\"");
  CHECK(parse_error(p + R"({"v":1,"step":-4,"total_steps":10,"loss":2})") == "\"step\" is not a non-negative integer");
  CHECK(parse_error(p + R"({"v":1,"step":4.5,"total_steps":10,"loss":2})") == "\"step\" is not a non-negative integer");
  CHECK(parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":"two"})") == "\"loss\" is not a number");
  CHECK(parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":2,"skipped":1})") ==
        "\"skipped\" is not true or false");
  CHECK(parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":2,"rank_compute_ms":[1,2],"rank_comm_ms":[1]})") ==
        "\"rank_compute_ms\" has 2 ranks, \"rank_comm_ms\" 1");
  CHECK(
      parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":2,"rank_compute_ms":[1,"x"],"rank_comm_ms":[1,2]})") ==
      "\"rank_compute_ms\" is not a list of numbers");
  CHECK(parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":2,"metrics":[1]})") ==
        "\"metrics\" is not an object of named numbers");
  CHECK(parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":2,"metrics":{"acc":"high"}})") ==
        "\"metrics.acc\" is not a number");
  CHECK(
      parse_error(p + R"({"v":1,"step":4,"total_steps":10,"loss":2,"metrics":{"a b":1}})").find("metric 'a b' holds") ==
      0);

  // Fields it does not know (a newer trainer's) are passed over; the optional ones may be absent.
  auto r = progress_record_parse(p + R"({"v":1,"step":4,"total_steps":10,"loss":2.5,"future":[1]})", &error);
  REQUIRE(r.has_value());
  CHECK(r->step == 4);
  CHECK(r->loss == 2.5);
  CHECK(r->loss_scale == 1.0);
  CHECK(r->comm_bytes_per_step < 0);
}

TEST_CASE("progress record: the human line is the trainer's line of before, then the named metrics") {
  ProgressRecord r = sample();
  CHECK(progress_line(r) == line_before_records(r));
  CHECK(progress_line(r) ==
        "step 40/200 | loss 2.3142 | lr 3.0e-04 | grad_norm 0.812 | loss_scale 65536 | tokens/s 18234 | 0.45 s/step");
  r.skipped = true;
  CHECK(progress_line(r) == line_before_records(r));
  r.comm_bytes_per_step = 274123;
  r.comm_s_per_step = 0.01937;
  CHECK(progress_line(r) == line_before_records(r));
  CHECK(progress_line(r).find(" | sent 0.274 MB/step | comm 19.4 ms/step | skipped (fp16 overflow)") !=
        std::string::npos);
  r.loss = kNan;
  r.grad_norm = kInf;
  CHECK(progress_line(r) == line_before_records(r));

  // Named metrics: each "| name value" after the figures, before a skip mark.
  r.metrics = {{"rewards/accuracies", 14.0 / 15.0}, {"rewards/margins", 1.2}};
  const std::string with = progress_line(r);
  const std::string base = line_before_records(r);
  const std::string skip = " | skipped (fp16 overflow)";
  CHECK(with ==
        base.substr(0, base.size() - skip.size()) + " | rewards/accuracies 0.9333 | rewards/margins 1.2000" + skip);
}

TEST_CASE("progress record: the live view's short names") {
  CHECK(progress_metrics_compact({}) == "");
  CHECK(progress_metrics_compact({{"rewards/accuracies", 14.0 / 15.0}, {"rewards/margins", 1.2}}) ==
        "acc 0.933 margin 1.2");
  CHECK(progress_metrics_compact({{"rewards/chosen", 0.5123},
                                  {"rewards/rejected", -0.6812},
                                  {"logps/chosen", -123.456},
                                  {"logps/rejected", -150.0},
                                  {"sft_loss", 2.0}}) ==
        "chosen 0.512 rejected -0.681 logp_chosen -123 logp_rejected -150 sft_loss 2");
}

TEST_CASE("progress record: named metrics in metrics.jsonl: top-level keys, listed in order, read back") {
  nlohmann::json rec{{"step", 7}, {"loss", 0.69}};
  metrics_record_put(rec, {{"rewards/margins", 0.25}, {"rewards/accuracies", 0.75}, {"logps/chosen", kNan}});
  // The file's line, read back.
  const nlohmann::json back = nlohmann::json::parse(rec.dump());
  CHECK(back["rewards/margins"] == 0.25);
  CHECK(back["logps/chosen"].is_null());  // JSON has no NaN, as the record's loss
  CHECK(back["extra_metrics"] == nlohmann::json::array({"rewards/margins", "rewards/accuracies", "logps/chosen"}));
  const NamedMetrics m = metrics_record_get(back);
  REQUIRE(m.size() == 3);
  CHECK(m[0] == std::pair<std::string, double>{"rewards/margins", 0.25});
  CHECK(m[1] == std::pair<std::string, double>{"rewards/accuracies", 0.75});
  CHECK(m[2].first == "logps/chosen");
  CHECK(std::isnan(m[2].second));

  // None: the record stays as records of runs before named metrics.
  nlohmann::json sft{{"step", 7}, {"loss", 0.69}};
  metrics_record_put(sft, {});
  CHECK(sft == nlohmann::json{{"step", 7}, {"loss", 0.69}});
  CHECK(metrics_record_get(sft).empty());
  // A damaged list reads as none (status is lenient with rank 0's file).
  CHECK(metrics_record_get(nlohmann::json{{"extra_metrics", "acc"}}).empty());
  CHECK(metrics_record_get(nlohmann::json{{"extra_metrics", {1, 2}}}).empty());

  // A name the record has (a built-in field, a repeat) or a bad name is the step's mistake.
  nlohmann::json clash{{"step", 7}, {"loss", 0.69}};
  CHECK_THROWS_AS(metrics_record_put(clash, {{"loss", 1.0}}), dtrain::InternalError);
  nlohmann::json twice{{"step", 7}};
  CHECK_THROWS_AS(metrics_record_put(twice, {{"acc", 1.0}, {"acc", 2.0}}), dtrain::InternalError);
  nlohmann::json bad{{"step", 7}};
  CHECK_THROWS_AS(metrics_record_put(bad, {{"a|b", 1.0}}), dtrain::InternalError);
  CHECK(progress_metric_name_problem("rewards/accuracies").empty());
  CHECK_FALSE(progress_metric_name_problem("").empty());
  CHECK_FALSE(progress_metric_name_problem(std::string(65, 'x')).empty());
  CHECK_FALSE(progress_metric_name_problem("tab\there").empty());
  CHECK_FALSE(progress_metric_name_problem("caf\xc3\xa9").empty());
}
