// --plan-for's grammar (plan_target.h): counts and a GPU size, and the placeholder hosts.
#include "launch/plan_target.h"

#include "core/check.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <vector>

namespace dtrain::launch {

namespace {

constexpr const char* kGrammar =
    "give [NODES x] GPUS x SIZE or SIZE, SIZE in GB (10^9 bytes) or GiB: 8x80GB (one node of 8 GPUs), 2x8x80GB, "
    "1x24GB, or 80GB with --hostfile";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A count: 1 to `max` in decimal digits.
int count_parse(const std::string& text, int max, const std::string& spec, const char* what) {
  if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos)
    DT_THROW(UsageError, "--plan-for '{}': '{}' is not a number of {}; {}", spec, text, what, kGrammar);
  const int n = std::atoi(text.c_str());
  if (n < 1 || n > max)
    DT_THROW(UsageError, "--plan-for '{}': {} {} is outside 1..{}; {}", spec, n, what, max, kGrammar);
  return n;
}

// "80GB" / "80gib" / "23.5GB": bytes.
double size_parse(const std::string& text, const std::string& spec) {
  const std::string t = lower(text);
  double unit = 0;
  std::string number;
  if (t.size() > 3 && t.compare(t.size() - 3, 3, "gib") == 0) {
    unit = 1024.0 * 1024.0 * 1024.0;
    number = t.substr(0, t.size() - 3);
  } else if (t.size() > 2 && t.compare(t.size() - 2, 2, "gb") == 0) {
    unit = 1e9;
    number = t.substr(0, t.size() - 2);
  }
  const bool digits = !number.empty() && number.find_first_not_of("0123456789.") == std::string::npos &&
                      number.find('.') == number.rfind('.') && number.front() != '.' && number.back() != '.';
  if (unit <= 0 || !digits)
    DT_THROW(UsageError, "--plan-for '{}': '{}' is not a GPU memory size; {}", spec, text, kGrammar);
  const double bytes = std::strtod(number.c_str(), nullptr) * unit;
  if (!(bytes > 0 && bytes <= 1e12))
    DT_THROW(UsageError, "--plan-for '{}': each GPU's memory must be above 0 and at most 1000 GB; {}", spec, kGrammar);
  return bytes;
}

std::string gib_text(double b) { return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

std::string PlanTarget::describe() const {
  const std::string size = lower(spec).find("gib") != std::string::npos
                               ? gib_text(gpu_bytes)
                               : fmt::format("{:g} GB ({})", gpu_bytes / 1e9, gib_text(gpu_bytes));
  if (nodes == 0) return fmt::format("GPUs of {} each, on the hostfile's hosts", size);
  return fmt::format("{} GPU{} of {} on {} node{}", nodes * gpus_per_node, nodes * gpus_per_node == 1 ? "" : "s", size,
                     nodes, nodes == 1 ? "" : "s");
}

PlanTarget plan_target_parse(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= spec.size(); ++i)
    if (i == spec.size() || spec[i] == 'x' || spec[i] == 'X') {
      parts.push_back(spec.substr(start, i - start));
      start = i + 1;
    }
  if (spec.empty() || parts.size() > 3) DT_THROW(UsageError, "--plan-for '{}': {}", spec, kGrammar);
  PlanTarget t;
  t.spec = spec;
  t.gpu_bytes = size_parse(parts.back(), spec);
  if (parts.size() == 1) return t;
  t.gpus_per_node = count_parse(parts[parts.size() - 2], config::HOSTFILE_MAX_SLOTS, spec, "GPUs per node");
  t.nodes = parts.size() == 3 ? count_parse(parts[0], config::HOSTFILE_MAX_HOSTS, spec, "nodes") : 1;
  return t;
}

config::Hostfile plan_target_hosts(const PlanTarget& t) {
  DT_ENFORCE(t.nodes > 0 && t.gpus_per_node > 0, InternalError, "plan_target_hosts: '{}' names no GPU count", t.spec);
  std::string text;
  for (int n = 1; n <= t.nodes; ++n) text += fmt::format("node{} slots={}\n", n, t.gpus_per_node);
  return config::hostfile_parse(text, "--plan-for " + t.spec);
}

}  // namespace dtrain::launch
