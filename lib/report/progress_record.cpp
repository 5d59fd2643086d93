// Progress record: the record line (prefix + JSON, non-finite numbers as strings) and its
// reader, the human progress line, the live view's compact metric names, and the named
// metrics' keys in metrics.jsonl.
#include "report/progress_record.h"

#include "core/check.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace dtrain::report {

namespace {

using ojson = nlohmann::ordered_json;

// JSON has no inf/NaN: the record line writes them as strings, so they come back as they were.
ojson num_out(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

bool num_in(const ojson& j, double* v) {
  if (j.is_number()) {
    *v = j.get<double>();
    return true;
  }
  if (!j.is_string()) return false;
  const std::string& s = j.get_ref<const std::string&>();
  if (s == "nan") *v = std::numeric_limits<double>::quiet_NaN();
  else if (s == "inf") *v = std::numeric_limits<double>::infinity();
  else if (s == "-inf") *v = -std::numeric_limits<double>::infinity();
  else return false;
  return true;
}

ojson list_out(const std::vector<double>& v) {
  ojson a = ojson::array();
  for (double x : v) a.push_back(num_out(x));
  return a;
}

// Fields of a record being read: each getter sets error_ on the first problem.
class Fields {
 public:
  explicit Fields(const ojson& j) : j_(j) {}

  void count(const char* key, int64_t* v, bool required) {
    auto it = j_.find(key);
    if (it == j_.end()) return missing(key, required);
    if (!it->is_number_integer() || it->get<int64_t>() < 0) return bad(key, "a non-negative integer");
    *v = it->get<int64_t>();
  }
  void number(const char* key, double* v, bool required = false) {
    auto it = j_.find(key);
    if (it == j_.end()) return missing(key, required);
    if (!num_in(*it, v)) bad(key, "a number");
  }
  void flag(const char* key, bool* v) {
    auto it = j_.find(key);
    if (it == j_.end()) return;
    if (!it->is_boolean()) return bad(key, "true or false");
    *v = it->get<bool>();
  }
  void list(const char* key, std::vector<double>* v) {
    auto it = j_.find(key);
    if (it == j_.end()) return;
    if (!it->is_array()) return bad(key, "a list of numbers");
    v->clear();
    for (const ojson& x : *it) {
      double d = 0;
      if (!num_in(x, &d)) return bad(key, "a list of numbers");
      v->push_back(d);
    }
  }
  void metrics(const char* key, NamedMetrics* m) {
    auto it = j_.find(key);
    if (it == j_.end()) return;
    if (!it->is_object()) return bad(key, "an object of named numbers");
    for (const auto& [name, value] : it->items()) {
      if (std::string why = progress_metric_name_problem(name); !why.empty()) {
        if (error_.empty()) error_ = fmt::format("metric '{}' {}", name, why);
        return;
      }
      double d = 0;
      if (!num_in(value, &d)) return bad(fmt::format("metrics.{}", name).c_str(), "a number");
      m->emplace_back(name, d);
    }
  }
  const std::string& error() const { return error_; }

 private:
  void missing(const char* key, bool required) {
    if (required && error_.empty()) error_ = fmt::format("it has no \"{}\"", key);
  }
  void bad(const char* key, const char* what) {
    if (error_.empty()) error_ = fmt::format("\"{}\" is not {}", key, what);
  }
  const ojson& j_;
  std::string error_;
};

// Short names for the live view: TRL's and LLaMA-Factory's preference metrics.
std::string_view compact_name(std::string_view name) {
  static constexpr std::pair<std::string_view, std::string_view> kShort[] = {
      {"rewards/accuracies", "acc"},     {"rewards/margins", "margin"},        {"rewards/chosen", "chosen"},
      {"rewards/rejected", "rejected"},  {"logps/chosen", "logp_chosen"},      {"logps/rejected", "logp_rejected"},
      {"logits/chosen", "logit_chosen"}, {"logits/rejected", "logit_rejected"}};
  for (const auto& [full, shorter] : kShort)
    if (name == full) return shorter;
  return name;
}

}  // namespace

// ---------------------------------------------------------------------------

std::string progress_record_line(const ProgressRecord& r) {
  ojson j;
  j["v"] = kProgressRecordVersion;
  j["step"] = r.step;
  j["total_steps"] = r.total_steps;
  j["loss"] = num_out(r.loss);
  j["lr"] = num_out(r.lr);
  j["grad_norm"] = num_out(r.grad_norm);
  j["loss_scale"] = num_out(r.loss_scale);
  j["tokens_per_s"] = num_out(r.tokens_per_s);
  j["step_time"] = num_out(r.step_time_s);
  j["skipped"] = r.skipped;
  if (r.comm_bytes_per_step >= 0) j["comm_bytes_sent"] = num_out(r.comm_bytes_per_step);
  if (r.comm_s_per_step >= 0) j["comm_seconds"] = num_out(r.comm_s_per_step);
  if (!r.times.compute_ms.empty()) {
    j["rank_compute_ms"] = list_out(r.times.compute_ms);
    j["rank_comm_ms"] = list_out(r.times.comm_ms);
  }
  if (!r.metrics.empty()) {
    ojson m = ojson::object();
    for (const auto& [name, value] : r.metrics) m[name] = num_out(value);
    j["metrics"] = std::move(m);
  }
  return std::string(kProgressRecordPrefix) + j.dump();
}

std::optional<ProgressRecord> progress_record_parse(std::string_view line, std::string* error) {
  error->clear();
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  if (line.substr(0, kProgressRecordPrefix.size()) != kProgressRecordPrefix) return std::nullopt;
  line.remove_prefix(kProgressRecordPrefix.size());
  const ojson j = ojson::parse(line, nullptr, false);
  if (!j.is_object()) {
    *error = "it is not one JSON object";
    return std::nullopt;
  }
  auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != kProgressRecordVersion) {
    *error = fmt::format("its version is {}, this dtrain reads version {} (run the same dtrain build on every node)",
                         v == j.end() ? std::string("missing") : v->dump(), kProgressRecordVersion);
    return std::nullopt;
  }
  ProgressRecord r;
  Fields f(j);
  f.count("step", &r.step, true);
  f.count("total_steps", &r.total_steps, true);
  f.number("loss", &r.loss, true);
  f.number("lr", &r.lr);
  f.number("grad_norm", &r.grad_norm);
  f.number("loss_scale", &r.loss_scale);
  f.number("tokens_per_s", &r.tokens_per_s);
  f.number("step_time", &r.step_time_s);
  f.flag("skipped", &r.skipped);
  f.number("comm_bytes_sent", &r.comm_bytes_per_step);
  f.number("comm_seconds", &r.comm_s_per_step);
  f.list("rank_compute_ms", &r.times.compute_ms);
  f.list("rank_comm_ms", &r.times.comm_ms);
  f.metrics("metrics", &r.metrics);
  if (!f.error().empty()) {
    *error = f.error();
    return std::nullopt;
  }
  if (r.times.compute_ms.size() != r.times.comm_ms.size()) {
    *error = fmt::format("\"rank_compute_ms\" has {} ranks, \"rank_comm_ms\" {}", r.times.compute_ms.size(),
                         r.times.comm_ms.size());
    return std::nullopt;
  }
  return r;
}

// ---------------------------------------------------------------------------

std::string progress_line(const ProgressRecord& r) {
  // printf's formatting, byte for byte the line the trainer has always printed.
  char head[256];
  std::snprintf(head, sizeof head,
                "step %lld/%lld | loss %.4f | lr %.1e | grad_norm %.3f | loss_scale %.0f | tokens/s %.0f | %.2f s/step",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss, r.lr, r.grad_norm,
                r.loss_scale, r.tokens_per_s, r.step_time_s);
  std::string s = head;
  if (r.comm_bytes_per_step >= 0) {
    char comm[96];
    std::snprintf(comm, sizeof comm, " | sent %.3f MB/step | comm %.1f ms/step", r.comm_bytes_per_step / 1e6,
                  1e3 * r.comm_s_per_step);
    s += comm;
  }
  for (const auto& [name, value] : r.metrics) {
    char v[64];
    std::snprintf(v, sizeof v, "%.4f", value);
    s += fmt::format(" | {} {}", name, v);
  }
  if (r.skipped) s += " | skipped (fp16 overflow)";
  return s;
}

std::string progress_metrics_compact(const NamedMetrics& metrics) {
  std::string s;
  for (const auto& [name, value] : metrics) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{} {:.3g}", compact_name(name), value);
  }
  return s;
}

// ---------------------------------------------------------------------------

std::string progress_metric_name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > 64) return fmt::format("is {} bytes long, more than 64", name.size());
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '|' || c == '"')
      return "holds a space, a control or non-ASCII byte, '|' or '\"' (names are written into lines and tags as they are)";
  }
  return "";
}

void metrics_record_put(nlohmann::json& record, const NamedMetrics& metrics) {
  if (metrics.empty()) return;
  DT_ENFORCE(!record.contains("extra_metrics"), InternalError, "the metrics.jsonl record already has extra_metrics");
  nlohmann::json names = nlohmann::json::array();
  for (const auto& [name, value] : metrics) {
    const std::string why = progress_metric_name_problem(name);
    DT_ENFORCE(why.empty(), InternalError, "the step's metric '{}' {}", name, why);
    DT_ENFORCE(!record.contains(name), InternalError,
               "the step's metric '{}' has the name of a metrics.jsonl field or of another metric of the step: "
               "give it another name",
               name);
    record[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
    names.push_back(name);
  }
  record["extra_metrics"] = std::move(names);
}

NamedMetrics metrics_record_get(const nlohmann::json& record) {
  NamedMetrics out;
  auto it = record.find("extra_metrics");
  if (it == record.end() || !it->is_array()) return out;
  for (const nlohmann::json& n : *it) {
    if (!n.is_string()) return {};
    const std::string& name = n.get_ref<const std::string&>();
    auto v = record.find(name);
    out.emplace_back(name,
                     v != record.end() && v->is_number() ? v->get<double>() : std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

}  // namespace dtrain::report
