// Writing a config back out: config_to_yaml (every key, derived values explicit, loadable
// again to an equal config) and config_help (the schema and the env table as text for
// --help-config).
#include "config/load_detail.h"
#include "config/schema.h"
#include "core/c_escape.h"
#include "core/env.h"

#include <fmt/format.h>

#include <sstream>

namespace dtrain::config {

namespace {

// Double-quoted YAML scalar: always a string on reload, whatever the text looks like.
std::string quote(const std::string& s) { return "\"" + c_escape(s, {.quotes = true}) + "\""; }

// Shortest text that parses back to the same double; always readable as a YAML number.
std::string number(double v) { return fmt::format("{}", v); }

std::vector<std::string> split(std::string_view path) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string_view::npos; start = dot + 1)
    out.emplace_back(path.substr(start, dot - start));
  out.emplace_back(path.substr(start));
  return out;
}

// The value as YAML flow text, or nullopt when the key is omitted (not given).
std::optional<std::string> value_text(const FieldRef& ref) {
  return std::visit(
      [](auto* p) -> std::optional<std::string> {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>) return fmt::format("{}", *p);
        else if constexpr (std::is_same_v<T, double>) return number(*p);
        else if constexpr (std::is_same_v<T, std::string>) return quote(*p);
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::vector<std::string> q;
          for (const std::string& s : *p) q.push_back(quote(s));
          return fmt::format("[{}]", fmt::join(q, ", "));
        } else if constexpr (std::is_same_v<T, std::array<double, 2>>)
          return fmt::format("[{}, {}]", number((*p)[0]), number((*p)[1]));
        else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
          std::vector<std::string> q;
          for (const auto& [k, v] : *p) q.push_back(quote(k) + ": " + quote(v));
          return fmt::format("{{{}}}", fmt::join(q, ", "));
        } else {
          if (!p->has_value()) return std::nullopt;
          using V = typename T::value_type;
          if constexpr (std::is_same_v<V, bool>) return **p ? "true" : "false";
          else if constexpr (std::is_same_v<V, int64_t>) return fmt::format("{}", **p);
          else if constexpr (std::is_same_v<V, double>) return number(**p);
          else return quote(**p);
        }
      },
      ref);
}

}  // namespace

// ---------------------------------------------------------------------------

std::vector<std::pair<std::string, std::string>> config_key_values(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;  // FieldRef needs a mutable object
  std::vector<std::pair<std::string, std::string>> out;
  for (const KeySpec& spec : schema_keys())
    if (std::optional<std::string> text = value_text(spec.field(cfg))) out.emplace_back(spec.path, *text);
  return out;
}

std::string config_to_yaml(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;  // FieldRef needs a mutable object
  std::ostringstream out;
  out << "# dtrain config (complete: every key, derived values explicit)\n";
  if (!cfg.source.empty()) out << "# from: " << cfg.source << "\n";
  std::vector<std::string> open;  // sections printed so far, outermost first
  for (const KeySpec& spec : schema_keys()) {
    std::vector<std::string> parts = split(spec.path);
    std::string leaf = parts.back();
    parts.pop_back();
    if (parts.size() == 2 && parts[0] == "scheduler" && parts[1] == "params" &&
        !scheduler_param_applies(cfg.scheduler.type, leaf))
      continue;  // another schedule's parameter would not load back
    std::optional<std::string> text = value_text(spec.field(cfg));
    if (!text) continue;
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i < parts.size(); ++i) {
      if (i == 0) out << "\n";
      out << std::string(2 * i, ' ') << parts[i] << ":\n";
      open.push_back(parts[i]);
    }
    out << std::string(2 * parts.size(), ' ') << leaf << ": " << *text << "\n";
  }
  return out.str();
}

std::string config_help() {
  std::ostringstream out;
  out << "dtrain config keys (YAML, or DeepSpeed JSON). Precedence: default < file < env < --set.\n"
         "Non-string keys may be \"auto\" (as in HF Trainer DeepSpeed configs): not given, so the\n"
         "default or derived value applies. Integers may be written as integral floats (5e8).\n\n";
  for (const KeySpec& spec : schema_keys()) {
    out << spec.path << "\n";
    out << "    type: " << key_type_name(spec) << "\n";
    out << "    default: " << key_default_text(spec) << "\n";
    if (spec.env) out << "    env: " << spec.env << "\n";
    out << "    " << spec.help << "\n";
  }
  out << "\nEnvironment knobs without a YAML key (read where they act; a config load refuses a bad value):\n";
  for (const KeySpec& spec : schema_env_knobs()) {
    out << spec.env << "\n";
    out << "    type: " << key_type_name(spec) << "\n";
    out << "    default: " << key_default_text(spec) << "\n";
    out << "    " << spec.help << "\n";
  }
  out << "\nEvery environment variable dtrain reads (the env table, lib/core/env.cpp):\n";
  for (const EnvVar& v : env_table()) {
    out << v.name << "\n";
    out << "    kind: " << env_kind_name(v.kind);
    if (v.kind == EnvKind::KEY) out << " (" << v.meaning << ")";
    out << "\n    read by: " << v.reader << "\n";
    // A key's and a knob's meaning is their entry above.
    if (v.kind != EnvKind::KEY && v.kind != EnvKind::KNOB) out << "    " << v.meaning << "\n";
  }
  out << "\nDeepSpeed keys accepted but not acted on (one warning lists those present):\n";
  for (const std::string& k : schema_ignored_keys()) out << "    " << k << "\n";
  out << "\nAny other key is an error naming the key to write instead: the dtrain spelling of a\n"
         "LLaMA-Factory / HF Trainer name (learning_rate is optimizer.params.lr), a key within typo\n"
         "distance, a key of another section, or else the keys of its section.\n";
  return out.str();
}

}  // namespace dtrain::config
