// BpeTokenizer: BPE loaded from a Hugging Face tokenizer.json, of two kinds:
//  - byte-level (GPT-2, Llama-3, Qwen2): the regex pre-tokenizer, GPT-2's byte-to-unicode
//    mapping and rank-ordered merges;
//  - SentencePiece-style (Llama 2, Mistral, TinyLlama): spaces become "\u2581" (Metaspace
//    pre-tokenizer, or the Prepend + Replace normalizer pair), merges over characters,
//    characters missing from the vocabulary as <0xNN> byte tokens (byte_fallback) or the
//    unk token, and the decoder's Replace / ByteFallback / Fuse / Strip (or Metaspace) steps.
// Added tokens are matched first in both, with their flags (data/added_tokens.h).
#pragma once

#include "data/added_tokens.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace dtrain::data {

// Supported tokenizer.json: model.type "BPE" with vocab and merges ("a b" strings or
// ["a", "b"] pairs; model.ignore_merges honoured), added_tokens (matched leftmost-longest
// as tokenizers does: those with normalized=false in the raw text, then those with
// normalized=true in the normalized text; single_word, lstrip and rstrip honoured), and
// either
//  - byte-level: pre_tokenizer ByteLevel (GPT-2 regex, add_prefix_space honoured) or a
//    Sequence of a Split with the Llama-3 / Qwen2 regex and ByteLevel, normalizer null or
//    NFC (Qwen2), decoder null or ByteLevel;
//  - SentencePiece-style: pre_tokenizer null or Metaspace (replacement "\u2581",
//    prepend_scheme always/first/never or the older add_prefix_space, split), normalizer
//    null, NFC, Prepend("\u2581"), Replace(" " -> "\u2581") or a Sequence of those (applied
//    in the Sequence's order),
//    model.byte_fallback, unk_token, fuse_unk, and a decoder made of Replace, ByteFallback,
//    Fuse, Strip and Metaspace steps (alone or in a Sequence).
// NFC is Unicode Normalization Form C (data/unicode_nfc.h). bos/eos/pad come from a
// tokenizer_config.json next to the file when present, else from well-known names
// (<|endoftext|>, <|begin_of_text|>, <|end_of_text|>, <s>, </s>, <pad>, ...).
// Anything else is a ConfigError naming the file and the unsupported part.
class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& path);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_ordinary(std::string_view text) const override;
  std::vector<int32_t> encode_ordinary_at(std::string_view text, TextAt at) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int32_t special_id(std::string_view token) const override;
  std::string name() const override { return "bpe:" + path_; }

  PretokenizerKind pretokenizer() const { return pretokenizer_; }
  bool sentencepiece() const { return sentencepiece_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct Added {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized;
  };
  enum class Prepend { ALWAYS, FIRST, NEVER };
  // One step of a SentencePiece-style decoder, applied to the list of token strings.
  struct DecodeStep {
    enum Kind { REPLACE, BYTE_FALLBACK, FUSE, STRIP, METASPACE } kind;
    std::string from, to;     // REPLACE: every `from` in a token becomes `to`; STRIP/METASPACE: from = the char
    int start = 0, stop = 0;  // STRIP: at most this many `from` removed at each end of each token
    Prepend prepend = Prepend::ALWAYS;  // METASPACE
  };

  // The constructor's steps over tokenizer.json, in order.
  void load_vocab(const nlohmann::json& root);
  int32_t load_id(const nlohmann::json& idj, const std::string& what) const;
  std::unordered_map<int32_t, std::string> load_model_vocab(const nlohmann::json& model, int32_t& max_id);
  std::vector<Added> load_added_tokens(const nlohmann::json& root, int32_t& max_id) const;
  void load_merges(const nlohmann::json& model);
  void load_byte_level(const nlohmann::json& root);
  void load_sentencepiece(const nlohmann::json& root);
  void load_sp_model(const nlohmann::json& model);
  void load_sp_normalizer(const nlohmann::json& root);
  void load_sp_pre_tokenizer(const nlohmann::json& root);
  void load_sp_decoder(const nlohmann::json& root);
  // ConfigError "tokenizer file '<path>': what".
  [[noreturn]] void load_fail(const std::string& what) const;
  void build_added_matchers();
  void load_special_ids();
  // The normalizer's steps in order (byte-level: NFC or nothing); `prepend` false leaves
  // out a Prepend step (text continuing earlier text).
  std::string normalize(std::string_view text, bool prepend = true) const;
  // Text between added tokens: normalized, normalized added tokens matched, the rest
  // pre-tokenized and merged. `at_start`: the text begins the input (Metaspace "first").
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // never_prepend: text continuing earlier text (TextAt::CONTINUATION) gets no "\u2581".
  void encode_sp(std::string_view normalized, bool at_start, std::vector<int32_t>& out,
                 bool never_prepend = false) const;
  void encode_sp_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // Rank-ordered merges over the symbol ids in `id`, appended to out.
  void merge(std::vector<int32_t>& id, std::vector<int32_t>& out) const;
  std::string decode_sp(const std::vector<int32_t>& ids) const;

  std::string path_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" for unused ids
  std::vector<bool> is_added_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id)
  std::array<int32_t, 256> byte_ids_{};
  std::vector<Added> added_;
  AddedTokenMatcher raw_added_;         // normalized=false (all of them for byte-level)
  AddedTokenMatcher normalized_added_;  // normalized=true, their content normalized
  PretokenizerKind pretokenizer_ = PretokenizerKind::GPT2;
  int max_digits_ = 3;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  bool nfc_ = false;  // normalizer NFC (byte-level; SentencePiece-style: a step of norm_steps_)
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;

  // SentencePiece-style
  bool sentencepiece_ = false;
  enum class NormStep { NFC, PREPEND, REPLACE_SPACE };
  std::vector<NormStep> norm_steps_;  // the normalizer's steps, in order
  bool norm_prepend_ = false;         // normalizer Prepend("\u2581")
  bool norm_replace_space_ = false;   // normalizer Replace(" ", "\u2581")
  bool metaspace_ = false;            // pre_tokenizer Metaspace
  Prepend metaspace_prepend_ = Prepend::ALWAYS;
  bool metaspace_split_ = true;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  std::array<int32_t, 256> fallback_ids_{};         // <0xNN>, -1 when missing
  std::unordered_map<uint32_t, int32_t> char_ids_;  // single-character vocabulary entries
  std::vector<DecodeStep> decoder_;
};

}  // namespace dtrain::data
