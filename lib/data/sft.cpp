// SFT JSONL parsing (Alpaca and chat forms) and the answer checker used by evaluation.
#include "data/sft.h"

#include "core/check.h"
#include "core/input_file.h"
#include "data/jsonl_lines.h"

#include <nlohmann/json.hpp>

#include <fstream>

namespace dtrain::data {

using nlohmann::json;

// ---------------------------------------------------------------------------
// Parsing

namespace {

std::string string_field(const json& j, const char* key, bool required, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) DT_THROW(ConfigError, "{}: missing \"{}\" (a string)", where, key);
    return {};
  }
  if (!j[key].is_string()) DT_THROW(ConfigError, "{}: \"{}\" must be a string, got {}", where, key, j[key].type_name());
  return j[key].get<std::string>();
}

SftRole role_parse(const std::string& role, const std::string& where) {
  if (role == "system") return SftRole::SYSTEM;
  if (role == "user") return SftRole::USER;
  if (role == "assistant") return SftRole::ASSISTANT;
  DT_THROW(ConfigError, "{}: unknown role '{}' (use system, user or assistant)", where, role);
}

}  // namespace

SftRecord sft_parse_line(std::string_view line, SftFormat format, const std::string& file, size_t line_no) {
  const std::string where = file + ":" + std::to_string(line_no);
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    DT_THROW(ConfigError, "{}: invalid JSON at column {}: {}", where, e.byte, e.what());
  }
  if (!j.is_object()) DT_THROW(ConfigError, "{}: each line must be a JSON object, got {}", where, j.type_name());
  DT_ENFORCE(!(j.contains("chosen") && j.contains("rejected")), ConfigError,
             "{}: a preference record (chosen/rejected), not an SFT one: it is read as data.format pairwise (`dtrain "
             "data prepare --format pairwise`), which training.stage dpo trains",
             where);
  bool chat = format == SftFormat::CHAT || (format == SftFormat::AUTO && j.contains("messages"));
  SftRecord rec;
  rec.source = where;
  if (!chat) {
    SftMessage user{SftRole::USER, string_field(j, "instruction", true, where), string_field(j, "input", false, where)};
    SftMessage asst{SftRole::ASSISTANT, string_field(j, "output", true, where), {}};
    rec.messages = {std::move(user), std::move(asst)};
    return rec;
  }
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    DT_THROW(ConfigError, "{}: chat records need a non-empty \"messages\" array", where);
  bool has_answer = false;
  size_t k = 0;
  for (const json& m : j["messages"]) {
    const std::string mw = where + " messages[" + std::to_string(k++) + "]";
    if (!m.is_object()) DT_THROW(ConfigError, "{}: must be an object {{role, content}}", mw);
    SftMessage msg;
    msg.role = role_parse(string_field(m, "role", true, mw), mw);
    msg.content = string_field(m, "content", true, mw);
    has_answer = has_answer || msg.role == SftRole::ASSISTANT;
    rec.messages.push_back(std::move(msg));
  }
  if (!has_answer) DT_THROW(ConfigError, "{}: no assistant message, so nothing to train on", where);
  return rec;
}

std::vector<SftRecord> sft_load_jsonl(const std::string& path, SftFormat format) {
  // Read whole through the input rule (every record is held anyway), then split in lines.
  const std::string text = input_file_read(path, "SFT data", kInputAnySize);
  std::vector<SftRecord> records;
  jsonl_lines(text, [&](std::string_view line, size_t line_no) {
    records.push_back(sft_parse_line(line, format, path, line_no));
  });
  return records;
}

// ---------------------------------------------------------------------------
// Answer checking

namespace {

std::string normalize_ws(std::string_view s) {
  std::string out;
  bool pending_space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

bool sft_answer_matches(const std::string& expected, const std::string& generated) {
  static constexpr std::string_view STOPS[] = {"<|eos|>",    "<|endoftext|>", "<|im_end|>", "<|end_of_text|>",
                                               "<|eot_id|>", "</s>",          "\n###"};
  size_t cut = generated.size();
  for (std::string_view s : STOPS) cut = std::min(cut, generated.find(s));
  return normalize_ws(expected) == normalize_ws(std::string_view(generated).substr(0, cut));
}

}  // namespace dtrain::data
