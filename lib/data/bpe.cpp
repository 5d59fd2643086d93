// BpeTokenizer: loading and validating tokenizer.json, then encoding with a linked
// list of symbols and a min-heap of candidate merges (rank, position): the same result
// as GPT-2's "merge every occurrence of the lowest-ranked pair" loop in O(n log n).
#include "data/bpe.h"

#include "core/check.h"
#include "core/log.h"
#include "core/input_file.h"
#include "data/unicode_nfc.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <queue>
#include <unordered_map>
#include <sstream>

namespace dtrain::data {

using nlohmann::json;

namespace {

// The exact regex strings found in tokenizer.json files (after JSON unescaping).
constexpr std::string_view LLAMA3_REGEX =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view QWEN2_REGEX =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view GPT2_REGEX =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string read_file(const std::string& path, uint64_t max_bytes = kInputTokenizerMaxBytes) {
  return input_file_read(path, "tokenizer file", max_bytes);
}

std::string map_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8_append(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// "<s>" or {"content": "<s>", ...} as used by tokenizer_config.json.
std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return {};
}

}  // namespace

// ---------------------------------------------------------------------------
// Loading

void BpeTokenizer::load_fail(const std::string& what) const {
  DT_THROW(ConfigError, "tokenizer file '{}': {}", path_, what);
}

BpeTokenizer::BpeTokenizer(const std::string& path) : path_(path) {
  const std::string text = read_file(path);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    DT_THROW(ConfigError, "tokenizer file '{}' is not valid JSON (byte {}): {}; is it truncated?", path, e.byte,
             e.what());
  }
  if (!root.is_object()) DT_THROW(ConfigError, "tokenizer file '{}': {}", path, "top level is not a JSON object");
  try {
    load_vocab(root);
    load_merges(root["model"]);
    if (sentencepiece_) load_sentencepiece(root);
    else load_byte_level(root);
    build_added_matchers();
  } catch (const json::exception& e) {
    DT_THROW(ConfigError, "tokenizer file '{}' has an unexpected structure: {}", path, e.what());
  }
  load_special_ids();
}

// Ids index the id -> token table: each is checked against the vocabulary limit before
// that table is sized by the largest one.
int32_t BpeTokenizer::load_id(const json& idj, const std::string& what) const {
  if (!idj.is_number_integer()) load_fail(fmt::format("{} has id {}, not an integer", what, idj.dump()));
  if (idj.is_number_unsigned() ? idj.get<uint64_t>() >= static_cast<uint64_t>(kMaxVocabSize)
                               : (idj.get<int64_t>() < 0 || idj.get<int64_t>() >= kMaxVocabSize))
    load_fail(fmt::format("{} has id {}; token ids must be from 0 to {} (at most {} tokens, as model.vocab_size)", what,
                          idj.dump(), kMaxVocabSize - 1, kMaxVocabSize));
  return static_cast<int32_t>(idj.get<int64_t>());
}

// model.vocab into vocab_; returns the id -> token map (each id names one token) and
// raises max_id to the largest id.
std::unordered_map<int32_t, std::string> BpeTokenizer::load_model_vocab(const json& model, int32_t& max_id) {
  std::unordered_map<int32_t, std::string> token_of;
  for (const auto& [tok, idj] : model["vocab"].items()) {
    int32_t id = load_id(idj, "model.vocab entry '" + tok + "'");
    auto [at, fresh] = token_of.emplace(id, tok);
    if (!fresh)
      load_fail(
          fmt::format("model.vocab gives id {} to both '{}' and '{}': each id must name one token (a damaged or "
                      "hand-edited file?)",
                      id, at->second, tok));
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
  }
  return token_of;
}

// The added_tokens entries, checked; raises max_id to the largest id.
std::vector<BpeTokenizer::Added> BpeTokenizer::load_added_tokens(const json& root, int32_t& max_id) const {
  std::vector<Added> added;
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array()) load_fail("added_tokens is not an array");
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["id"].is_number_integer() ||
          !a["content"].is_string())
        load_fail("added_tokens entry " + a.dump().substr(0, 200) +
                  " needs an integer \"id\" and a string \"content\"");
      for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized", "special"})
        if (a.contains(flag) && !a[flag].is_boolean())
          load_fail("added_tokens entry " + a.dump().substr(0, 200) + ": \"" + flag + "\" is not true/false");
      // A missing "normalized" defaults as in tokenizers: special tokens are not normalized.
      Added t{a["content"].get<std::string>(),
              load_id(a["id"], "added_tokens entry '" + a["content"].get<std::string>().substr(0, 80) + "'"),
              a.value("single_word", false),
              a.value("lstrip", false),
              a.value("rstrip", false),
              a.value("normalized", !a.value("special", false))};
      if (t.content.empty()) load_fail("added_tokens entry with id " + std::to_string(t.id) + " has empty content");
      for (const Added& o : added)
        if (o.id == t.id && o.content != t.content)
          load_fail(fmt::format("added_tokens entries '{}' and '{}' have the same id {}: each id must name one token",
                                o.content, t.content, t.id));
      max_id = std::max(max_id, t.id);
      added.push_back(std::move(t));
    }
  }
  return added;
}

// The model's vocabulary and the added tokens (the id -> token table), and the kind: a
// null (or absent) or Metaspace pre-tokenizer is SentencePiece-style.
void BpeTokenizer::load_vocab(const json& root) {
  if (!root.contains("model") || !root["model"].is_object()) load_fail("missing \"model\" object");
  const json& model = root["model"];
  std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") load_fail("unsupported model type '" + type + "': dtrain supports byte-level BPE tokenizers only");
  if (!model.contains("vocab") || !model["vocab"].is_object()) load_fail("model.vocab is missing or not an object");
  if (!model.contains("merges") || !model["merges"].is_array()) load_fail("model.merges is missing or not an array");
  ignore_merges_ = model.value("ignore_merges", false);
  // BPE dropout merges at random while encoding: the same text would give other ids each
  // time, in training and at inference alike. Either kind of BPE.
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    load_fail("model.dropout = " + model["dropout"].dump() +
              " is not supported: BPE dropout randomizes encoding; set it to null (as the model was published)");

  int32_t max_id = -1;
  const std::unordered_map<int32_t, std::string> token_of = load_model_vocab(model, max_id);
  std::vector<Added> added = load_added_tokens(root, max_id);
  if (max_id < 0) load_fail("the vocabulary is empty");
  id_to_token_.assign(static_cast<size_t>(max_id) + 1, std::string());
  is_added_.assign(id_to_token_.size(), false);
  for (const auto& [tok, id] : vocab_) id_to_token_[id] = tok;
  for (const Added& a : added) {
    id_to_token_[a.id] = a.content;
    is_added_[a.id] = true;
  }
  added_ = std::move(added);

  // The kind: a null (or absent) or Metaspace pre-tokenizer is SentencePiece-style.
  const bool has_pre = root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null();
  sentencepiece_ = !has_pre || (root["pre_tokenizer"].is_object() &&
                                root["pre_tokenizer"].value("type", std::string()) == "Metaspace");

  // An added token may repeat a vocabulary entry (GPT-2's <|endoftext|>, Llama 2's <s>),
  // never take the id of another one: encoding would give that id for two different texts
  // and decoding would give one of them.
  for (const Added& a : added_) {
    auto it = token_of.find(a.id);
    if (it != token_of.end() && it->second != a.content && (sentencepiece_ || it->second != map_bytes(a.content)))
      load_fail(
          fmt::format("added_tokens entry '{}' has id {}, which model.vocab gives to '{}': give the added token an "
                      "id of its own (or the same text as the vocabulary entry)",
                      a.content, a.id, it->second));
  }

  if (!sentencepiece_) {
    const json& p = root["pre_tokenizer"];
    const std::string t = p.is_object() ? p.value("type", std::string("?")) : std::string("?");
    if (t != "ByteLevel" && t != "Sequence")
      load_fail("unsupported pre_tokenizer type '" + t +
                "': dtrain supports ByteLevel, Split + ByteLevel as in Llama-3 (byte-level BPE), or Metaspace or "
                "none (SentencePiece-style BPE)");
  }
}

// The byte tokens of a byte-level vocabulary, and the merges.
void BpeTokenizer::load_merges(const json& model) {
  for (int b = 0; b < 256 && !sentencepiece_; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
    auto it = vocab_.find(s);
    if (it == vocab_.end())
      load_fail(
          fmt::format("model.vocab lacks the byte-level token for byte 0x{:02X} ('{}'): not a byte-level "
                      "BPE vocabulary",
                      b, s));
    byte_ids_[b] = it->second;
  }
  const json& merges = model["merges"];
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size())
        load_fail(fmt::format("model.merges[{}] = '{}' is not of the form \"left right\"", r, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      load_fail(fmt::format("model.merges[{}] = {} is neither \"left right\" nor [left, right]", r, m.dump()));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end())
      load_fail(fmt::format("model.merges[{}] = '{} {}' uses a token missing from model.vocab", r, a, b));
    // A pair listed twice keeps its first (lowest) rank, as in Hugging Face.
    merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(r), im->second});
  }
}

// A byte-level tokenizer's normalizer (none, or NFC as given), pre-tokenizer and decoder.
void BpeTokenizer::load_byte_level(const json& root) {
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    std::string nt = root["normalizer"].value("type", std::string("?"));
    if (nt == "NFC") nfc_ = true;
    else
      load_fail("unsupported normalizer '" + nt +
                "' with a byte-level pre-tokenizer: dtrain supports byte-level "
                "BPE without a normalizer or with NFC");
  }
  const json& pre = root["pre_tokenizer"];
  std::string pt = pre.is_object() ? pre.value("type", std::string("?")) : std::string("?");
  if (!pre.is_object()) {
    load_fail("pre_tokenizer is not an object");
  } else if (pt == "ByteLevel") {
    add_prefix_space_ = pre.value("add_prefix_space", false);
    pretokenizer_ = pre.value("use_regex", true) ? PretokenizerKind::GPT2 : PretokenizerKind::NONE;
  } else if (pt == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    const json& seq = pre["pretokenizers"];
    bool ok = false;
    if (seq.size() == 2 && seq[0].value("type", "") == "Split" && seq[1].value("type", "") == "ByteLevel") {
      std::string regex;
      if (seq[0].contains("pattern") && seq[0]["pattern"].is_object())
        regex = seq[0]["pattern"].value("Regex", std::string());
      bool isolated = seq[0].value("behavior", std::string("Isolated")) == "Isolated" && !seq[0].value("invert", false);
      bool byte_regex = seq[1].value("use_regex", true);
      add_prefix_space_ = seq[1].value("add_prefix_space", false);
      if (isolated && !byte_regex && regex == LLAMA3_REGEX) {
        pretokenizer_ = PretokenizerKind::LLAMA3;
        max_digits_ = 3;
        ok = true;
      } else if (isolated && !byte_regex && regex == QWEN2_REGEX) {
        pretokenizer_ = PretokenizerKind::LLAMA3;
        max_digits_ = 1;
        ok = true;
      } else if (isolated && !byte_regex && regex == GPT2_REGEX) {
        pretokenizer_ = PretokenizerKind::GPT2;
        ok = true;
      }
    }
    if (!ok)
      load_fail("unsupported pre_tokenizer Sequence " + pre.dump().substr(0, 300) +
                ": dtrain supports ByteLevel (GPT-2) or Split(Llama-3/Qwen2 regex) + ByteLevel(use_regex=false)");
  } else {
    load_fail("unsupported pre_tokenizer type '" + pt +
              "': dtrain supports ByteLevel, Split + ByteLevel as in Llama-3 (byte-level BPE), or Metaspace or "
              "none (SentencePiece-style BPE)");
  }

  if (root.contains("decoder") && !root["decoder"].is_null() &&
      (!root["decoder"].is_object() || root["decoder"].value("type", std::string("?")) != "ByteLevel"))
    load_fail("unsupported decoder " + root["decoder"].dump().substr(0, 200) +
              " with a byte-level pre-tokenizer: dtrain decodes byte-level BPE as the ByteLevel decoder does");
}

// The added-token matchers: normalized tokens are searched for in normalized text, so
// their patterns are their normalized content (NFC of it for byte-level with NFC, as
// tokenizers normalizes a normalized=true token's content).
void BpeTokenizer::build_added_matchers() {
  std::vector<AddedTokenSpec> raw, normalized;
  for (const Added& a : added_) {
    AddedTokenSpec spec{a.content, a.id, a.single_word, a.lstrip, a.rstrip};
    if (a.normalized) {
      spec.pattern = normalize(a.content);
      normalized.push_back(std::move(spec));
    } else {
      raw.push_back(std::move(spec));
    }
  }
  raw_added_ = AddedTokenMatcher(std::move(raw));
  normalized_added_ = AddedTokenMatcher(std::move(normalized));
}

// bos / eos / pad: tokenizer_config.json's, else the usual names. A token that file names
// must be one of the tokenizer's (an added token, else a vocabulary entry): an eos that is
// not a token would leave every answer without its end (generation never stops on it).
void BpeTokenizer::load_special_ids() {
  std::filesystem::path cfg = std::filesystem::path(path_).parent_path() / "tokenizer_config.json";
  if (input_present(cfg.string(), "tokenizer file")) {
    try {
      json c = json::parse(read_file(cfg.string(), kInputMetaMaxBytes));
      auto pick = [&](const char* key) -> int32_t {
        if (!c.is_object() || !c.contains(key) || c[key].is_null()) return -1;
        const std::string text = token_text(c[key]);
        DT_ENFORCE(!text.empty(), ConfigError,
                   "'{}': {} is {}, neither a token (a string) nor {{\"content\": token}}: name one of the tokens "
                   "of '{}', or null for none",
                   cfg.string(), key, c[key].dump().substr(0, 200), path_);
        int32_t id = special_id(text);
        if (id < 0)
          if (auto it = vocab_.find(text); it != vocab_.end()) id = it->second;
        DT_ENFORCE(id >= 0, ConfigError,
                   "'{}': {} '{}' is not a token of '{}' (neither an added token nor in model.vocab): name one of "
                   "its tokens, or null for none",
                   cfg.string(), key, text.substr(0, 200), path_);
        return id;
      };
      bos_id_ = pick("bos_token");
      eos_id_ = pick("eos_token");
      pad_id_ = pick("pad_token");
    } catch (const json::exception& e) {
      DT_THROW(ConfigError, "'{}' is not valid JSON: {}", cfg.string(), e.what());
    }
  }
  auto first_of = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (int32_t id = special_id(n); id >= 0) return id;
    return -1;
  };
  if (eos_id_ < 0) eos_id_ = first_of({"<|endoftext|>", "<|end_of_text|>", "</s>", "<|eos|>", "<eos>"});
  if (bos_id_ < 0) bos_id_ = first_of({"<|begin_of_text|>", "<s>", "<|bos|>", "<bos>", "<|endoftext|>"});
  if (pad_id_ < 0) pad_id_ = first_of({"<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>"});
}

int32_t BpeTokenizer::special_id(std::string_view token) const {
  if (token.empty()) return -1;
  for (const Added& a : added_)
    if (a.content == token) return a.id;
  return -1;
}

// ---------------------------------------------------------------------------
// Encoding

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  std::vector<AddedSplit> splits;
  raw_added_.split(text, splits);
  for (const AddedSplit& sp : splits) {
    if (sp.id >= 0) out.push_back(sp.id);
    else encode_text(text.substr(sp.offset, sp.length), sp.offset == 0, out);
  }
  return out;
}

void BpeTokenizer::encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  std::string norm;
  std::string_view n = text;
  if (sentencepiece_) n = norm = normalize(text);
  else if (nfc_) n = nfc_view(text, norm);  // no copy for text NFC leaves as it is
  std::vector<AddedSplit> splits;
  normalized_added_.split(n, splits);
  for (const AddedSplit& sp : splits) {
    if (sp.id >= 0) out.push_back(sp.id);
    else if (sentencepiece_) encode_sp(n.substr(sp.offset, sp.length), at_start && sp.offset == 0, out);
    else encode_segment(n.substr(sp.offset, sp.length), out);
  }
}

std::vector<int32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  std::string norm;
  if (sentencepiece_) encode_sp(normalize(text), true, out);
  else encode_segment(nfc_ ? nfc_view(text, norm) : text, out);
  return out;
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space_ && text[0] != ' ') {
    prefixed = " ";
    prefixed.append(text);
    text = prefixed;
  }
  for (const Piece& p : pretokenize(text, pretokenizer_, max_digits_))
    encode_piece(text.substr(p.offset, p.length), out);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(map_bytes(piece));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  std::vector<int32_t> id(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) id[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  merge(id, out);
}

void BpeTokenizer::merge(std::vector<int32_t>& id, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(id.size());
  if (n == 0) return;
  if (n == 1) {
    out.push_back(id[0]);
    return;
  }
  std::vector<int32_t> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(id[pos], id[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, id[pos], id[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    // Stale when either symbol was merged since the candidate was pushed.
    if (id[c.pos] != c.left || next[c.pos] < 0 || id[next[c.pos]] != c.right) continue;
    int r = next[c.pos];
    id[c.pos] = merges_.at(pair_key(c.left, c.right)).merged;
    id[r] = -1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

// ---------------------------------------------------------------------------
// Decoding

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  if (sentencepiece_) return decode_sp(ids);
  std::string out;
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab_size()) continue;
    const std::string& s = id_to_token_[t];
    if (is_added_[t]) {
      out += s;
      continue;
    }
    for (const Utf8Unit& u : utf8_units(s)) {
      int b = unicode_to_byte(u.cp);
      if (b >= 0) out.push_back(static_cast<char>(b));
      else out.append(s, u.offset, u.length);
    }
  }
  return out;
}

}  // namespace dtrain::data
