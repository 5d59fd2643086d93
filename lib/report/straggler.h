// Straggler detection: a rank whose compute time per step (its step time minus its wait
// in collectives) stays above `factor` times the median rank's for `window` consecutive
// progress records. Fed by the launcher's live view (rank 0's progress records,
// report/progress_record.h) and by `dtrain status` (metrics.jsonl's rank_compute_ms
// arrays); the same rule for both.
#pragma once

#include <vector>

namespace dtrain::report {

/// One progress record's per-rank figures (index = global rank), in ms per step.
struct RankTimes {
  std::vector<double> compute_ms;
  std::vector<double> comm_ms;
};

/// A rank flagged as slow.
struct Straggler {
  int rank = 0;
  double compute_ms = 0.0;  ///< in the latest record
  double median_ms = 0.0;   ///< the median rank's compute time in that record
  double ratio = 0.0;       ///< compute_ms / median_ms
  int records = 0;          ///< consecutive records it has been slow in
};

/// The median of v: for an even count the lower of the two middle values (with two ranks
/// the faster one, so one slow rank of two can be told). NaN for an empty v.
double straggler_median(std::vector<double> v);

class StragglerDetector {
 public:
  /// factor > 1, window >= 1 (the config schema enforces both).
  StragglerDetector(double factor, int window);

  /// Adds one record. A record with another rank count than the previous one (a new
  /// round on a different world size) starts the count over. With comm_ms (same size),
  /// a rank counts as slow only when its excess over the median is also at least
  /// kMinStepShare of its step time (compute + comm): a rank 3x slower at work that is
  /// 1% of the step (rank 0 writing the logs while everyone waits on the network) costs
  /// nothing worth flagging. Returns the ranks flagged after it, in rank order.
  const std::vector<Straggler>& add(const std::vector<double>& compute_ms, const std::vector<double>& comm_ms = {});
  static constexpr double kMinStepShare = 0.05;

  /// The ranks flagged after the last record.
  const std::vector<Straggler>& flagged() const { return flagged_; }
  double factor() const { return factor_; }
  int window() const { return window_; }

 private:
  double factor_;
  int window_;
  std::vector<int> streak_;
  std::vector<Straggler> flagged_;
};

}  // namespace dtrain::report
