// What rank 0 publishes every steps_per_print steps, from the interval's step outcomes:
// one progress record (report/progress_record.h) written as the human line or the
// launcher's record line, as TensorBoard scalars and as a metrics.jsonl record; and the
// interval's means of the steps' named extra metrics (StepOutcome::metrics).
#pragma once

#include "report/progress_record.h"
#include "train/metrics.h"
#include "train/train_step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::tensorboard {
class EventWriter;
}

namespace dtrain::train {

/// The named metrics of one print interval's steps, each averaged over the steps that
/// carried it, in the order the names first came.
class MetricMeans {
 public:
  /// Adds one step's metrics. InternalError for a name that cannot name a metric
  /// (report::progress_metric_name_problem) or that repeats within the step.
  void add(const report::NamedMetrics& metrics);
  /// The means, and a new interval begins.
  report::NamedMetrics take();

 private:
  struct Sum {
    std::string name;
    double sum = 0.0;
    int64_t steps = 0;
  };
  std::vector<Sum> sums_;
};

/// Where rank 0's progress goes (each: none when null / false).
struct ProgressSinks {
  std::FILE* out = nullptr;  ///< progress lines (stdout)
  /// out gets the record line for the launcher (`dtrain launch`'s ranks) instead of the
  /// human line; the launcher writes the human line into the rank's log.
  bool records = false;
  MetricsWriter* metrics = nullptr;        ///< metrics.jsonl
  tensorboard::EventWriter* tb = nullptr;  ///< TensorBoard (tensorboard.enabled)
  bool loss_scaling = false;               ///< fp16: TensorBoard gets train/loss_scale too
};

/// The interval's last step's figures into rec: loss, lr, grad_norm, loss_scale, skipped.
void progress_record_outcome(report::ProgressRecord& rec, const StepOutcome& last);

/// Writes rec to every sink: its line to out (flushed), the TensorBoard scalars train/loss,
/// train/lr, train/grad_norm, train/tokens_per_s (train/loss_scale with loss_scaling;
/// train/comm_bytes_sent and train/comm_seconds with several ranks) and train/<name> per
/// named metric, and the metrics.jsonl record: rec's figures, the loop's own `fields`
/// (tokens, memory, section times, ...) and the named metrics (report::metrics_record_put).
/// now_ms (unix ms) is both logs' time.
void progress_publish(const report::ProgressRecord& rec, nlohmann::json fields, int64_t now_ms,
                      const ProgressSinks& sinks);

}  // namespace dtrain::train
