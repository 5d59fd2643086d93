// LLaMA-Factory's dataset_info.json, alpaca and sharegpt records read into SFT records or
// preference pairs (data/llamafactory.h), with the line each record starts on for errors.
#include "data/llamafactory.h"

#include "core/check.h"
#include "core/input_file.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dtrain::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string trim_copy(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// ---------------------------------------------------------------------------
// Files: a JSON array of records (.json) or one record per line (.jsonl)

// Calls fn(text, line) for each element of the top-level JSON array in `text`; `line` is
// the 1-based line the element starts on. Strings (with escapes) are skipped whole, so
// brackets inside them do not count.
template <class F>
void json_array_elements(const std::string& text, const std::string& file, F&& fn) {
  size_t i = 0, line = 1;
  auto skip_ws = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n')) {
      if (text[i] == '\n') ++line;
      ++i;
    }
  };
  skip_ws();
  if (i + 3 <= text.size() && text.compare(i, 3, "\xEF\xBB\xBF") == 0) i += 3;  // a UTF-8 byte order mark
  skip_ws();
  DT_ENFORCE(i < text.size() && text[i] == '[', ConfigError,
             "{}:{}: a LLaMA-Factory .json dataset is a JSON array of records ([{{...}}, ...]); use .jsonl for one "
             "record per line",
             file, line);
  ++i;
  for (;;) {
    skip_ws();
    DT_ENFORCE(i < text.size(), ConfigError, "{}:{}: the JSON array is not closed (the file ends early)", file, line);
    if (text[i] == ']') return;
    const size_t start = i, start_line = line;
    int depth = 0;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '\n') ++line;
      if (c == '"') {
        for (++i; i < text.size() && text[i] != '"'; ++i) {
          if (text[i] == '\\') ++i;
          else if (text[i] == '\n') ++line;
        }
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') {
        if (depth == 0) break;  // the array's own ']' after a scalar element
        --depth;
        if (depth == 0) {
          ++i;
          break;
        }
      }
      if (c == ',' && depth == 0) break;
    }
    fn(std::string_view(text).substr(start, i - start), start_line);
    skip_ws();
    DT_ENFORCE(i < text.size(), ConfigError, "{}:{}: the JSON array is not closed (the file ends early)", file, line);
    if (text[i] == ',') {
      ++i;
      continue;
    }
    DT_ENFORCE(text[i] == ']', ConfigError, "{}:{}: expected ',' or ']' after the record that starts on line {}", file,
               line, start_line);
    return;
  }
}

// ---------------------------------------------------------------------------
// One dataset_info.json entry

using Entry = LlamaFactoryEntry;

Entry entry_parse(const json& info, const std::string& name, const fs::path& dir, const std::string& info_path) {
  if (!info.contains(name)) {
    std::string known;
    for (const auto& [k, v] : info.items()) known += (known.empty() ? "" : ", ") + k;
    DT_THROW(ConfigError, "{}: no dataset named '{}' (data.dataset); it has: {}", info_path, name, known);
  }
  const json& e = info[name];
  const std::string where = info_path + ": \"" + name + "\"";
  DT_ENFORCE(e.is_object(), ConfigError, "{}: must be an object", where);
  for (const char* remote : {"hf_hub_url", "ms_hub_url", "script_url", "cloud_file_name", "om_hub_url"})
    DT_ENFORCE(!e.contains(remote) || e[remote].is_null(), ConfigError,
               "{}: \"{}\": dtrain reads local files only (it downloads nothing); download the data and give "
               "\"file_name\"",
               where, remote);
  DT_ENFORCE(!e.contains("ranking") || e["ranking"].is_boolean(), ConfigError,
             "{}: \"ranking\" must be true (a preference dataset) or false", where);
  DT_ENFORCE(e.contains("file_name") && e["file_name"].is_string(), ConfigError,
             "{}: \"file_name\" (a string, the dataset's file in the dataset_dir) is required", where);
  Entry out;
  out.name = name;
  out.file = (dir / e["file_name"].get<std::string>()).string();
  std::error_code dir_ec;
  DT_ENFORCE(!fs::is_directory(out.file, dir_ec), ConfigError,
             "{}: file_name '{}' is a folder; dtrain reads one .json or .jsonl file per dataset: name the file", where,
             out.file);
  const std::string formatting = e.contains("formatting") && e["formatting"].is_string()
                                     ? e["formatting"].get<std::string>()
                                     : std::string("alpaca");
  DT_ENFORCE(formatting == "alpaca" || formatting == "sharegpt", ConfigError,
             "{}: \"formatting\" '{}' is not alpaca or sharegpt", where, formatting);
  out.sharegpt = formatting == "sharegpt";
  out.ranking = e.value("ranking", false);
  auto mapping = [&](const char* section, std::initializer_list<std::pair<const char*, std::string*>> keys,
                     std::initializer_list<const char*> refused) {
    if (!e.contains(section)) return;
    const json& m = e[section];
    DT_ENFORCE(m.is_object(), ConfigError, "{}: \"{}\" must be an object of names", where, section);
    for (const auto& [k, v] : m.items()) {
      for (const char* r : refused)
        DT_ENFORCE(k != r, ConfigError, "{}: \"{}\".\"{}\": {} data is not supported by dtrain", where, section, k, k);
      DT_ENFORCE(v.is_string(), ConfigError, "{}: \"{}\".\"{}\" must be a string", where, section, k);
      bool known = false;
      for (const auto& [name2, field] : keys)
        if (k == name2) {
          *field = v.get<std::string>();
          known = true;
        }
      DT_ENFORCE(known, ConfigError, "{}: \"{}\".\"{}\" is not a LLaMA-Factory {} key", where, section, k, section);
    }
  };
  mapping("columns",
          {{"prompt", &out.prompt},
           {"query", &out.query},
           {"response", &out.response},
           {"history", &out.history},
           {"messages", &out.messages},
           {"system", &out.system},
           {"tools", &out.tools},
           {"chosen", &out.chosen},
           {"rejected", &out.rejected}},
          {"images", "videos", "audios", "kto_tag"});
  mapping("tags",
          {{"role_tag", &out.role},
           {"content_tag", &out.content},
           {"user_tag", &out.user},
           {"assistant_tag", &out.assistant},
           {"observation_tag", &out.observation},
           {"function_tag", &out.function},
           {"system_tag", &out.system_tag}},
          {});
  return out;
}

// ---------------------------------------------------------------------------
// Records

// A string column: "" when absent or null and not required.
std::string column(const json& j, const std::string& key, bool required, const std::string& where, const char* role) {
  if (!j.contains(key) || j[key].is_null()) {
    DT_ENFORCE(!required, ConfigError, "{}: missing \"{}\" (the {} column, a string)", where, key, role);
    return {};
  }
  DT_ENFORCE(j[key].is_string(), ConfigError, "{}: \"{}\" (the {} column) must be a string, got {}", where, key, role,
             j[key].type_name());
  return j[key].get<std::string>();
}

void check_tools(const json& j, const Entry& e, const std::string& where) {
  if (e.tools.empty() || !j.contains(e.tools) || j[e.tools].is_null()) return;
  const json& t = j[e.tools];
  DT_ENFORCE((t.is_string() && trim_copy(t.get<std::string>()).empty()) || (t.is_array() && t.empty()), ConfigError,
             "{}: \"{}\": tool descriptions are not rendered by dtrain's templates; drop the tools column or the "
             "record",
             where, e.tools);
}

// The alpaca prompt: system, history turns, then prompt + "\n" + query as the user turn.
void alpaca_prompt(const json& j, const Entry& e, const std::string& where, std::vector<SftMessage>& out) {
  check_tools(j, e, where);
  const std::string system = e.system.empty() ? std::string() : column(j, e.system, false, where, "system");
  if (!system.empty()) out.push_back({SftRole::SYSTEM, system, ""});
  if (!e.history.empty() && j.contains(e.history) && !j[e.history].is_null()) {
    const json& h = j[e.history];
    DT_ENFORCE(h.is_array(), ConfigError, "{}: \"{}\" (the history column) must be a list of [prompt, response] pairs",
               where, e.history);
    for (size_t k = 0; k < h.size(); ++k) {
      const json& pair = h[k];
      DT_ENFORCE(pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string(), ConfigError,
                 "{}: \"{}\"[{}] must be a [prompt, response] pair of strings", where, e.history, k);
      out.push_back({SftRole::USER, pair[0].get<std::string>(), ""});
      out.push_back({SftRole::ASSISTANT, pair[1].get<std::string>(), ""});
    }
  }
  std::string prompt = column(j, e.prompt, true, where, "prompt");
  const std::string query = column(j, e.query, false, where, "query");
  if (!query.empty()) prompt += "\n" + query;  // LLaMA-Factory's "instruction\ninput"
  out.push_back({SftRole::USER, prompt, ""});
}

SftRecord alpaca_record(const json& j, const Entry& e, const std::string& where) {
  SftRecord rec;
  rec.source = where;
  alpaca_prompt(j, e, where, rec.messages);
  rec.messages.push_back({SftRole::ASSISTANT, column(j, e.response, true, where, "response"), ""});
  return rec;
}

// The sharegpt turns of the messages column (a first system message becomes the system
// turn); they alternate user/observation and assistant/function and end with an answer,
// or for a preference record (ranking) with a user turn.
void sharegpt_turns(const json& j, const Entry& e, const std::string& where, bool ranking,
                    std::vector<SftMessage>& out) {
  check_tools(j, e, where);
  DT_ENFORCE(j.contains(e.messages) && j[e.messages].is_array() && !j[e.messages].empty(), ConfigError,
             "{}: \"{}\" (the messages column) must be a non-empty list of {{\"{}\", \"{}\"}} objects", where,
             e.messages, e.role, e.content);
  const json& msgs = j[e.messages];
  std::string system = e.system.empty() ? std::string() : column(j, e.system, false, where, "system");
  size_t first = 0;
  auto field = [&](size_t k, const std::string& key) {
    const std::string w = fmt::format("{}: \"{}\"[{}].\"{}\"", where, e.messages, k, key);
    DT_ENFORCE(msgs[k].is_object(), ConfigError, "{}: \"{}\"[{}] must be an object {{\"{}\", \"{}\"}}", where,
               e.messages, k, e.role, e.content);
    DT_ENFORCE(msgs[k].contains(key) && msgs[k][key].is_string(), ConfigError, "{}: missing, or not a string", w);
    return msgs[k][key].get<std::string>();
  };
  if (field(0, e.role) == e.system_tag) {
    system = field(0, e.content);  // overrides the system column, as LLaMA-Factory does
    first = 1;
  }
  if (!system.empty()) out.push_back({SftRole::SYSTEM, system, ""});
  for (size_t k = first; k < msgs.size(); ++k) {
    const std::string role = field(k, e.role);
    const std::string content = field(k, e.content);
    const bool user_turn = (k - first) % 2 == 0;
    const bool is_user = role == e.user || role == e.observation;
    const bool is_answer = role == e.assistant || role == e.function;
    DT_ENFORCE(is_user || is_answer || role == e.system_tag, ConfigError,
               "{}: \"{}\"[{}].\"{}\" is '{}', not a role of this dataset ({}, {}, {}, {}, or {} first)", where,
               e.messages, k, e.role, role, e.user, e.assistant, e.observation, e.function, e.system_tag);
    DT_ENFORCE(role != e.system_tag, ConfigError,
               "{}: \"{}\"[{}]: a '{}' message must come first; sharegpt turns alternate {}/{} and {}/{} after an "
               "optional first {} message",
               where, e.messages, k, role, e.user, e.observation, e.assistant, e.function, e.system_tag);
    DT_ENFORCE(user_turn ? is_user : is_answer, ConfigError,
               "{}: \"{}\"[{}].\"{}\" is '{}' where a {} turn belongs: sharegpt turns alternate {}/{} and {}/{} "
               "after an optional first {} message",
               where, e.messages, k, e.role, role,
               user_turn ? e.user + "/" + e.observation : e.assistant + "/" + e.function, e.user, e.observation,
               e.assistant, e.function, e.system_tag);
    out.push_back({is_user ? SftRole::USER : SftRole::ASSISTANT, content, ""});
  }
  if (ranking) {
    DT_ENFORCE(msgs.size() > first && (msgs.size() - first) % 2 == 1, ConfigError,
               "{}: \"{}\" ends with a {} turn (or holds only the system message): a preference record's turns end "
               "with the question ({}/{}), answered by its \"{}\" and \"{}\" messages",
               where, e.messages, e.assistant, e.user, e.observation, e.chosen, e.rejected);
    return;
  }
  DT_ENFORCE(msgs.size() > first && (msgs.size() - first) % 2 == 0, ConfigError,
             "{}: \"{}\" ends with a {} turn (or holds only the system message): it must end with an answer ({}/{}) "
             "to train on",
             where, e.messages, e.user, e.assistant, e.function);
}

SftRecord sharegpt_record(const json& j, const Entry& e, const std::string& where) {
  SftRecord rec;
  rec.source = where;
  sharegpt_turns(j, e, where, false, rec.messages);
  return rec;
}

// A sharegpt preference answer: a message object whose role is an answer's.
std::string sharegpt_answer(const json& j, const Entry& e, const std::string& key, const char* which,
                            const std::string& where) {
  DT_ENFORCE(j.contains(key) && j[key].is_object(), ConfigError,
             "{}: \"{}\" (the {} column) must be a message object {{\"{}\": \"{}\", \"{}\": ...}}, got {}", where, key,
             which, e.role, e.assistant, e.content, j.contains(key) ? j[key].type_name() : "nothing");
  const json& m = j[key];
  DT_ENFORCE(m.contains(e.role) && m[e.role].is_string() && m.contains(e.content) && m[e.content].is_string(),
             ConfigError, "{}: \"{}\": needs \"{}\" and \"{}\" strings", where, key, e.role, e.content);
  const std::string role = m[e.role].get<std::string>();
  DT_ENFORCE(role == e.assistant || role == e.function, ConfigError,
             "{}: \"{}\".\"{}\" is '{}': the {} answer must be a {}/{} message", where, key, e.role, role, which,
             e.assistant, e.function);
  return m[e.content].get<std::string>();
}

// A plain pairwise file's record picks its shape by its keys (LlamaFactoryEntry::plain).
Entry plain_shape(const json& j, const Entry& plain) {
  Entry e;
  e.file = plain.file;
  e.plain = true;
  e.ranking = true;
  if (j.contains("conversations")) {
    e.sharegpt = true;
  } else if (j.contains("messages")) {
    e.sharegpt = true;
    e.messages = "messages";
    e.role = "role";
    e.content = "content";
    e.user = "user";
    e.assistant = "assistant";
    e.system_tag = "system";
  }
  e.system = "system";
  if (!e.sharegpt) e.history = "history";
  return e;
}

PairRecord pair_record(const json& j, const Entry& e, const std::string& where) {
  PairRecord rec;
  rec.source = where;
  if (e.sharegpt) {
    sharegpt_turns(j, e, where, true, rec.prompt);
    rec.chosen = sharegpt_answer(j, e, e.chosen, "chosen", where);
    rec.rejected = sharegpt_answer(j, e, e.rejected, "rejected", where);
    return rec;
  }
  alpaca_prompt(j, e, where, rec.prompt);
  rec.chosen = column(j, e.chosen, true, where, "chosen");
  rec.rejected = column(j, e.rejected, true, where, "rejected");
  return rec;
}

json record_json(std::string_view rec_text, const std::string& where) {
  json j;
  try {
    j = json::parse(rec_text);
  } catch (const json::parse_error& err) {
    DT_THROW(ConfigError, "{}: invalid JSON: {}", where, err.what());
  }
  DT_ENFORCE(j.is_object(), ConfigError, "{}: a record must be a JSON object, got {}", where, j.type_name());
  return j;
}

std::string record_where(const Entry& e, size_t line, size_t index) {
  if (e.plain) return fmt::format("{}:{}", e.file, line);
  return fmt::format("{}:{}: record {} of dataset '{}'", e.file, line, index, e.name);
}

SftRecord record_parse(const Entry& e, std::string_view rec_text, size_t line, size_t index) {
  const std::string where = record_where(e, line, index);
  DT_ENFORCE(!e.ranking, InternalError, "{}: a preference dataset's record read as SFT", where);
  const json j = record_json(rec_text, where);
  return e.sharegpt ? sharegpt_record(j, e, where) : alpaca_record(j, e, where);
}

PairRecord pair_parse(const Entry& e, std::string_view rec_text, size_t line, size_t index) {
  const std::string where = record_where(e, line, index);
  DT_ENFORCE(e.ranking, InternalError, "{}: an SFT dataset's record read as a preference pair", where);
  const json j = record_json(rec_text, where);
  return pair_record(j, e.plain ? plain_shape(j, e) : e, where);
}

bool is_jsonl(const Entry& e) {
  const std::string ext = fs::path(e.file).extension().string();
  if (ext == ".jsonl") return true;
  DT_ENFORCE(ext == ".json", ConfigError,
             "{}: dtrain reads LLaMA-Factory datasets from .json (an array of records) or .jsonl files, not '{}'",
             e.file, ext);
  return false;
}

template <class Rec, class Parse>
void load_entry(const Entry& e, std::vector<Rec>& out, Parse parse) {
  const std::string& file = e.file;
  const std::string text = input_file_read(e.file, "LLaMA-Factory dataset", kInputAnySize);
  size_t index = 0;
  auto one = [&](std::string_view rec_text, size_t line) { out.push_back(parse(e, rec_text, line, index++)); };
  if (is_jsonl(e)) {
    std::istringstream in(text);
    std::string line;
    size_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (trim_copy(line).empty()) continue;
      one(line, line_no);
    }
  } else {
    json_array_elements(text, file, one);
  }
  DT_ENFORCE(index > 0, ConfigError, "{}: dataset '{}' holds no records", file, e.name);
}

// The datasets' records, concatenated or mixed by weight (llamafactory_load).
template <class Rec, class Parse>
std::vector<Rec> load_mixed(const std::vector<LlamaFactoryEntry>& entries, const std::string& names,
                            const std::vector<double>& mix, Parse parse) {
  DT_ENFORCE(mix.empty() || mix.size() == entries.size(), ConfigError,
             "data.mix has {} weights for {} datasets ({}): give one weight per dataset, or none to concatenate them",
             mix.size(), entries.size(), names);
  std::vector<std::vector<Rec>> sets;
  size_t total = 0;
  for (const LlamaFactoryEntry& e : entries) {
    sets.emplace_back();
    load_entry(e, sets.back(), parse);
    total += sets.back().size();
  }
  std::vector<Rec> out;
  if (mix.empty()) {
    for (auto& s : sets) std::move(s.begin(), s.end(), std::back_inserter(out));
    return out;
  }
  double sum = 0;
  for (double w : mix) {
    DT_ENFORCE(std::isfinite(w) && w >= 0, ConfigError, "data.mix: weight {} is not a number >= 0", w);
    sum += w;
  }
  DT_ENFORCE(sum > 0, ConfigError, "data.mix: the weights add up to 0; give at least one positive weight");
  for (size_t i = 0; i < sets.size(); ++i) {
    const auto n = static_cast<size_t>(std::llround(static_cast<double>(total) * mix[i] / sum));
    for (size_t k = 0; k < n; ++k) out.push_back(sets[i][k % sets[i].size()]);
  }
  DT_ENFORCE(!out.empty(), ConfigError, "data.mix leaves no records to train on");
  return out;
}

}  // namespace

bool llamafactory_is_dataset_dir(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (p.filename() == "dataset_info.json") return true;
  return fs::is_directory(p, ec) && fs::exists(p / "dataset_info.json", ec);
}

std::vector<LlamaFactoryEntry> llamafactory_entries(const std::string& dataset_dir, const std::string& names) {
  const fs::path info_path = fs::path(dataset_dir).filename() == "dataset_info.json"
                                 ? fs::path(dataset_dir)
                                 : fs::path(dataset_dir) / "dataset_info.json";
  const fs::path dir = info_path.parent_path();
  json info;
  try {
    info = json::parse(input_file_read(info_path.string(), "dataset_info.json", kInputMetaMaxBytes));
  } catch (const json::parse_error& e) {
    DT_THROW(ConfigError, "{}: invalid JSON: {}", info_path.string(), e.what());
  }
  DT_ENFORCE(info.is_object(), ConfigError, "{}: must be a JSON object of dataset entries", info_path.string());
  std::vector<std::string> list;
  std::istringstream ss(names);
  for (std::string n; std::getline(ss, n, ',');)
    if (!trim_copy(n).empty()) list.push_back(trim_copy(n));
  DT_ENFORCE(!list.empty(), ConfigError, "data.dataset is empty: name the datasets of {} to train on (comma-separated)",
             info_path.string());
  std::vector<LlamaFactoryEntry> out;
  for (const std::string& n : list) {
    out.push_back(entry_parse(info, n, dir, info_path.string()));
    // The file's checks before any data is read (and before a long tokenizing pass).
    input_file_check(out.back().file, "LLaMA-Factory dataset");
    is_jsonl(out.back());
  }
  std::string pairs, sft;
  for (const LlamaFactoryEntry& e : out) {
    std::string& kind = e.ranking ? pairs : sft;
    kind += (kind.empty() ? "" : ", ") + e.name;
  }
  DT_ENFORCE(pairs.empty() || sft.empty(), ConfigError,
             "{}: data.dataset mixes preference datasets (\"ranking\": true: {}) with SFT datasets ({}); one run "
             "trains one kind: name only one kind",
             info_path.string(), pairs, sft);
  return out;
}

SftRecord llamafactory_record(const LlamaFactoryEntry& entry, std::string_view text, size_t line, size_t index) {
  return record_parse(entry, text, line, index);
}

PairRecord llamafactory_pair_record(const LlamaFactoryEntry& entry, std::string_view text, size_t line, size_t index) {
  return pair_parse(entry, text, line, index);
}

void llamafactory_json_elements(const std::string& text, const std::string& file,
                                const std::function<void(std::string_view, size_t)>& fn) {
  json_array_elements(text, file, fn);
}

std::vector<SftRecord> llamafactory_load(const std::string& dataset_dir, const std::string& names,
                                         const std::vector<double>& mix) {
  const std::vector<LlamaFactoryEntry> entries = llamafactory_entries(dataset_dir, names);
  DT_ENFORCE(!entries[0].ranking, ConfigError,
             "data.dataset {}: \"ranking\": true datasets hold preference pairs (chosen/rejected), which an SFT run "
             "does not train: set training.stage: dpo, or name SFT datasets",
             names);
  return load_mixed<SftRecord>(entries, names, mix, record_parse);
}

std::vector<PairRecord> llamafactory_load_pairs(const std::string& dataset_dir, const std::string& names,
                                                const std::vector<double>& mix) {
  const std::vector<LlamaFactoryEntry> entries = llamafactory_entries(dataset_dir, names);
  DT_ENFORCE(entries[0].ranking, ConfigError,
             "data.dataset {}: these are SFT datasets; preference training needs datasets with \"ranking\": true "
             "(chosen/rejected columns) in dataset_info.json",
             names);
  return load_mixed<PairRecord>(entries, names, mix, pair_parse);
}

bool llamafactory_ranking(const std::string& dataset_dir, const std::string& names) {
  return llamafactory_entries(dataset_dir, names)[0].ranking;
}

}  // namespace dtrain::data
