// Rank 0's progress publishing: the interval means of the named metrics, and one record
// to the progress line (human or the launcher's), TensorBoard and metrics.jsonl.
#include "train/progress_publish.h"

#include "core/check.h"
#include "tensorboard/event_writer.h"

#include <algorithm>
#include <cmath>

namespace dtrain::train {

namespace {

// JSON has no inf/NaN: such values are written as null (as the trainer's other records).
nlohmann::json record_num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

}  // namespace

// ----------------------------------------------------------------------------
void MetricMeans::add(const report::NamedMetrics& metrics) {
  for (size_t i = 0; i < metrics.size(); ++i) {
    const std::string& name = metrics[i].first;
    const std::string why = report::progress_metric_name_problem(name);
    DT_ENFORCE(why.empty(), InternalError, "the step's metric '{}' {}", name, why);
    for (size_t k = 0; k < i; ++k)
      DT_ENFORCE(metrics[k].first != name, InternalError, "the step names its metric '{}' twice", name);
    auto it = std::find_if(sums_.begin(), sums_.end(), [&](const Sum& s) { return s.name == name; });
    if (it == sums_.end()) it = sums_.insert(sums_.end(), Sum{name});
    it->sum += metrics[i].second;
    ++it->steps;
  }
}

report::NamedMetrics MetricMeans::take() {
  report::NamedMetrics out;
  for (const Sum& s : sums_) out.emplace_back(s.name, s.sum / static_cast<double>(s.steps));
  sums_.clear();
  return out;
}

// ----------------------------------------------------------------------------
void progress_record_outcome(report::ProgressRecord& rec, const StepOutcome& last) {
  rec.loss = last.loss;
  rec.lr = last.lr;
  rec.grad_norm = last.grad_norm;
  rec.loss_scale = last.loss_scale;
  rec.skipped = !last.applied;
}

void progress_publish(const report::ProgressRecord& rec, nlohmann::json fields, int64_t now_ms,
                      const ProgressSinks& sinks) {
  const bool several = rec.comm_bytes_per_step >= 0;
  if (sinks.out) {
    const std::string line = sinks.records ? report::progress_record_line(rec) : report::progress_line(rec);
    std::fprintf(sinks.out, "%s\n", line.c_str());
    std::fflush(sinks.out);
  }
  // One clock reading for both logs: an event's wall_time is the record's time_ms / 1000.
  if (sinks.tb) {
    std::vector<tensorboard::Scalar> v{{"train/loss", rec.loss},
                                       {"train/lr", rec.lr},
                                       {"train/grad_norm", rec.grad_norm},
                                       {"train/tokens_per_s", rec.tokens_per_s}};
    if (sinks.loss_scaling) v.push_back({"train/loss_scale", rec.loss_scale});  // 1 throughout without fp16
    if (several) {
      v.push_back({"train/comm_bytes_sent", rec.comm_bytes_per_step});
      v.push_back({"train/comm_seconds", rec.comm_s_per_step});
    }
    for (const auto& [name, value] : rec.metrics) v.push_back({"train/" + name, value});
    sinks.tb->scalars(rec.step, v, static_cast<double>(now_ms) / 1e3);
  }
  if (sinks.metrics) {
    nlohmann::json r{{"step", rec.step},
                     {"loss", record_num(rec.loss)},
                     {"lr", record_num(rec.lr)},
                     {"grad_norm", record_num(rec.grad_norm)},
                     {"loss_scale", record_num(rec.loss_scale)},
                     {"tokens_per_s", record_num(rec.tokens_per_s)},
                     {"step_time", record_num(rec.step_time_s)},
                     {"time_ms", now_ms}};
    if (several) {
      // Per rank (index = rank): compute and wait in collectives, ms per step. What
      // compression buys: bytes this rank sent per step (communication.compression
      // shrinks the gradients' share) and the seconds per step the ZeRO engine's
      // collectives took (overlapped with compute or not).
      r["rank_compute_ms"] = rec.times.compute_ms;
      r["rank_comm_ms"] = rec.times.comm_ms;
      r["comm_bytes_sent"] = record_num(rec.comm_bytes_per_step);
      r["comm_seconds"] = record_num(rec.comm_s_per_step);
    }
    if (fields.is_object())
      for (auto& [key, value] : fields.items()) {
        DT_ENFORCE(!r.contains(key), InternalError, "metrics.jsonl field '{}' is written twice", key);
        r[key] = std::move(value);
      }
    report::metrics_record_put(r, rec.metrics);
    sinks.metrics->write(r);
  }
}

}  // namespace dtrain::train
