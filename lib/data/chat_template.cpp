// The chat templates of data/chat_template.h: family detection from tokenizer_config.json
// and the renderer that builds the string, its tokens and the loss mask together.
#include "data/chat_template.h"

#include "core/check.h"
#include "core/input_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dtrain::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr std::string_view kQwen2System = "You are a helpful assistant.";

struct NamedKind {
  const char* name;
  SftTemplate::Kind kind;
};
constexpr NamedKind kNames[] = {{"plain", SftTemplate::PLAIN},   {"alpaca", SftTemplate::PLAIN},
                                {"chatml", SftTemplate::CHATML}, {"qwen", SftTemplate::QWEN},
                                {"qwen3", SftTemplate::QWEN3},   {"llama3", SftTemplate::LLAMA3},
                                {"llama2", SftTemplate::LLAMA2}, {"mistral", SftTemplate::MISTRAL}};

const char* kind_name(SftTemplate::Kind k) {
  for (const NamedKind& n : kNames)
    if (n.kind == k) return n.name;
  return "?";
}

std::string names_joined() {
  std::string s;
  for (const NamedKind& n : kNames) s += std::string(s.empty() ? "" : ", ") + n.name;
  return s + " or auto";
}

std::string read_text(const fs::path& p, const char* what) {
  return input_file_read(p.string(), what, kInputMetaMaxBytes);
}

}  // namespace

SftTemplate::SftTemplate(Kind k) : kind(k) {
  if (k == QWEN) default_system = kQwen25System;
}

const std::vector<std::string>& sft_template_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const NamedKind& n : kNames) v.emplace_back(n.name);
    return v;
  }();
  return names;
}

// ---------------------------------------------------------------------------
// Parsing and detection

namespace {

// The tokens a template writes as tokens of their own: a tokenizer without one would spell
// it out as text (<|eot_id|> as 10 bytes), and the model would learn to write that text
// where its family ends a turn with one token. [INST] and [/INST] are text in Llama 2's and
// Mistral v0.1's vocabularies (tokens only from Mistral v0.3 on), so those two templates
// need none.
std::vector<std::string_view> template_tokens(SftTemplate::Kind k) {
  switch (k) {
    case SftTemplate::CHATML:
    case SftTemplate::QWEN: return {"<|im_start|>", "<|im_end|>"};
    case SftTemplate::QWEN3: return {"<|im_start|>", "<|im_end|>", "<think>", "</think>"};
    case SftTemplate::LLAMA3: return {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    default: return {};
  }
}

SftTemplate template_check(SftTemplate t, std::string_view name, const Tokenizer* tokenizer) {
  if (tokenizer == nullptr) return t;
  std::string missing;
  for (std::string_view tok : template_tokens(t.kind))
    if (tokenizer->special_id(tok) < 0) missing += std::string(missing.empty() ? "" : ", ") + std::string(tok);
  const std::string as = name == "auto" ? fmt::format("auto (the {} template)", kind_name(t.kind)) : std::string(name);
  DT_ENFORCE(missing.empty(), ConfigError,
             "data.template {} writes {} as single tokens, but tokenizer '{}' has no {}: they would be spelled out "
             "as text and trained on; use the model's own tokenizer.json (data.tokenizer), or a template the "
             "tokenizer has the tokens of (plain works with any; chatml with the byte tokenizer)",
             as, fmt::join(template_tokens(t.kind), ", "), tokenizer->name(), missing);
  return t;
}

}  // namespace

SftTemplate sft_template_parse(std::string_view name, const Tokenizer* tokenizer) {
  for (const NamedKind& n : kNames)
    if (name == n.name) return template_check(SftTemplate(n.kind), name, tokenizer);
  if (name == "auto") {
    const std::string tname = tokenizer ? tokenizer->name() : std::string();
    DT_ENFORCE(tname.rfind("bpe:", 0) == 0, ConfigError,
               "data.template auto reads the chat_template of the model directory that holds the tokenizer, but the "
               "tokenizer is '{}': set data.tokenizer to the model directory (or its tokenizer.json), or name the "
               "template ({})",
               tokenizer ? tname : std::string("none"), names_joined());
    fs::path p = tname.substr(4);
    std::error_code ec;
    if (!fs::is_directory(p, ec)) p = p.parent_path();
    return template_check(sft_template_detect(p.string()), name, tokenizer);
  }
  DT_THROW(ConfigError, "unknown SFT template '{}' (use {})", name, names_joined());
}

SftTemplate sft_template_detect(const std::string& model_dir) {
  const fs::path dir = model_dir.empty() ? fs::path(".") : fs::path(model_dir);
  const fs::path config = dir / "tokenizer_config.json";
  const fs::path jinja = dir / "chat_template.jinja";
  std::string tmpl;
  std::string source;
  const bool has_config = input_present(config.string(), "tokenizer_config.json");
  if (has_config) {
    json j;
    try {
      j = json::parse(read_text(config, "tokenizer_config.json"));
    } catch (const json::parse_error& e) {
      DT_THROW(ConfigError, "{}: invalid JSON ({}); cannot read its chat_template for data.template auto",
               config.string(), e.what());
    }
    if (j.is_object() && j.contains("chat_template")) {
      const json& c = j["chat_template"];
      if (c.is_string()) tmpl = c.get<std::string>();
      if (c.is_array())
        for (const json& t : c)
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
            tmpl = t["template"].get<std::string>();
      source = config.string();
    }
  }
  if (tmpl.empty() && input_present(jinja.string(), "chat template")) {
    tmpl = read_text(jinja, "chat template");
    source = jinja.string();
  }
  DT_ENFORCE(!tmpl.empty(), ConfigError,
             "data.template auto: {} has no chat_template (and there is no {}): a base model has none; name the "
             "template the model was or will be used with in data.template ({})",
             has_config ? config.string() : config.string() + " does not exist, so it", jinja.string(), names_joined());
  auto has = [&](std::string_view s) { return tmpl.find(s) != std::string::npos; };
  if (has("<|start_header_id|>")) return SftTemplate::LLAMA3;
  if (has("<|im_start|>")) {
    if (has("<think>") || has("enable_thinking")) return SftTemplate::QWEN3;
    if (has(kQwen25System)) return SftTemplate::QWEN;
    if (has(std::string("system\\n") + std::string(kQwen2System)) ||
        has(std::string("system\n") + std::string(kQwen2System))) {
      SftTemplate t(SftTemplate::QWEN);
      t.default_system = kQwen2System;
      return t;
    }
    return SftTemplate::CHATML;
  }
  if (has("<<SYS>>")) return SftTemplate::LLAMA2;
  if (has("[INST]")) return SftTemplate::MISTRAL;
  DT_THROW(ConfigError,
           "data.template auto: the chat_template in {} is none that dtrain knows (no <|start_header_id|>, "
           "<|im_start|>, <<SYS>> or [INST]): name the template in data.template ({})",
           source, names_joined());
}

// ---------------------------------------------------------------------------
// Rendering

namespace {

// Python's str.strip() white space (what transformers' Jinja `trim` and `.strip()` remove).
size_t white_at(std::string_view s, size_t i) {  // bytes of the white space char at i, or 0
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  auto is = [&](std::string_view w) { return s.substr(i, w.size()) == w ? w.size() : size_t{0}; };
  for (std::string_view w : {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF",
                             "\xE2\x81\x9F", "\xE3\x80\x80"})
    if (size_t n = is(w)) return n;
  if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      static_cast<unsigned char>(s[i + 2]) >= 0x80 && static_cast<unsigned char>(s[i + 2]) <= 0x8A)
    return 3;  // U+2000..U+200A
  return 0;
}

std::string_view trim(std::string_view s) {
  size_t b = 0;
  while (b < s.size())
    if (size_t n = white_at(s, b)) b += n;
    else break;
  size_t e = s.size();
  while (e > b) {  // step back over one UTF-8 character at a time
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (white_at(s, start) != e - start) break;
    e = start;
  }
  return s.substr(b, e - b);
}

std::string_view strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  if (left) {
    const size_t b = s.find_first_not_of(chars);
    s = b == std::string_view::npos ? std::string_view() : s.substr(b);
  }
  if (right) {
    const size_t e = s.find_last_not_of(chars);
    s = e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
  }
  return s;
}

const char* role_name(SftRole r) {
  switch (r) {
    case SftRole::SYSTEM: return "system";
    case SftRole::USER: return "user";
    case SftRole::ASSISTANT: return "assistant";
  }
  return "user";
}

std::string where_of(const SftRecord& rec) { return rec.source.empty() ? std::string("SFT record") : rec.source; }

// Builds the string, its tokens and the mask together. Ordinary text (template text and
// contents) collects in a chunk that is tokenized at once when a special token or a mask
// change ends it, so a piece of text is split no more than the template's tokens and the
// mask's boundaries require.
class Renderer {
 public:
  explicit Renderer(const Tokenizer& tok) : tok_(tok) {}

  // Template text that is a token of its own where the tokenizer has it ("<|im_start|>").
  void special(std::string_view s) {
    const int32_t id = tok_.special_id(s);
    if (id < 0) {
      text(s);
      return;
    }
    flush();
    push(id, s);
  }
  void id(int32_t t) {
    flush();
    push(t, tok_.decode({t}));
  }
  void text(std::string_view s) {  // template text and contents alike: never special tokens
    chunk_ += s;
  }
  void mask(bool on) {
    if (on == masked_) return;
    flush();
    masked_ = on;
  }
  SftTokens take() {
    flush();
    return std::move(out_);
  }

 private:
  void push(int32_t t, std::string_view s) {
    out_.tokens.push_back(t);
    out_.mask.push_back(masked_ ? 1 : 0);
    out_.text += s;
    at_ = TextAt::AFTER_SPECIAL;
  }
  void flush() {
    if (chunk_.empty()) return;
    const std::vector<int32_t> ids = tok_.encode_ordinary_at(chunk_, at_);
    out_.tokens.insert(out_.tokens.end(), ids.begin(), ids.end());
    out_.mask.insert(out_.mask.end(), ids.size(), masked_ ? 1 : 0);
    out_.text += chunk_;
    chunk_.clear();
    at_ = TextAt::CONTINUATION;
  }

  const Tokenizer& tok_;
  SftTokens out_;
  std::string chunk_;
  bool masked_ = false;
  TextAt at_ = TextAt::START;
};

// Roles after an optional first system message must go user, assistant, user, ...
// (LLAMA2 and MISTRAL raise otherwise).
void check_alternating(const SftRecord& rec, const char* family) {
  const size_t first = !rec.messages.empty() && rec.messages[0].role == SftRole::SYSTEM ? 1 : 0;
  for (size_t i = first; i < rec.messages.size(); ++i) {
    const SftRole want = (i - first) % 2 == 0 ? SftRole::USER : SftRole::ASSISTANT;
    DT_ENFORCE(rec.messages[i].role == want, ConfigError,
               "{}: the {} template needs user/assistant turns alternating after an optional first system message, "
               "but message {} is '{}' (expected '{}'): fix the record or use a template without this rule (chatml)",
               where_of(rec), family, i, role_name(rec.messages[i].role), role_name(want));
  }
}

std::string user_text(const SftMessage& m) { return m.input.empty() ? m.content : m.content + "\n\n" + m.input; }

// The templates, each writing messages [0, end) into r; generation appends the template's
// generation prompt.

// Alpaca-style: the generation prompt ("### Response:\n") ends each user turn.
void render_plain(Renderer& r, const std::vector<SftMessage>& msgs, size_t end, int32_t eos) {
  bool after_answer = false;
  for (size_t i = 0; i < end; ++i) {
    const SftMessage& m = msgs[i];
    if (after_answer) r.text("\n\n");
    after_answer = false;
    if (m.role == SftRole::SYSTEM) {
      r.text(m.content);
      r.text("\n\n");
    } else if (m.role == SftRole::USER) {
      r.text("### Instruction:\n");
      r.text(m.content);
      r.text("\n\n");
      if (!m.input.empty()) {
        r.text("### Input:\n");
        r.text(m.input);
        r.text("\n\n");
      }
      r.text("### Response:\n");
    } else {
      r.mask(true);
      r.text(m.content);
      r.id(eos);
      r.mask(false);
      after_answer = true;
    }
  }
}

// ChatML, Qwen (a default system message) and Qwen3 (reasoning in <think> blocks).
void render_chatml(Renderer& r, const Tokenizer& tok, const SftTemplate& tmpl, const std::vector<SftMessage>& msgs,
                   size_t end, bool generation, int32_t eos) {
  const bool qwen3 = tmpl.kind == SftTemplate::QWEN3;
  const int32_t im_end = tok.special_id("<|im_end|>");
  if (tmpl.kind == SftTemplate::QWEN && !tmpl.default_system.empty() &&
      (msgs.empty() || msgs[0].role != SftRole::SYSTEM)) {
    r.special("<|im_start|>");
    r.text("system\n");
    r.text(tmpl.default_system);
    r.special("<|im_end|>");
    r.text("\n");
  }
  size_t last_user = 0;
  for (size_t i = 0; i < end; ++i)
    if (msgs[i].role == SftRole::USER) last_user = i;
  for (size_t i = 0; i < end; ++i) {
    const SftMessage& m = msgs[i];
    r.special("<|im_start|>");
    r.text(role_name(m.role));
    r.text("\n");
    if (m.role != SftRole::ASSISTANT) {
      r.text(user_text(m));
      r.special("<|im_end|>");
      r.text("\n");
      continue;
    }
    std::string_view content = m.content;
    std::string_view reasoning;
    if (qwen3) {
      // Qwen3's template: reasoning in <think>..</think> is split off the content.
      const size_t close = content.rfind("</think>");
      if (close != std::string_view::npos) {
        std::string_view before = content.substr(0, content.find("</think>"));
        const size_t open = before.rfind("<think>");
        if (open != std::string_view::npos) before = before.substr(open + 7);
        reasoning = strip_chars(strip_chars(before, "\n", false, true), "\n", true, false);
        content = strip_chars(content.substr(close + 8), "\n", true, false);
      }
    }
    if (qwen3 && i > last_user && (i + 1 == end || !reasoning.empty())) {
      // The answer to the last question: an empty think block is the prompt's (the
      // generation prompt with thinking off writes it); reasoning is the model's.
      r.mask(!reasoning.empty());
      r.special("<think>");
      r.text("\n");
      r.text(strip_chars(reasoning, "\n", true, true));
      r.text("\n");
      r.special("</think>");
      r.text("\n\n");
      content = strip_chars(content, "\n", true, false);
    }
    r.mask(true);
    r.text(content);
    r.special("<|im_end|>");
    // Without a <|im_end|> special token generation stops at eos: train on it too.
    if (im_end < 0 && eos >= 0) r.id(eos);
    r.mask(false);
    r.text("\n");
  }
  if (generation) {
    r.special("<|im_start|>");
    r.text("assistant\n");
    if (qwen3) {
      r.special("<think>");
      r.text("\n\n");
      r.special("</think>");
      r.text("\n\n");
    }
  }
}

void render_llama3(Renderer& r, const Tokenizer& tok, const std::vector<SftMessage>& msgs, size_t end,
                   bool generation) {
  r.id(tok.bos_id());
  for (size_t i = 0; i < end; ++i) {
    const SftMessage& m = msgs[i];
    r.special("<|start_header_id|>");
    r.text(role_name(m.role));
    r.special("<|end_header_id|>");
    r.text("\n\n");
    const bool answer = m.role == SftRole::ASSISTANT;
    r.mask(answer);
    r.text(trim(answer ? m.content : user_text(m)));
    r.special("<|eot_id|>");
    r.mask(false);
  }
  if (generation) {
    r.special("<|start_header_id|>");
    r.text("assistant");
    r.special("<|end_header_id|>");
    r.text("\n\n");
  }
}

// Llama-2 and Mistral [INST] turns: the prompt ends with "[/INST]", there is no generation
// prompt.
void render_inst(Renderer& r, const SftRecord& rec, const Tokenizer& tok, const SftTemplate& tmpl, size_t end,
                 int32_t eos) {
  const auto& msgs = rec.messages;
  const bool llama2 = tmpl.kind == SftTemplate::LLAMA2;
  check_alternating(rec, llama2 ? "llama2" : "mistral");
  const bool has_system = !msgs.empty() && msgs[0].role == SftRole::SYSTEM;
  size_t last_user = 0;
  for (size_t i = 0; i < end; ++i)
    if (msgs[i].role == SftRole::USER) last_user = i;
  if (!llama2) r.id(tok.bos_id());
  for (size_t i = has_system ? 1 : 0; i < end; ++i) {
    const SftMessage& m = msgs[i];
    if (m.role == SftRole::USER) {
      if (llama2) {
        std::string c = user_text(m);
        if (has_system && i == 1) c = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + c;
        r.id(tok.bos_id());
        r.special("[INST]");
        r.text(" ");
        r.text(trim(c));
        r.text(" ");
        r.special("[/INST]");
      } else {
        r.special("[INST]");
        r.text(" ");
        if (has_system && i == last_user) {
          r.text(msgs[0].content);
          r.text("\n\n");
        }
        r.text(user_text(m));
        r.special("[/INST]");
      }
      continue;
    }
    r.mask(true);
    r.text(" ");
    r.text(trim(m.content));
    if (llama2) r.text(" ");
    r.id(eos);
    r.mask(false);
  }
}

// Renders messages [0, end); generation appends the template's generation prompt.
SftTokens render(const SftRecord& rec, const Tokenizer& tok, const SftTemplate& tmpl, bool add_bos, size_t end,
                 bool generation) {
  Renderer r(tok);
  const auto& msgs = rec.messages;
  const int32_t eos = tok.eos_id();
  const bool own_bos =
      tmpl.kind == SftTemplate::LLAMA3 || tmpl.kind == SftTemplate::LLAMA2 || tmpl.kind == SftTemplate::MISTRAL;
  if (add_bos && !own_bos && tok.bos_id() >= 0) r.id(tok.bos_id());
  if (own_bos || tmpl.kind == SftTemplate::PLAIN)
    DT_ENFORCE(eos >= 0 && (!own_bos || tok.bos_id() >= 0), ConfigError,
               "the {} SFT template needs the tokenizer's {} token; tokenizer '{}' has none", kind_name(tmpl.kind),
               own_bos ? "bos and eos" : "eos", tok.name());
  switch (tmpl.kind) {
    case SftTemplate::PLAIN: render_plain(r, msgs, end, eos); break;
    case SftTemplate::CHATML:
    case SftTemplate::QWEN:
    case SftTemplate::QWEN3: render_chatml(r, tok, tmpl, msgs, end, generation, eos); break;
    case SftTemplate::LLAMA3: render_llama3(r, tok, msgs, end, generation); break;
    case SftTemplate::LLAMA2:
    case SftTemplate::MISTRAL: render_inst(r, rec, tok, tmpl, end, eos); break;
  }
  return r.take();
}

size_t first_answer(const SftRecord& rec) {
  for (size_t i = 0; i < rec.messages.size(); ++i)
    if (rec.messages[i].role == SftRole::ASSISTANT) return i;
  return rec.messages.size();
}

}  // namespace

SftTokens sft_render(const SftRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl, bool add_bos,
                     bool train_on_prompt) {
  SftTokens t = render(record, tokenizer, tmpl, add_bos, record.messages.size(), false);
  if (train_on_prompt) std::fill(t.mask.begin(), t.mask.end(), uint8_t{1});
  return t;
}

SftTokens sft_render_generation(const SftRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl,
                                bool add_bos) {
  return render(record, tokenizer, tmpl, add_bos, record.messages.size(), true);
}

std::vector<int32_t> sft_render_prompt(const SftRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl,
                                       bool add_bos) {
  return render(record, tokenizer, tmpl, add_bos, first_answer(record), true).tokens;
}

std::vector<int32_t> sft_stop_ids(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  for (const char* s : {"<|im_end|>", "<|eot_id|>"}) {
    const int32_t id = tokenizer.special_id(s);
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace dtrain::data
