// Loading a config: JSON (comments stripped, syntax checked as JSON) or one YAML document,
// a walk of the document against the schema (key policy: known / accepted-but-ignored
// DeepSpeed keys / typos / unknown), env overrides, --set overrides, typed conversion of
// each value into TrainConfig, then relative input paths made absolute.
#include "config/load_detail.h"
#include "config/schema.h"

#include "core/check.h"
#include "core/env.h"
#include "core/input_file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace dtrain::config {

namespace {

// Precedence of a value's source: a higher rank replaces a lower one.
enum class Rank { FILE = 0, ENV = 1, SET = 2 };

struct Setting {
  YAML::Node value;
  std::string origin;
  Rank rank;
};

struct LoadState {
  std::string source;
  std::map<std::string, Setting, std::less<>> settings;
  std::vector<std::string> ignored;  // accepted DeepSpeed keys present (full paths)
  std::vector<std::string> warnings;
  Origins origins;
};

std::string mark_text(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return fmt::format("{}:{}:{}", source, m.line + 1, m.column + 1);
}

// Where a value sits; a null value (key with nothing after it) has no mark of its own.
std::string value_origin(const std::string& source, const YAML::Node& key, const YAML::Node& value) {
  YAML::Mark m = value.Mark();
  return mark_text(source, m.is_null() ? key.Mark() : m);
}

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Scalar: return fmt::format("'{}'", n.Scalar().substr(0, 80));
    default: return "an undefined value";
  }
}

bool is_auto(const YAML::Node& n) { return n.IsScalar() && n.Scalar() == "auto"; }
bool is_quoted(const YAML::Node& n) { return n.Tag() == "!"; }

std::string join_path(std::string_view section, std::string_view name) {
  return section.empty() ? std::string(name) : fmt::format("{}.{}", section, name);
}

// ---------------------------------------------------------------------------
// Reading the document

// "file:line:col" of byte offset `at` in text.
std::string offset_text(const std::string& source, std::string_view text, size_t at) {
  at = std::min(at, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return fmt::format("{}:{}:{}", source, line, col);
}

// JSON with // and /* */ comments (DeepSpeed's parser refuses them, but hand-written
// configs often have them): the comments outside strings become spaces, newlines kept,
// so every later line:column still points into the file as written.
// An unclosed /* comment sets *problem.
std::string json_strip_comments(std::string_view text, const std::string& source, std::string* problem) {
  std::string out(text);
  bool in_string = false;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"' || c == '\n') in_string = false;  // an unterminated string is the parser's to report
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '/' && i + 1 < out.size() && out[i + 1] == '/') {
      for (; i < out.size() && out[i] != '\n'; ++i) out[i] = ' ';
    } else if (c == '/' && i + 1 < out.size() && out[i + 1] == '*') {
      const size_t end = out.find("*/", i + 2);
      if (end == std::string::npos) {
        *problem = fmt::format("{}: JSON: a /* comment is not closed (no */ before the end of the file)",
                               offset_text(source, text, i));
        return out;
      }
      for (size_t j = i; j < end + 2; ++j)
        if (out[j] != '\n') out[j] = ' ';
      i = end + 1;
    }
  }
  return out;
}

// The JSON parser's complaint about text, with file:line:column, or "" when it is valid
// JSON: a .json config's mistakes are reported as JSON rather than as whatever YAML makes
// of them.
std::string json_syntax_problem(const std::string& text, const std::string& source) {
  try {
    [[maybe_unused]] const nlohmann::json parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string why = e.what();
    // "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error ..."
    if (size_t p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    if (size_t p = why.find(": "); why.rfind("parse error", 0) == 0 && p != std::string::npos) why = why.substr(p + 2);
    return fmt::format("{}: JSON syntax error: {}", offset_text(source, text, e.byte > 0 ? e.byte - 1 : 0), why);
  }
  return "";
}

// yaml-cpp's depth limit (DeepRecursion, whose message is "bad file") in words.
std::string nesting_too_deep(const YAML::DeepRecursion& e) {
  return fmt::format(
      "nesting too deep: brackets or indentation nest {} levels here, past the YAML parser's limit "
      "(a dtrain config nests 3 or 4 levels, as scheduler.params.warmup_type); look for "
      "unclosed [ or {{ or a generated file",
      e.depth());
}

// Line (1-based) of the `---` that starts the second YAML document, or 0 if not found.
size_t second_document_line(std::string_view text) {
  bool content = false;
  size_t line = 1;
  for (size_t at = 0; at < text.size(); ++line) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(at, end - at);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    const bool marker = l.rfind("---", 0) == 0 && (l.size() == 3 || l[3] == ' ' || l[3] == '\t');
    if (marker && content) return line;
    const size_t first = l.find_first_not_of(" \t");
    // A marker before any content opens the first document; directives (%YAML) precede it.
    if (!marker && first != std::string_view::npos && l[first] != '#' && l[first] != '%') content = true;
    if (marker && l.find_first_not_of(" \t", 3) != std::string_view::npos) content = true;  // "--- a: 1"
    at = end + 1;
  }
  return 0;
}

// Counts the documents a parser reports, remembering where the second one starts.
struct DocumentCounter final : YAML::EventHandler {
  size_t starts = 0;
  std::optional<YAML::Mark> second_start;
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++starts == 2) second_start = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The config's one document. Text whose first character (past blanks and comments) is '{'
// is JSON, as DeepSpeed writes it: its comments are blanked and a JSON parser checks it, so
// its mistakes are reported as JSON; then the YAML parser reads it like any config (JSON is
// YAML's flow style). Only outside a *.json file may such text be a YAML flow mapping that
// is not JSON ({stage: 2}).
YAML::Node document_load(std::string_view text, const std::string& name) {
  std::string body(text);
  std::string problem;
  std::string stripped = json_strip_comments(text, name, &problem);
  const size_t first = stripped.find_first_not_of(" \t\r\n");
  bool json = first != std::string::npos && stripped[first] == '{';
  if (json) {
    if (problem.empty()) problem = json_syntax_problem(stripped, name);
    std::string ext = std::filesystem::path(name).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bool yaml_instead = false;
    if (!problem.empty() && ext != ".json") {
      try {
        (void)YAML::Load(body);
        yaml_instead = true;
      } catch (const YAML::Exception&) {
      }
    }
    if (!problem.empty() && !yaml_instead) DT_THROW(ConfigError, "{}", problem);
    json = !yaml_instead;
    if (json) body = std::move(stripped);
  }
  YAML::Node root;
  try {
    root = YAML::Load(body);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp reports its depth limit as "bad file", and its mark may already stand past
    // the last line (it scans ahead): name the last line with text then.
    YAML::Mark at = e.mark;
    const int lines =
        static_cast<int>(std::count(body.begin(), body.end(), '\n')) + (!body.empty() && body.back() != '\n' ? 1 : 0);
    if (!at.is_null() && at.line >= lines && lines > 0) {
      at.line = lines - 1;
      at.column = 0;
    }
    DT_THROW(ConfigError, "{}: {}", mark_text(name, at), nesting_too_deep(e));
  } catch (const YAML::ParserException& e) {
    DT_THROW(ConfigError, "{}: {} syntax error: {}", mark_text(name, e.mark), json ? "JSON" : "YAML", e.msg);
  } catch (const YAML::Exception& e) {
    DT_THROW(ConfigError, "{}: cannot parse {}: {}", mark_text(name, e.mark), json ? "JSON" : "YAML", e.msg);
  }
  // YAML::Load reads the first document only. The rest is walked as events, at most two
  // documents (yaml-cpp 0.7's LoadAll can loop forever on some malformed text).
  size_t documents = 0;
  std::optional<YAML::Mark> second;
  try {
    std::istringstream in(body);
    YAML::Parser parser(in);
    DocumentCounter counter;
    while (documents < 2 && parser.HandleNextDocument(counter)) ++documents;
    second = counter.second_start;
  } catch (const YAML::Exception& e) {
    documents = 2;  // the first document loaded: the error is in a later one
    second = e.mark;
  }
  if (documents > 1) {
    size_t line = second_document_line(body);
    if (line == 0 && second && !second->is_null()) line = static_cast<size_t>(second->line) + 1;
    DT_THROW(ConfigError,
             "{}: a second YAML document starts here ('---'); a config is one document: remove the "
             "'---' line and merge the keys into one mapping, or put the other document in its own file",
             line > 0 ? fmt::format("{}:{}", name, line) : name);
  }
  return root;
}

// ---------------------------------------------------------------------------
// Walking the document against the schema

void walk(const YAML::Node& node, const std::string& section, LoadState& st);

// Why `name` under `section` is no key, and what to write instead: another tool's spelling
// (LLaMA-Factory, HF Trainer), a typo of a key of the section, a key of another section
// (top-level max_steps), or else the section's own keys. A key dtrain would not read must
// not train silently with the default (a LoRA rank that leaves the model fully tuned).
std::string unknown_key_text(const std::string& section, const std::string& name) {
  const std::string path = join_path(section, name);
  if (const char* ours = schema_foreign_spelling(path)) {
    if (ours[0] == '-') return fmt::format("{}: not a dtrain key; {}", path, ours + 1);
    return fmt::format("{}: unknown key; dtrain spells this {}", path, ours);
  }
  if (std::string hint = key_suggest(name, schema_children(section)); !hint.empty())
    return fmt::format("{}: unknown key; did you mean {}?", path, join_path(section, hint));
  // The same name (or a typo of it) as a key of another section.
  std::string elsewhere;
  size_t best = SIZE_MAX;
  for (const KeySpec& k : schema_keys()) {
    const std::string_view full(k.path);
    const size_t dot = full.rfind('.');
    const std::string_view leaf = dot == std::string_view::npos ? full : full.substr(dot + 1);
    // Short names only as they are (x is no typo of lora.r).
    if (name.size() < 5 ? name != leaf : key_suggest(name, {std::string(leaf)}).empty()) continue;
    const size_t d = key_distance(name, leaf);
    if (d < best) {
      best = d;
      elsewhere = std::string(full);
    }
  }
  if (!elsewhere.empty())
    return fmt::format("{}: unknown key; did you mean {}? (a key of another section)", path, elsewhere);
  return fmt::format("{}: unknown key; {} has {} (dtrain launch --help-config lists every key)", path,
                     section.empty() ? "the top level" : section, fmt::join(schema_children(section), ", "));
}

// communication.compression given as a mapping with one method and its parameters
// ({powersgd: {rank: 4}}, {topk: {ratio: 0.01}}), PyTorch's hook-plus-state spelling: it is
// compression: <method> plus the keys of the section communication.<method>.
void compression_method_walk(const YAML::Node& key, const YAML::Node& value, LoadState& st) {
  const std::string at = mark_text(st.source, value.Mark());
  if (value.size() != 1)
    DT_THROW(ConfigError,
             "{}: communication.compression: a mapping names one method with its parameters ({{powersgd: {{rank: "
             "4}}}} or {{topk: {{ratio: 0.01}}}}), got {} keys",
             at, value.size());
  const YAML::Node method = value.begin()->first;
  const YAML::Node params = value.begin()->second;
  const std::string name = method.IsScalar() ? method.Scalar() : std::string();
  if (name != "powersgd" && name != "topk")
    DT_THROW(ConfigError,
             "{}: communication.compression: unknown method '{}' in the mapping; one of powersgd, topk takes "
             "parameters (none, bf16 and fp16 are written as plain values)",
             mark_text(st.source, method.Mark()), name);
  st.settings["communication.compression"] = Setting{YAML::Node(name), value_origin(st.source, key, value), Rank::FILE};
  const std::string section = "communication." + name;
  st.origins.sections_seen.insert(section);
  if (!params.IsNull()) walk(params, section, st);
}

void walk(const YAML::Node& node, const std::string& section, LoadState& st) {
  if (!node.IsMap()) {
    if (section.empty())
      DT_THROW(ConfigError, "{}: the top level must be a mapping of config keys, got {}",
               mark_text(st.source, node.Mark()), node_kind(node));
    DT_THROW(ConfigError, "{}: {}: expected a mapping (a section with keys {}), got {}",
             mark_text(st.source, node.Mark()), section, fmt::join(schema_children(section), ", "), node_kind(node));
  }
  std::map<std::string, YAML::Mark> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies (handles to the same nodes): it-> yields a temporary pair, not a reference.
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar())
      DT_THROW(ConfigError, "{}: {}: keys must be plain names, got {}", mark_text(st.source, key.Mark()),
               section.empty() ? "(top level)" : section, node_kind(key));
    const std::string& name = key.Scalar();
    // DeepSpeed reads "bfloat16" as its older name of the bf16 section.
    const std::string path = section.empty() && name == "bfloat16" ? std::string("bf16") : join_path(section, name);
    // yaml-cpp reads YAML 1.1's merge key as a plain key named "<<": its keys would be
    // silently lost, so it is refused rather than half-supported.
    if (name == "<<" && !is_quoted(key))
      DT_THROW(ConfigError,
               "{}: {}: YAML merge keys ('<<: *anchor') are not supported; write the merged keys out "
               "in this mapping",
               mark_text(st.source, key.Mark()), section.empty() ? "(top level)" : section);
    auto [prev, fresh] = seen.emplace(path, key.Mark());
    if (!fresh)
      DT_THROW(ConfigError, "{}: {}: duplicate key (first given at line {}); keep one of them",
               mark_text(st.source, key.Mark()), path, prev->second.line + 1);

    if (path == "communication.compression" && value.IsMap()) {
      compression_method_walk(key, value, st);
    } else if (schema_find(path)) {
      st.settings[path] = Setting{value, value_origin(st.source, key, value), Rank::FILE};
    } else if (schema_is_section(path)) {
      st.origins.sections_seen.insert(path);
      if (!value.IsNull()) walk(value, path, st);
    } else if (schema_is_ignored(path)) {
      st.ignored.push_back(path);
    } else {
      DT_THROW(ConfigError, "{}: {}", mark_text(st.source, key.Mark()), unknown_key_text(section, name));
    }
  }
}

// ---------------------------------------------------------------------------
// Typed conversion of one value

std::optional<bool> parse_bool(const std::string& s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "true" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

std::optional<double> parse_double(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// An integer as written: "12", "+12", or an integral float (DeepSpeed's 5e8). OUT_OF_RANGE
// means an integer that int64 cannot hold (or a float integer beyond 2^53, where doubles stop
// being exact); the caller reports it with the key's range instead of wrapping it.
struct IntText {
  enum { OK, NOT_INTEGER, OUT_OF_RANGE } status;
  int64_t value;
};

IntText parse_int(std::string_view s) {
  std::string_view t = s;
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (!t.empty() && p == t.data() + t.size()) {
    if (ec == std::errc()) return {IntText::OK, v};
    if (ec == std::errc::result_out_of_range) return {IntText::OUT_OF_RANGE, 0};
  }
  std::optional<double> d = parse_double(s);
  if (!d || std::trunc(*d) != *d) {
    // Out-of-range floats ("1e400") do not parse as finite doubles; they are still integers.
    bool huge = !d && t.find_first_not_of("0123456789.eE+-") == std::string_view::npos &&
                std::isinf(std::strtod(std::string(t).c_str(), nullptr));
    return {huge ? IntText::OUT_OF_RANGE : IntText::NOT_INTEGER, 0};
  }
  if (std::fabs(*d) > 9007199254740992.0) return {IntText::OUT_OF_RANGE, 0};
  return {IntText::OK, static_cast<int64_t>(*d)};
}

// Values of another trainer (LLaMA-Factory) that dtrain knows and does not build: refused
// by name rather than answered with the nearest spelling (ppo is not a typo of dpo).
const char* enum_not_built(std::string_view path, std::string_view value) {
  static const struct {
    const char *path, *value, *what;
  } kNotBuilt[] = {
      {"training.stage", "pt", "LLaMA-Factory's pre-training stage (dtrain pre-trains with stage sft on text data)"},
      {"training.stage", "rm", "LLaMA-Factory's reward-model stage"},
      {"training.stage", "ppo", "LLaMA-Factory's PPO stage (RLHF against a reward model)"},
      {"training.stage", "kto", "LLaMA-Factory's KTO stage"},
      {"training.pref_loss", "hinge", "the hinge preference loss"},
      {"training.pref_loss", "ipo", "the IPO preference loss"},
      {"training.pref_loss", "kto_pair", "the paired KTO loss"},
  };
  for (const auto& e : kNotBuilt)
    if (path == e.path && value == e.value) return e.what;
  return nullptr;
}

struct Converter {
  const KeySpec& spec;
  const std::string& origin;

  [[noreturn]] void fail(const YAML::Node& n) const {
    std::string got = node_kind(n);
    if (n.IsScalar() && is_quoted(n) && spec.type != KeyType::STRING && spec.type != KeyType::ENUM)
      got = fmt::format("the quoted string \"{}\" (write it without quotes)", n.Scalar().substr(0, 80));
    std::string hint;
    if (spec.type == KeyType::ENUM && n.IsScalar()) {
      if (const char* why = enum_not_built(spec.path, n.Scalar()))
        DT_THROW(ConfigError, "{}: {}: '{}' is {}, which dtrain does not train; it trains {}", origin, spec.path,
                 n.Scalar(), why, fmt::join(spec.allowed, ", "));
      std::string s = key_suggest(n.Scalar(), spec.allowed);
      if (!s.empty()) hint = fmt::format("; did you mean {}?", s);
    }
    if (spec.type == KeyType::INT) {
      // Every integer error names the range the value must lie in, including the storage
      // width's limit ("expected an integer >= 1" alone hides that 2^31 does not fit).
      IntRange r = key_int_range(spec);
      bool width_limited = spec.width == IntWidth::I32 && r.hi == std::numeric_limits<int32_t>::max();
      hint = fmt::format("; valid range: {} to {}{}", r.lo, r.hi, width_limited ? " (stored as a 32-bit integer)" : "");
    }
    DT_THROW(ConfigError, "{}: {}: expected {}, got {}{}", origin, spec.path, key_type_name(spec), got, hint);
  }

  double real(const YAML::Node& n) const {
    if (!n.IsScalar() || is_quoted(n)) fail(n);
    std::optional<double> d = parse_double(n.Scalar());
    if (!d) fail(n);
    double v = *d;
    bool max_exclusive = spec.type == KeyType::FLOAT_PAIR;
    if (spec.min && (v < *spec.min || (spec.min_exclusive && v == *spec.min))) fail(n);
    if (spec.max && (v > *spec.max || (max_exclusive && v == *spec.max))) fail(n);
    return v;
  }

  // The one place every integer key's value (file, env, --set) becomes a number: checked
  // against the key's bounds and its storage width (key_int_range) before it is stored.
  int64_t integer(const YAML::Node& n) const {
    if (!n.IsScalar() || is_quoted(n)) fail(n);
    IntText i = parse_int(n.Scalar());
    IntRange r = key_int_range(spec);
    if (i.status != IntText::OK || i.value < r.lo || i.value > r.hi) fail(n);
    return i.value;
  }
  bool boolean(const YAML::Node& n) const {
    if (!n.IsScalar() || is_quoted(n)) fail(n);
    std::optional<bool> b = parse_bool(n.Scalar());
    if (!b) fail(n);
    return *b;
  }
  std::string string(const YAML::Node& n) const {
    if (!n.IsScalar()) fail(n);
    if (spec.type == KeyType::ENUM &&
        std::find(spec.allowed.begin(), spec.allowed.end(), n.Scalar()) == spec.allowed.end())
      fail(n);
    return n.Scalar();
  }
  std::vector<std::string> string_list(const YAML::Node& n) const {
    if (!n.IsSequence()) fail(n);
    std::vector<std::string> out;
    for (const YAML::Node& e : n) {
      if (!e.IsScalar())
        DT_THROW(ConfigError, "{}: {}: expected {}, got a list containing {}", origin, spec.path, key_type_name(spec),
                 node_kind(e));
      out.push_back(e.Scalar());
    }
    return out;
  }
  std::array<double, 2> pair(const YAML::Node& n) const {
    if (!n.IsSequence() || n.size() != 2) fail(n);
    return {real(n[0]), real(n[1])};
  }
  std::map<std::string, std::string> string_map(const YAML::Node& n) const {
    if (!n.IsMap()) fail(n);
    std::map<std::string, std::string> out;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node k = it->first;  // a copy: operator-> returns a temporary proxy
      const YAML::Node v = it->second;
      bool name_ok = k.IsScalar() && !k.Scalar().empty() && !std::isdigit(static_cast<unsigned char>(k.Scalar()[0]));
      if (name_ok)
        for (char c : k.Scalar()) name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
      if (!name_ok)
        DT_THROW(ConfigError, "{}: {}: {} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", origin,
                 spec.path, node_kind(k));
      if (!v.IsScalar())
        DT_THROW(ConfigError, "{}: {}.{}: expected a string value, got {}", origin, spec.path, k.Scalar(),
                 node_kind(v));
      if (!out.emplace(k.Scalar(), v.Scalar()).second)
        DT_THROW(ConfigError, "{}: {}.{}: duplicate key", origin, spec.path, k.Scalar());
    }
    return out;
  }
};

// Stores n into spec's field of cfg; returns false when n means "not given" (null, "auto").
bool apply_value(TrainConfig& cfg, const KeySpec& spec, const YAML::Node& n, const std::string& origin) {
  if (n.IsNull()) return false;
  bool textual = spec.type == KeyType::STRING || spec.type == KeyType::ENUM;
  // HF Trainer configs write "auto" for values the Trainer fills in; dtrain has no Trainer
  // arguments, so "auto" means "not given": the default or derived value applies.
  if (is_auto(n) && !(textual && std::find(spec.allowed.begin(), spec.allowed.end(), "auto") != spec.allowed.end()) &&
      spec.type != KeyType::STRING)
    return false;
  Converter c{spec, origin};
  FieldRef ref = spec.field(cfg);
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) *p = c.boolean(n);
        else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::optional<int64_t>>) *p = c.integer(n);
        else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>) *p = c.real(n);
        else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::optional<std::string>>)
          *p = c.string(n);
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) *p = c.string_list(n);
        else if constexpr (std::is_same_v<T, std::array<double, 2>>) *p = c.pair(n);
        else *p = c.string_map(n);
      },
      ref);
  return true;
}

// ---------------------------------------------------------------------------
// Overrides: env and --set

// training.max_steps and training.epochs exclude each other: an override of one drops the
// other when that came from a lower-precedence source (the file).
void drop_exclusive(LoadState& st, const std::string& path, Rank rank) {
  static const std::pair<const char*, const char*> kPairs[] = {{"training.max_steps", "training.epochs"}};
  for (auto [a, b] : kPairs) {
    const char* other = path == a ? b : path == b ? a : nullptr;
    if (!other) continue;
    auto it = st.settings.find(other);
    if (it != st.settings.end() && it->second.rank < rank) st.settings.erase(it);
  }
}

// A value from the command line or env: YAML for typed keys; taken verbatim for strings
// (paths with '#' or ': ' stay paths), where "", "null" and "~" mean "not given".
YAML::Node override_value(const KeySpec& spec, const std::string& text, const std::string& origin) {
  if (spec.type == KeyType::STRING || spec.type == KeyType::ENUM) {
    if (text.empty() || text == "null" || text == "~") return YAML::Node(YAML::NodeType::Null);
    // YAML's empty string, as a file would write it (monitor.nvml_library: "" = this program).
    if (text == "\"\"" || text == "''") return YAML::Node(std::string());
    return YAML::Node(text);
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    DT_THROW(ConfigError, "{}: {}: the value {}", origin, spec.path, nesting_too_deep(e));
  } catch (const YAML::Exception& e) {
    DT_THROW(ConfigError, "{}: {}: the value is not valid YAML ({}); expected {}", origin, spec.path, e.msg,
             key_type_name(spec));
  }
}

// The knobs without a YAML key (schema_env_knobs) are checked as a key's env value would be
// and not stored: the code that acts on each reads the variable itself, some of it before any
// config exists, so a bad value is refused here, by whichever process loads a config first.
void check_env_knobs() {
  for (const KeySpec& spec : schema_env_knobs()) {
    const char* v = env_get(spec.env);
    if (!v || !*v) continue;
    const std::string origin = fmt::format("env {}={}", spec.env, v);
    const YAML::Node n = override_value(spec, v, origin);
    if (n.IsNull()) continue;
    const Converter c{spec, origin};
    if (spec.type == KeyType::INT) c.integer(n);
    else if (spec.type == KeyType::ENUM) c.string(n);
  }
}

void apply_env(LoadState& st) {
  for (const KeySpec& spec : schema_keys()) {
    if (!spec.env) continue;
    const char* v = env_get(spec.env);
    if (!v || !*v) continue;
    std::string origin = fmt::format("env {}={}", spec.env, v);
    // Environment switches are commonly 0/1 (DTRAIN_PREFLIGHT=0, as NCCL's knobs); in
    // YAML those are integers, so a boolean knob reads them here.
    std::string text = v;
    if (spec.type == KeyType::BOOL && (text == "0" || text == "1")) text = text == "1" ? "true" : "false";
    YAML::Node n = override_value(spec, text, origin);
    drop_exclusive(st, spec.path, Rank::ENV);
    st.settings[spec.path] = Setting{n, origin, Rank::ENV};
  }
  check_env_knobs();
}

const KeySpec* map_key_for(std::string_view path, std::string* entry) {
  for (const KeySpec& spec : schema_keys()) {
    std::string_view p(spec.path);
    if (spec.type == KeyType::STRING_MAP && path.size() > p.size() + 1 && path.substr(0, p.size()) == p &&
        path[p.size()] == '.') {
      *entry = std::string(path.substr(p.size() + 1));
      return &spec;
    }
  }
  return nullptr;
}

bool under_ignored(std::string_view path) {
  for (size_t pos = path.size(); pos != std::string_view::npos && pos > 0; pos = path.rfind('.', pos - 1)) {
    if (schema_is_ignored(path.substr(0, pos))) return true;
    if (pos == 0) break;
  }
  return false;
}

void apply_set(LoadState& st, const std::string& arg) {
  std::string origin = fmt::format("--set {}", arg);
  size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    DT_THROW(ConfigError, "{}: expected key.path=value (e.g. --set zero_optimization.stage=2)", origin);
  std::string path = arg.substr(0, eq);
  std::string text = arg.substr(eq + 1);
  while (!path.empty() && std::isspace(static_cast<unsigned char>(path.back()))) path.pop_back();

  if (const KeySpec* spec = schema_find(path)) {
    YAML::Node n = override_value(*spec, text, origin);
    drop_exclusive(st, path, Rank::SET);
    st.settings[path] = Setting{n, origin, Rank::SET};
    st.origins.given_by_user.insert(path);
    return;
  }
  std::string entry;
  if (const KeySpec* spec = map_key_for(path, &entry)) {
    // One entry of a mapping (cluster.env.set.NAME=value) on top of the mapping so far.
    YAML::Node merged(YAML::NodeType::Map);
    auto it = st.settings.find(spec->path);
    if (it != st.settings.end() && it->second.value.IsMap())
      for (auto e = it->second.value.begin(); e != it->second.value.end(); ++e) merged[e->first] = e->second;
    merged[entry] = YAML::Node(text);
    st.settings[spec->path] = Setting{merged, origin, Rank::SET};
    return;
  }
  if (schema_is_section(path))
    DT_THROW(ConfigError, "{}: {} is a section; set one of its keys: {}", origin, path,
             fmt::join(schema_children(path), ", "));
  if (under_ignored(path)) {
    st.ignored.push_back(path);
    return;
  }
  if (const char* ours = schema_foreign_spelling(path)) {
    if (ours[0] == '-') DT_THROW(ConfigError, "{}: {}: not a dtrain key; {}", origin, path, ours + 1);
    DT_THROW(ConfigError, "{}: {}: unknown key; dtrain spells this {}", origin, path, ours);
  }
  std::vector<std::string> all;
  for (const KeySpec& k : schema_keys()) all.emplace_back(k.path);
  std::string hint = key_suggest(path, all);
  if (hint.empty()) {
    size_t dot = path.rfind('.');
    std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
    if (schema_is_section(section)) {
      std::string h = key_suggest(path.substr(dot == std::string::npos ? 0 : dot + 1), schema_children(section));
      if (!h.empty()) hint = join_path(section, h);
    }
  }
  if (!hint.empty()) DT_THROW(ConfigError, "{}: {}: unknown key; did you mean {}?", origin, path, hint);
  DT_THROW(ConfigError, "{}: {}: unknown key (dtrain launch --help-config lists every key)", origin, path);
}

// ---------------------------------------------------------------------------
// Relative input paths

// Keys naming input files or directories read on the launcher's machine. training.output_dir
// (an output, like --output-dir and its runs/<name> default) keeps the working-directory
// meaning, and cluster.workdir / cluster.dtrain_path are paths on the nodes.
constexpr const char* kInputPathKeys[] = {"data.train",
                                          "data.valid",
                                          "data.tokenizer",
                                          "model.init_from",
                                          "cluster.ssh.identity_file",
                                          "cluster.ssh.known_hosts",
                                          "cluster.rendezvous.token_file"};

// Relative input paths become absolute: a file's values against the file's directory
// (base_dir; "" leaves them as written), --set and env values against the working
// directory, so a job reads the same files wherever it is started from, and the config
// saved in the run directory (absolute paths) means the same to every rank.
void resolve_paths(TrainConfig& cfg, const LoadState& st, const std::string& base_dir) {
  for (const char* key : kInputPathKeys) {
    auto it = st.settings.find(key);
    if (it == st.settings.end()) continue;
    FieldRef ref = schema_find(key)->field(cfg);
    std::string** field = std::get_if<std::string*>(&ref);
    DT_CHECK(field != nullptr);
    std::string& value = **field;
    if (value.empty() || value.front() == '~' || (std::string_view(key) == "data.tokenizer" && value == "byte"))
      continue;
    const std::filesystem::path p(value);
    if (p.is_absolute()) continue;
    if (it->second.rank == Rank::FILE) {
      if (!base_dir.empty()) value = (std::filesystem::path(base_dir) / p).string();
    } else {
      value = (std::filesystem::current_path() / p).string();
    }
  }
}

// ---------------------------------------------------------------------------
// The whole load

LoadedConfig load(std::string_view text, const std::string& name, const std::vector<std::string>& sets,
                  const std::string& base_dir) {
  LoadState st;
  st.source = name;
  st.origins.source = name;

  YAML::Node root = document_load(text, name);
  if (root.IsNull() && sets.empty())
    DT_THROW(ConfigError, "{}: the config is empty; write a mapping of config keys (see configs/tiny-sft.yaml)", name);

  LoadedConfig out;
  try {
    if (!root.IsNull()) walk(root, "", st);
    for (const auto& [path, s] : st.settings) st.origins.given_by_user.insert(path);
    apply_env(st);
    for (const std::string& s : sets) {
      apply_set(st, s);
      std::string p = s.substr(0, s.find('='));
      if (size_t dot = p.find('.'); dot != std::string::npos) st.origins.sections_seen.insert(p.substr(0, dot));
    }
    // given_by_user may name keys an override dropped (max_steps vs epochs).
    std::erase_if(st.origins.given_by_user, [&](const std::string& p) { return !st.settings.count(p); });

    TrainConfig& cfg = out.cfg;
    cfg.source = name;
    for (const auto& [path, s] : st.settings) {
      const KeySpec* spec = schema_find(path);
      DT_CHECK(spec != nullptr);
      st.origins.where[path] = s.origin;
      if (apply_value(cfg, *spec, s.value, s.origin)) st.origins.given.insert(path);
      else st.origins.given_by_user.erase(path);
    }
    resolve_paths(cfg, st, base_dir);
  } catch (const YAML::Exception& e) {
    // Conversions above never ask yaml-cpp to convert; this guards its iterators all the same.
    DT_THROW(ConfigError, "{}: {}", mark_text(name, e.mark), e.msg);
  }

  if (!st.ignored.empty())
    st.warnings.push_back(
        fmt::format("{}: accepted but not acted on by dtrain (DeepSpeed features it does not have): {}", name,
                    fmt::join(st.ignored, ", ")));
  config_derive_validate(out.cfg, st.origins, st.warnings, &out.notes);
  out.warnings = std::move(st.warnings);
  return out;
}

}  // namespace

bool config_apply_text(TrainConfig& cfg, const KeySpec& spec, const std::string& text, const std::string& origin) {
  return apply_value(cfg, spec, override_value(spec, text, origin), origin);
}

LoadedConfig config_load_string(std::string_view text, const std::string& name, const std::vector<std::string>& sets,
                                const std::string& base_dir) {
  return load(text, name, sets, base_dir);
}

LoadedConfig config_load_file(const std::string& path, const std::vector<std::string>& sets) {
  // A device or pipe (/dev/zero, /dev/stdin) has no end or no size: reading it whole would
  // exhaust memory (std::bad_alloc) or hang, so only regular files of at most 16 MiB are
  // configs (the input rule: checked on the descriptor, read with the bound).
  const std::string text = input_file_read(path, "config file", kConfigMaxBytes);
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(path, ec).parent_path();
  return load(text, path, sets, ec ? std::string() : dir.string());
}

LoadedConfig config_load_or_default(const std::string& path, const std::vector<std::string>& sets) {
  if (!path.empty()) return config_load_file(path, sets);
  return config_load_string(kDefaultConfigYaml, "<embedded default: configs/tiny-sft.yaml>", sets, kDefaultConfigDir);
}

}  // namespace dtrain::config
