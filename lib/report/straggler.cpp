// Straggler rule (consecutive records above factor x median) and the rank_times line
// rank 0 prints for the launcher.
#include "report/straggler.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
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

std::string rank_times_format(const RankTimes& t) {
  auto list = [](const std::vector<double>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:.2f}", i ? "," : "", v[i]);
    return s;
  };
  return fmt::format("rank_times compute_ms {} comm_ms {}", list(t.compute_ms), list(t.comm_ms));
}

namespace {

bool parse_list(std::string_view s, std::vector<double>* out) {
  out->clear();
  while (!s.empty()) {
    const size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    double v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || p != item.data() + item.size()) return false;
    out->push_back(v);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
    if (s.empty()) return false;
  }
  return !out->empty();
}

}  // namespace

std::optional<RankTimes> rank_times_parse(std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  constexpr std::string_view head = "rank_times compute_ms ";
  if (line.rfind(head, 0) != 0) return std::nullopt;
  line.remove_prefix(head.size());
  const size_t mid = line.find(" comm_ms ");
  if (mid == std::string_view::npos) return std::nullopt;
  RankTimes t;
  if (!parse_list(line.substr(0, mid), &t.compute_ms) || !parse_list(line.substr(mid + 9), &t.comm_ms) ||
      t.compute_ms.size() != t.comm_ms.size())
    return std::nullopt;
  return t;
}

}  // namespace dtrain::report
