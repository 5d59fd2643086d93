// BpeTokenizer, SentencePiece-style half: the tokenizer.json parts Llama 2 / Mistral /
// TinyLlama ship (Metaspace or Prepend + Replace, byte_fallback, unk, the decoder sequence),
// following Hugging Face tokenizers: the model looks each character up in the vocabulary
// (missing ones become <0xNN> byte tokens, else the unk token, consecutive ones fused when
// fuse_unk), then merges pairs by rank.
#include "data/bpe.h"

#include "core/check.h"
#include "core/log.h"
#include "data/unicode_nfc.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

namespace dtrain::data {

using nlohmann::json;

namespace {

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out.append(to);
    i = j + from.size();
  }
  if (i == 0) return;
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

// {"String": " "} -> " "; a Regex pattern is not supported.
std::string string_pattern(const json& step) {
  if (step.contains("pattern") && step["pattern"].is_object() && step["pattern"].contains("String") &&
      step["pattern"]["String"].is_string())
    return step["pattern"]["String"].get<std::string>();
  return {};
}

bool valid_utf8(std::string_view s) {
  for (const Utf8Unit& u : utf8_units(s))
    if (u.cp == UTF8_INVALID) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// Loading

void BpeTokenizer::load_sentencepiece(const json& root) {
  load_sp_model(root["model"]);
  load_sp_normalizer(root);
  load_sp_pre_tokenizer(root);
  load_sp_decoder(root);
}

// The model's unk token, byte fallback and single-character lookups.
void BpeTokenizer::load_sp_model(const json& model) {
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      load_fail(
          fmt::format("model.{} = {} is not supported (dtrain's BPE has no subword affixes)", key, model[key].dump()));
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    if (!model["unk_token"].is_string()) load_fail("model.unk_token is not a string");
    const std::string unk = model["unk_token"].get<std::string>();
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) load_fail("model.unk_token '" + unk + "' is not in model.vocab");
    unk_id_ = it->second;
  }
  fallback_ids_.fill(-1);
  int missing = 0;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    if (it != vocab_.end()) fallback_ids_[b] = it->second;
    else ++missing;
  }
  if (byte_fallback_ && missing == 256)
    load_fail("model.byte_fallback is true but model.vocab has no <0xNN> byte tokens");
  for (const auto& [tok, id] : vocab_) {
    std::vector<Utf8Unit> u = utf8_units(tok);
    if (u.size() == 1 && u[0].cp != UTF8_INVALID) char_ids_[u[0].cp] = id;
  }
}

// The normalizer: NFC, Prepend("\u2581"), Replace(" " -> "\u2581"), or a Sequence of them.
void BpeTokenizer::load_sp_normalizer(const json& root) {
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& n = root["normalizer"];
    std::vector<json> steps;
    if (n.value("type", std::string()) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array())
      for (const json& x : n["normalizers"]) steps.push_back(x);
    else steps.push_back(n);
    for (const json& st : steps) {
      const std::string t = st.is_object() ? st.value("type", std::string("?")) : std::string("?");
      if (t == "Prepend" && st.value("prepend", std::string()) == kMeta && !norm_prepend_ && !norm_replace_space_) {
        norm_prepend_ = true;
        norm_steps_.push_back(NormStep::PREPEND);
      } else if (t == "Replace" && string_pattern(st) == " " && st.value("content", std::string()) == kMeta &&
                 !norm_replace_space_) {
        norm_replace_space_ = true;
        norm_steps_.push_back(NormStep::REPLACE_SPACE);
      } else if (t == "NFC") {
        norm_steps_.push_back(NormStep::NFC);
      } else {
        load_fail(
            "unsupported normalizer " + st.dump().substr(0, 200) +
            ": dtrain's SentencePiece-style BPE supports NFC, Prepend(\"\\u2581\") and Replace(\" \", \"\\u2581\")");
      }
    }
  }
}

// The pre-tokenizer: none, or Metaspace.
void BpeTokenizer::load_sp_pre_tokenizer(const json& root) {
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
    const json& p = root["pre_tokenizer"];
    metaspace_ = true;
    if (p.value("replacement", std::string(kMeta)) != kMeta)
      load_fail("Metaspace pre_tokenizer with replacement " + p["replacement"].dump() +
                ": dtrain supports only \"\\u2581\"");
    // As tokenizers reads it: add_prefix_space false means never; a prepend_scheme wins
    // otherwise; neither means always.
    std::string scheme = p.contains("prepend_scheme") && p["prepend_scheme"].is_string()
                             ? p["prepend_scheme"].get<std::string>()
                             : std::string("always");
    if (p.contains("add_prefix_space") && p["add_prefix_space"] == false) scheme = "never";
    if (scheme == "always") metaspace_prepend_ = Prepend::ALWAYS;
    else if (scheme == "first") metaspace_prepend_ = Prepend::FIRST;
    else if (scheme == "never") metaspace_prepend_ = Prepend::NEVER;
    else load_fail("Metaspace prepend_scheme '" + scheme + "' is not one of always, first, never");
    metaspace_split_ = p.value("split", true);
  }
  if (norm_replace_space_ && metaspace_)
    log_debug("tokenizer '{}': both the normalizer and Metaspace replace spaces", path_);
}

// The decoder: a Sequence of Replace, ByteFallback, Fuse, Strip and Metaspace steps.
void BpeTokenizer::load_sp_decoder(const json& root) {
  if (!root.contains("decoder") || root["decoder"].is_null())
    load_fail(
        "missing decoder: a SentencePiece-style tokenizer.json needs one (Replace/ByteFallback/Fuse/Strip or "
        "Metaspace)");
  const json& d = root["decoder"];
  std::vector<json> steps;
  if (d.value("type", std::string()) == "Sequence" && d.contains("decoders") && d["decoders"].is_array())
    for (const json& x : d["decoders"]) steps.push_back(x);
  else steps.push_back(d);
  for (const json& st : steps) {
    const std::string t = st.is_object() ? st.value("type", std::string("?")) : std::string("?");
    DecodeStep step{};
    if (t == "Replace" && !string_pattern(st).empty() && st.contains("content") && st["content"].is_string()) {
      step.kind = DecodeStep::REPLACE;
      step.from = string_pattern(st);
      step.to = st["content"].get<std::string>();
    } else if (t == "ByteFallback") {
      step.kind = DecodeStep::BYTE_FALLBACK;
    } else if (t == "Fuse") {
      step.kind = DecodeStep::FUSE;
    } else if (t == "Strip" && st.contains("content") && st["content"].is_string() &&
               utf8_units(st["content"].get<std::string>()).size() == 1) {
      step.kind = DecodeStep::STRIP;
      step.from = st["content"].get<std::string>();
      step.start = st.value("start", 0);
      step.stop = st.value("stop", 0);
    } else if (t == "Metaspace" && st.value("replacement", std::string(kMeta)) == kMeta) {
      step.kind = DecodeStep::METASPACE;
      step.from = kMeta;
      std::string scheme = st.contains("prepend_scheme") && st["prepend_scheme"].is_string()
                               ? st["prepend_scheme"].get<std::string>()
                               : std::string("always");
      if (st.contains("add_prefix_space") && st["add_prefix_space"] == false) scheme = "never";
      step.prepend = scheme == "never" ? Prepend::NEVER : scheme == "first" ? Prepend::FIRST : Prepend::ALWAYS;
    } else {
      load_fail("unsupported decoder " + st.dump().substr(0, 200) +
                ": dtrain's SentencePiece-style BPE supports Replace (string pattern), ByteFallback, Fuse, "
                "Strip and Metaspace");
    }
    decoder_.push_back(std::move(step));
  }
}

// ---------------------------------------------------------------------------
// Encoding

std::string BpeTokenizer::normalize(std::string_view text, bool prepend) const {
  if (!sentencepiece_) return nfc_ ? nfc(text) : std::string(text);
  std::string s(text);
  if (s.empty()) return s;  // tokenizers prepends nothing to empty text
  for (NormStep st : norm_steps_) {
    if (st == NormStep::NFC && !nfc_quick_check(s)) s = nfc(s);
    else if (st == NormStep::REPLACE_SPACE) replace_all(s, " ", kMeta);
    else if (st == NormStep::PREPEND && prepend) s.insert(0, kMeta);
  }
  return s;
}

std::vector<int32_t> BpeTokenizer::encode_ordinary_at(std::string_view text, TextAt at) const {
  if (!sentencepiece_ || at == TextAt::START) return encode_ordinary(text);
  std::vector<int32_t> out;
  if (at == TextAt::AFTER_SPECIAL) {
    encode_sp(normalize(text), false, out);
    return out;
  }
  encode_sp(normalize(text, false), false, out, true);  // the normalizer without its Prepend
  return out;
}

void BpeTokenizer::encode_sp(std::string_view normalized, bool at_start, std::vector<int32_t>& out,
                             bool never_prepend) const {
  if (normalized.empty()) return;
  if (!metaspace_) {
    encode_sp_piece(normalized, out);
    return;
  }
  std::string s(normalized);
  replace_all(s, " ", kMeta);
  const bool starts_meta = s.compare(0, kMeta.size(), kMeta) == 0;
  if (!starts_meta && !never_prepend &&
      (metaspace_prepend_ == Prepend::ALWAYS || (metaspace_prepend_ == Prepend::FIRST && at_start)))
    s.insert(0, kMeta);
  if (!metaspace_split_) {
    encode_sp_piece(s, out);
    return;
  }
  // Split with each "\u2581" starting a new piece (tokenizers' MergedWithNext).
  size_t begin = 0;
  for (size_t i = s.find(kMeta, 1); i != std::string::npos; i = s.find(kMeta, i + 1)) {
    if (i > begin) encode_sp_piece(std::string_view(s).substr(begin, i - begin), out);
    begin = i;
  }
  encode_sp_piece(std::string_view(s).substr(begin), out);
}

void BpeTokenizer::encode_sp_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> id;
  id.reserve(piece.size());
  bool pending_unk = false;
  for (const Utf8Unit& u : utf8_units(piece)) {
    if (u.cp != UTF8_INVALID) {
      auto it = char_ids_.find(u.cp);
      if (it != char_ids_.end()) {
        if (pending_unk) id.push_back(unk_id_);
        pending_unk = false;
        id.push_back(it->second);
        continue;
      }
    }
    if (byte_fallback_) {
      bool all = true;
      for (uint32_t k = 0; k < u.length; ++k)
        all = all && fallback_ids_[static_cast<uint8_t>(piece[u.offset + k])] >= 0;
      if (all) {
        if (pending_unk) id.push_back(unk_id_);
        pending_unk = false;
        for (uint32_t k = 0; k < u.length; ++k) id.push_back(fallback_ids_[static_cast<uint8_t>(piece[u.offset + k])]);
        continue;
      }
    }
    // Unknown: the unk token (fused with the previous one when fuse_unk); with no unk
    // token the character is dropped, as tokenizers does.
    if (unk_id_ < 0) continue;
    if (pending_unk && !fuse_unk_) id.push_back(unk_id_);
    pending_unk = true;
  }
  if (pending_unk) id.push_back(unk_id_);
  merge(id, out);
}

// ---------------------------------------------------------------------------
// Decoding: the token strings through the decoder's steps, joined.

std::string BpeTokenizer::decode_sp(const std::vector<int32_t>& ids) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t t : ids)
    if (t >= 0 && t < vocab_size()) toks.push_back(id_to_token_[t]);
  for (const DecodeStep& st : decoder_) {
    switch (st.kind) {
      case DecodeStep::REPLACE:
        for (std::string& t : toks) replace_all(t, st.from, st.to);
        break;
      case DecodeStep::BYTE_FALLBACK: {
        // Runs of <0xNN> become their bytes when those are valid UTF-8, else one U+FFFD each.
        std::vector<std::string> next;
        std::string bytes;
        size_t run = 0;
        auto flush = [&] {
          if (run == 0) return;
          if (valid_utf8(bytes)) next.push_back(bytes);
          else
            for (size_t k = 0; k < run; ++k) next.emplace_back("\xEF\xBF\xBD");
          bytes.clear();
          run = 0;
        };
        for (std::string& t : toks) {
          auto hex = [](char c) {
            return c >= '0' && c <= '9'   ? c - '0'
                   : c >= 'A' && c <= 'F' ? c - 'A' + 10
                   : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                          : -1;
          };
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) >= 0 && hex(t[4]) >= 0) {
            bytes.push_back(static_cast<char>(hex(t[3]) * 16 + hex(t[4])));
            ++run;
            continue;
          }
          flush();
          next.push_back(std::move(t));
        }
        flush();
        toks = std::move(next);
        break;
      }
      case DecodeStep::FUSE: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecodeStep::STRIP:
        for (std::string& t : toks) {
          size_t b = 0, e = t.size();
          for (int k = 0; k < st.start && t.compare(b, st.from.size(), st.from) == 0 && b < e; ++k) b += st.from.size();
          for (int k = 0;
               k < st.stop && e >= b + st.from.size() && t.compare(e - st.from.size(), st.from.size(), st.from) == 0;
               ++k)
            e -= st.from.size();
          t = t.substr(b, e - b);
        }
        break;
      case DecodeStep::METASPACE:
        // As tokenizers: the first token loses its "\u2581"s (unless never), the others become spaces.
        for (size_t i = 0; i < toks.size(); ++i)
          replace_all(toks[i], st.from, i == 0 && st.prepend != Prepend::NEVER ? "" : " ");
        break;
    }
  }
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

}  // namespace dtrain::data
