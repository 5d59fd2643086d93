// Straggler rule: a rank above factor x the median rank's compute time for a window of
// consecutive progress records.
#include "report/straggler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain::report {

double straggler_median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t mid = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

StragglerDetector::StragglerDetector(double factor, int window) : factor_(factor), window_(std::max(1, window)) {}

const std::vector<Straggler>& StragglerDetector::add(const std::vector<double>& compute_ms,
                                                     const std::vector<double>& comm_ms) {
  if (compute_ms.size() != streak_.size()) streak_.assign(compute_ms.size(), 0);
  flagged_.clear();
  const double med = straggler_median(compute_ms);
  const bool have_comm = comm_ms.size() == compute_ms.size();
  for (size_t r = 0; r < compute_ms.size(); ++r) {
    const double c = compute_ms[r];
    bool slow = compute_ms.size() > 1 && std::isfinite(c) && std::isfinite(med) && med > 0 && c > factor_ * med;
    if (slow && have_comm) slow = c - med >= kMinStepShare * (c + comm_ms[r]);
    streak_[r] = slow ? streak_[r] + 1 : 0;
    if (streak_[r] >= window_) flagged_.push_back({static_cast<int>(r), c, med, c / med, streak_[r]});
  }
  return flagged_;
}

}  // namespace dtrain::report
