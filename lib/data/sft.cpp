// SFT JSONL parsing (Alpaca and chat forms), the plain and chatml templates with
// response-only loss masks, and the answer checker used by evaluation.
#include "data/sft.h"

#include "core/check.h"
#include "data/input_file.h"

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

const char* role_name(SftRole r) {
  switch (r) {
    case SftRole::SYSTEM: return "system";
    case SftRole::USER: return "user";
    case SftRole::ASSISTANT: return "assistant";
  }
  return "user";
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
  bool chat = format == SftFormat::CHAT || (format == SftFormat::AUTO && j.contains("messages"));
  SftRecord rec;
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
  input_file_check(path, "SFT data");
  std::ifstream in(path, std::ios::binary);
  DT_ENFORCE(in.good(), IoError, "cannot open SFT data '{}': check the path", path);
  std::vector<SftRecord> records;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    records.push_back(sft_parse_line(line, format, path, line_no));
  }
  DT_ENFORCE(!in.bad(), IoError, "error reading SFT data '{}' after line {}", path, line_no);
  return records;
}

// ---------------------------------------------------------------------------
// Rendering

SftTemplate sft_template_parse(std::string_view name) {
  if (name == "plain" || name == "alpaca") return SftTemplate::PLAIN;
  if (name == "chatml") return SftTemplate::CHATML;
  DT_THROW(ConfigError, "unknown SFT template '{}' (use plain or chatml)", name);
}

namespace {

class Renderer {
 public:
  Renderer(const Tokenizer& tok, bool add_bos) : tok_(tok) {
    if (add_bos && tok.bos_id() >= 0) id(tok.bos_id(), false);
  }
  void text(std::string_view s, bool masked) { append(tok_.encode(s), masked); }      // template text
  void content(std::string_view s, bool masked) { append(tok_.encode_ordinary(s), masked); }
  void id(int32_t t, bool masked) { append({t}, masked); }
  SftTokens take() { return std::move(out_); }
  size_t size() const { return out_.tokens.size(); }

 private:
  void append(const std::vector<int32_t>& ids, bool masked) {
    out_.tokens.insert(out_.tokens.end(), ids.begin(), ids.end());
    out_.mask.insert(out_.mask.end(), ids.size(), masked ? 1 : 0);
  }
  const Tokenizer& tok_;
  SftTokens out_;
};

// Renders the record; stop_at_answer ends before the first assistant content.
SftTokens render(const SftRecord& rec, const Tokenizer& tok, SftTemplate tmpl, bool add_bos, bool stop_at_answer) {
  Renderer r(tok, add_bos);
  const int32_t eos = tok.eos_id();
  if (tmpl == SftTemplate::PLAIN) {
    DT_ENFORCE(eos >= 0, ConfigError, "the plain SFT template needs an eos token; tokenizer '{}' has none",
               tok.name());
    bool after_answer = false;
    for (const SftMessage& m : rec.messages) {
      if (after_answer) r.text("\n\n", false);
      after_answer = false;
      switch (m.role) {
        case SftRole::SYSTEM:
          r.content(m.content, false);
          r.text("\n\n", false);
          break;
        case SftRole::USER:
          r.text("### Instruction:\n", false);
          r.content(m.content, false);
          r.text("\n\n", false);
          if (!m.input.empty()) {
            r.text("### Input:\n", false);
            r.content(m.input, false);
            r.text("\n\n", false);
          }
          r.text("### Response:\n", false);
          break;
        case SftRole::ASSISTANT:
          if (stop_at_answer) return r.take();
          r.content(m.content, true);
          r.id(eos, true);
          after_answer = true;
          break;
      }
    }
    return r.take();
  }
  const int32_t im_end = tok.special_id("<|im_end|>");
  for (const SftMessage& m : rec.messages) {
    r.text(std::string("<|im_start|>") + role_name(m.role) + "\n", false);
    if (m.role == SftRole::ASSISTANT) {
      if (stop_at_answer) return r.take();
      r.content(m.content, true);
      r.text("<|im_end|>", true);
      // Without a <|im_end|> special token generation stops at eos: train on it too.
      if (im_end < 0 && eos >= 0) r.id(eos, true);
    } else {
      r.content(m.input.empty() ? m.content : m.content + "\n\n" + m.input, false);
      r.text("<|im_end|>", false);
    }
    r.text("\n", false);
  }
  return r.take();
}

}  // namespace

SftTokens sft_render(const SftRecord& record, const Tokenizer& tokenizer, SftTemplate tmpl, bool add_bos) {
  return render(record, tokenizer, tmpl, add_bos, false);
}

std::vector<int32_t> sft_render_prompt(const SftRecord& record, const Tokenizer& tokenizer, SftTemplate tmpl,
                                       bool add_bos) {
  return render(record, tokenizer, tmpl, add_bos, true).tokens;
}

std::vector<int32_t> sft_stop_ids(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  int32_t im_end = tokenizer.special_id("<|im_end|>");
  if (im_end >= 0 && im_end != tokenizer.eos_id()) ids.push_back(im_end);
  return ids;
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
  static constexpr std::string_view STOPS[] = {"<|eos|>", "<|endoftext|>", "<|im_end|>", "<|end_of_text|>",
                                               "<|eot_id|>", "</s>", "\n###"};
  size_t cut = generated.size();
  for (std::string_view s : STOPS) cut = std::min(cut, generated.find(s));
  return normalize_ws(expected) == normalize_ws(std::string_view(generated).substr(0, cut));
}

}  // namespace dtrain::data
